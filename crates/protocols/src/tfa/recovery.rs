//! How a TFA node lives with restarts: it writes its home records down, learns the other
//! nodes' incarnations from their messages, and reports what a restart lost instead of
//! re-creating it.
//!
//! - Every message carries its sender's incarnation. A newer one means the sender restarted
//!   and holds nothing: the home records naming an earlier incarnation of it become lost, cached
//!   owners naming it are forgotten, and locks its earlier transactions hold here are in doubt
//!   (the transaction may have committed and taken the objects with it), so those objects are
//!   dropped as lost and their homes told. A message from an older incarnation is dropped.
//! - A (re)started node says `Hello` to every member until each answers, so the homes learn of
//!   the restart even if nothing else would tell them.
//! - A home answers a read of a lost object with `Lost`, and refuses to lock it: a key is never
//!   re-created while a copy may exist; only a newer version of it (from a committer that took
//!   it while it was in doubt) replaces the record.

use atomos_core::Key;
use atomos_seam::{Output, Write};

use super::directory::{Directory, NodeId};
use super::durable::{self, TfaRecord};
use super::node::*;
use super::owner::{Refusal, TxId};

/// The log is rewritten whole once it holds this many times more records than the state has,
/// plus this many.
const COMPACT_FACTOR: usize = 4;
const COMPACT_SLACK: usize = 1024;

impl TfaNode {
    /// Writes `record` down: whatever this step sends after it waits until it is durable.
    pub(super) fn persist(&mut self, record: TfaRecord, out: &mut Vec<Action>) {
        self.logged += 1;
        let state = self.home.tracker.len() + self.peers.len();
        if self.logged > COMPACT_FACTOR * state + COMPACT_SLACK {
            let all = durable::snapshot(&self.home.tracker, &self.peers);
            self.logged = all.len();
            out.push(Output::Persist(Write::Rewrite(
                all.into_iter().map(Into::into).collect(),
            )));
        } else {
            out.push(Output::Persist(Write::Append(vec![record.encode().into()])));
        }
    }

    /// Records that `owner` (in `incarnation`) holds `key` at `version`, if that is newer than
    /// the record; writes it down when the owner changed.
    pub(super) fn record_owner(
        &mut self,
        key: Key,
        owner: NodeId,
        incarnation: u64,
        version: u64,
        out: &mut Vec<Action>,
    ) {
        let before = self.home.tracker.record(&key);
        if let Some(record) = self
            .home
            .tracker
            .update(key.clone(), owner, incarnation, version)
        {
            let same_holder = before.is_some_and(|b| {
                !b.lost && b.owner == record.owner && b.incarnation == record.incarnation
            });
            // A new version by the same holder changes nothing a restart needs.
            if !same_holder {
                self.persist(TfaRecord::Home { key, record }, out);
            }
        }
    }

    /// Records that `key`, held at `version`, was lost with `node` (unless the record is
    /// newer), and writes it down.
    pub(super) fn record_lost(
        &mut self,
        key: Key,
        node: NodeId,
        version: u64,
        out: &mut Vec<Action>,
    ) {
        if let Some(record) = self.home.tracker.lose(key.clone(), node, version) {
            self.counters.marked_lost += 1;
            self.persist(TfaRecord::Home { key, record }, out);
        }
    }

    /// The refusal for locking `items` here if one of them is a lost object this node is home
    /// to and does not hold.
    pub(super) fn lost_refusal(&self, items: &[(Key, Option<u64>)]) -> Option<Refusal> {
        items.iter().find_map(|(key, _)| {
            if self.owner.objects.owns(key) || self.dir.home(key) != self.me {
                return None;
            }
            let record = self.home.tracker.record(key).filter(|r| r.lost)?;
            Some(Refusal::Lost(key.clone(), record.owner))
        })
    }

    /// Locks were granted on `items`: a never created object this node is home to, locked for
    /// a creation, gets a record first, so that if this node restarts before it learns the
    /// outcome it does not hand out a second first copy (the record then says lost, until the
    /// creator's report of a newer version replaces it).
    pub(super) fn note_creations(&mut self, items: &[(Key, Option<u64>)], out: &mut Vec<Action>) {
        for (key, _) in items {
            let fresh = self.owner.objects.get(key).is_some_and(|h| h.version == 0);
            if fresh && self.dir.home(key) == self.me && self.home.tracker.record(key).is_none() {
                self.record_owner(key.clone(), self.me, self.incarnation, 0, out);
            }
        }
    }

    /// Notes that `node` runs as `incarnation` (from one of its messages, or this node's own
    /// start). Returns `false` if that incarnation is older than one already seen: the message
    /// is stale and must be dropped.
    pub(super) fn learn_incarnation(
        &mut self,
        now: u64,
        node: NodeId,
        incarnation: u64,
        out: &mut Vec<Action>,
    ) -> bool {
        match self.peers.get(&node) {
            Some(&known) if incarnation < known => {
                self.counters.stale_dropped += 1;
                // Rare (messages of a run overtaken by its restart) unless the node restarted
                // with an incarnation below its last one (a clock set back, a wiped log).
                out.push(Output::Warn(format!(
                    "dropped a message from node {node} run {incarnation}: run {known} of it was \
                     seen already"
                )));
                return false;
            }
            Some(&known) if incarnation == known => return true,
            _ => {}
        }
        self.peers.insert(node, incarnation);
        self.persist(TfaRecord::Peer { node, incarnation }, out);
        for (key, record) in self.home.tracker.lose_owner(node, incarnation) {
            self.counters.marked_lost += 1;
            self.persist(TfaRecord::Home { key, record }, out);
        }
        if node == self.me {
            return true;
        }
        self.coord.cache.forget_node(node);
        self.owner
            .passed_locks
            .retain(|tx, _| !(tx.node == node && tx.n >> 32 < incarnation));
        // Objects that moved from here to an earlier run of it died with it.
        for (key, version) in self.owner.objects.forget_moves_to(node, incarnation) {
            self.report_lost(now, key, node, version, out);
        }
        for tx in self.owner.objects.lockers() {
            if tx.node == node && tx.n >> 32 < incarnation {
                self.drop_in_doubt(now, tx, out);
            }
        }
        // Decisions it was to confirm: it holds no locks any more.
        self.coord.decided.retain(|_, p| {
            p.waiting.remove(&node);
            !p.waiting.is_empty()
        });
        self.home
            .abstract_held
            .retain(|_, hold| hold.holder.0 != node);
        true
    }

    /// Nobody can tell any more whether `tx` committed: the objects it locked here may have
    /// moved to its node and died there, so they are dropped as lost, and their homes told.
    pub(super) fn drop_in_doubt(&mut self, now: u64, tx: TxId, out: &mut Vec<Action>) {
        if self.cfg.planted_bug == Some(super::node::PlantedBug::ReleaseInDoubt) {
            self.owner.objects.release(tx);
            return;
        }
        let dropped = self.owner.objects.drop_in_doubt(tx);
        self.counters.dropped_lost += dropped.len() as u64;
        if !dropped.is_empty() {
            out.push(Output::Warn(format!(
                "dropped {} objects locked by transaction {}:{} as lost: its node restarted \
                 or stopped answering, and whether it committed cannot be told",
                dropped.len(),
                tx.node,
                tx.n
            )));
        }
        for (key, version) in dropped {
            self.report_lost(now, key, tx.node, version, out);
        }
    }

    /// Tells `key`'s home (this node, or another with the next timer tick, until it
    /// confirms) that the object, last known here at `version`, was lost with `node`.
    fn report_lost(
        &mut self,
        now: u64,
        key: Key,
        node: NodeId,
        version: u64,
        out: &mut Vec<Action>,
    ) {
        self.coord.cache.forget(&key);
        if self.dir.home(&key) == self.me {
            self.record_lost(key, node, version, out);
        } else if self
            .owner
            .tracking
            .get(&key)
            .is_none_or(|t| t.version <= version)
        {
            self.owner.track_later(now, key, version, Some(node));
        }
    }

    /// Notes this node's own incarnation, once: what an earlier run of it owned is lost.
    pub(super) fn start(&mut self, now: u64, out: &mut Vec<Action>) {
        if self.peers.get(&self.me) != Some(&self.incarnation) {
            self.learn_incarnation(now, self.me, self.incarnation, out);
        }
    }

    /// Says `Hello` to the members that have not answered yet, every re-send interval.
    pub(super) fn greet(&mut self, now: u64, out: &mut Vec<Action>) {
        let (waiting, sent) = &self.greeting;
        if waiting.is_empty() || sent.is_some_and(|s| now < s + self.cfg.resend) {
            return;
        }
        let to: Vec<NodeId> = waiting.iter().copied().collect();
        self.greeting.1 = Some(now);
        for node in to {
            self.send(node, super::msg::Body::Hello, out);
        }
    }
}
