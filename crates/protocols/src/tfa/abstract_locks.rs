//! Abstract locks of open nesting (TFAON): held on the home of their name for a transaction
//! family until it ends, and freed when the family's node says it is gone.

use std::collections::BTreeMap;

use atomos_core::{AbortCause, Key};
use atomos_seam::Output;

use super::config::PlantedBug;
use super::directory::{Directory, NodeId};
use super::msg::Body;
use super::node::*;
use super::roles::*;

impl TfaNode {
    /// Takes the abstract lock `name` for `family` (a number of this node's choosing that
    /// names a top-level transaction and its open-nested children), asked by transaction `h`;
    /// the answer is a [`Reply::Abstract`]. The lock lives on the home of its name and is held
    /// until [`TfaNode::release_abstract`]; a home whose lock outlives the lease asks whether
    /// the family still runs and frees it if not.
    pub fn abstract_lock(
        &mut self,
        now: u64,
        h: u64,
        family: u64,
        name: String,
        out: &mut Vec<Action>,
    ) {
        let family = self.family_id(family);
        if !self.coord.active.contains_key(&h) {
            return;
        }
        self.coord.family_asks(family);
        let key = Key::from(name.as_str());
        let home = self.dir.home(&key);
        if home == self.me {
            let req = self.coord.next_req;
            let granted = self.grant_abstract(now, (self.me, family), name.clone(), req);
            let newly = self.coord.family_answered(family, &name, granted.is_some());
            return self.abstract_answer(h, granted.map(|_| newly), out);
        }
        let asked = name.clone();
        if let Some(tx) = self.coord.active.get_mut(&h) {
            tx.wait = Wait::Abstract { family, name };
        }
        let body = |req| Body::AbstractLock {
            req,
            family,
            name: asked,
        };
        self.request(now, h, home, key, body, out);
    }

    /// The home answered transaction `h`'s ask for an abstract lock. Whether the lock is new is
    /// the family's view, not the home's: a home that granted a re-sent ask answers "held
    /// already", yet the family never heard of the first grant and must release the lock.
    pub(super) fn abstract_asked(&mut self, h: u64, granted: Option<bool>, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        let Wait::Abstract { family, name } = std::mem::replace(&mut tx.wait, Wait::Idle) else {
            return;
        };
        let newly = self.coord.family_answered(family, &name, granted.is_some());
        self.abstract_answer(h, granted.map(|_| newly), out);
    }

    /// `family` gives `names` back (it ended, or an open-nested block of it aborted): they are
    /// released on their homes (by message to the others).
    pub fn release_abstract(&mut self, family: u64, names: Vec<String>, out: &mut Vec<Action>) {
        let family = self.family_id(family);
        self.coord.family_released(family, &names);
        let mut by_home: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for name in names {
            by_home
                .entry(self.dir.home(&Key::from(name.as_str())))
                .or_default()
                .push(name);
        }
        // Every later ask of the family is numbered from here on.
        let before = self.coord.next_req;
        for (home, names) in by_home {
            if home == self.me {
                self.free_abstract((self.me, family), &names, u64::MAX);
            } else {
                let body = Body::AbstractRelease {
                    family,
                    names,
                    before,
                };
                self.send(home, body, out);
            }
        }
    }

    /// How many abstract locks this node is home to and holds right now.
    pub fn abstract_locks_held(&self) -> usize {
        self.home.abstract_held.len()
    }

    /// Grants `name` to `holder`, asking with request number `req`: `Some(true)` taken now,
    /// `Some(false)` held by `holder` already (granted again: a release sent before this ask
    /// no longer frees it), `None` held by another.
    pub(super) fn grant_abstract(
        &mut self,
        now: u64,
        holder: (NodeId, u64),
        name: String,
        req: u64,
    ) -> Option<bool> {
        let granted = match self.home.abstract_held.get_mut(&name) {
            Some(hold) if hold.holder == holder => {
                hold.req = hold.req.max(req);
                Some(false)
            }
            Some(_) => None,
            None => {
                self.home.abstract_held.insert(
                    name,
                    AbstractHold {
                        req,
                        holder,
                        ask_at: now + self.cfg.lease,
                    },
                );
                Some(true)
            }
        };
        if granted.is_some() {
            // The holder was heard from: its locks here are kept another abandon time.
            self.heard_from(now, holder);
        }
        granted
    }

    /// `holder` gave `names` back: each is free unless an ask numbered from `before` on
    /// granted it again.
    pub(super) fn free_abstract(&mut self, holder: (NodeId, u64), names: &[String], before: u64) {
        let before = self.planted_before(before);
        for name in names {
            if self
                .home
                .abstract_held
                .get(name)
                .is_some_and(|hold| hold.holder == holder && hold.req < before)
            {
                self.home.abstract_held.remove(name);
            }
        }
    }

    /// `before`, or every ask under the planted bug that ignores the numbering.
    fn planted_before(&self, before: u64) -> u64 {
        match self.cfg.planted_bug {
            Some(PlantedBug::StaleRelease) => u64::MAX,
            _ => before,
        }
    }

    /// The application's family number made unique across this node's restarts (the
    /// application may number families from 1 again after a restart).
    pub(super) fn family_id(&self, family: u64) -> u64 {
        (self.incarnation << 40) ^ family
    }

    /// The home heard from `holder` (an ask, or its node saying the family runs): its locks
    /// here are kept another abandon time.
    pub(super) fn heard_from(&mut self, now: u64, holder: (NodeId, u64)) {
        self.home.heard.insert(holder, now);
    }

    /// `holder` no longer runs: what it held from asks numbered below `before` is free.
    pub(super) fn free_abstract_of(&mut self, holder: (NodeId, u64), before: u64) {
        let before = self.planted_before(before);
        self.home
            .abstract_held
            .retain(|_, hold| hold.holder != holder || hold.req >= before);
    }

    pub(super) fn abstract_answer(&mut self, h: u64, granted: Option<bool>, out: &mut Vec<Action>) {
        if let Some(tx) = self.coord.active.get_mut(&h) {
            tx.wait = Wait::Idle;
        }
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Abstract(granted.ok_or(Failure::Conflict(AbortCause::AbstractLock))),
        }));
    }
}
