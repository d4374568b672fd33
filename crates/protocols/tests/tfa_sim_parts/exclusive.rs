//! Programs that hold abstract locks (open nesting's semantic locks) and the check that they
//! exclude each other. A family takes one or two names; with two it may give the second back
//! and ask for it again at once (an open-nested block that aborted and runs again, which sends
//! a release and an ask the network may reorder); it holds them a while, then releases them
//! and ends. A family refused a name gives back what it holds and tries again later.
//!
//! A family that waits too long for an answer gives up while it asks (its transaction ends with
//! the ask outstanding), and some families hold their names longer than the abandon time
//! (their node keeps telling the homes that they run).
//!
//! Checked: no two families believe at the same time that they hold the same name, except
//! where the guarantee does not reach: the name's home restarted after the family asked
//! (abstract locks live in the home's memory, and a grant of its earlier run may still be on
//! its way), the holder's node crashed (its families ended with it), or the home gave the
//! holder up after hearing nothing from it for the abandon time (it warns so).

use std::collections::BTreeMap;

use atomos_core::Key;
use atomos_protocols::tfa::directory::{Directory, HashDirectory};
use atomos_protocols::tfa::{Action, Failure, TfaMsg};
use atomos_sim::{NodeId, Output};

use super::*;

/// Families are numbered from here (below `FINAL_READ`: a family may fail as unavailable while
/// the faults last).
pub(crate) const HOLDERS: u64 = 1_500_000;
/// How many names the families share (few: they contend).
pub(crate) const LOCK_NAMES: u64 = 3;
/// A family still asking this long after its attempt began gives up the attempt.
const ANSWER_BY: u64 = 400;
/// Attempts before a family gives up.
const MAX_HOLD_ATTEMPTS: u32 = 30;

pub(crate) fn lock_name(i: u64) -> String {
    format!("mutex/{i}")
}

/// What a family does.
#[derive(Clone, Debug)]
pub(crate) struct Exclusive {
    /// The family's number, and its transaction's handle.
    pub(crate) id: u64,
    /// What it takes, in order.
    pub(crate) names: Vec<String>,
    /// How long it holds them.
    pub(crate) hold: u64,
    /// Whether it gives the second name back and asks for it again once it holds both.
    pub(crate) give_back: bool,
}

/// A family's run on its node.
pub(crate) struct Holding {
    ex: Exclusive,
    attempt: u32,
    started: u64,
    /// Names granted (to release at the end).
    held: Vec<String>,
    /// Names it reported holding (the ones the check counts).
    reported: Vec<String>,
    gave_back: bool,
    /// An ask is outstanding.
    asking: bool,
    release_at: Option<u64>,
    restart_at: Option<u64>,
}

impl SimNode {
    /// Starts family `ex.id`.
    pub(crate) fn start_exclusive(
        &mut self,
        now: u64,
        ex: Exclusive,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let h = ex.id;
        let holding = Holding {
            ex,
            attempt: 0,
            started: now,
            held: Vec::new(),
            reported: Vec::new(),
            gave_back: false,
            asking: false,
            release_at: None,
            restart_at: None,
        };
        self.holding.insert(h, holding);
        self.begin_holding(now, h, acts, out);
    }

    fn begin_holding(
        &mut self,
        now: u64,
        h: u64,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let Some(f) = self.holding.get_mut(&h) else {
            return;
        };
        f.attempt += 1;
        f.started = now;
        f.gave_back = false;
        f.restart_at = None;
        f.release_at = None;
        self.tfa.begin(h);
        self.ask_next(now, h, acts, out);
    }

    /// Asks for the next name, gives one back and asks for it again, or starts holding.
    fn ask_next(
        &mut self,
        now: u64,
        h: u64,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let Some(f) = self.holding.get_mut(&h) else {
            return;
        };
        let family = f.ex.id;
        if let Some(name) = f.ex.names.iter().find(|n| !f.held.contains(n)).cloned() {
            f.asking = true;
            return self.tfa.abstract_lock(now, h, family, name, acts);
        }
        if f.ex.give_back && !f.gave_back && f.held.len() == 2 {
            f.gave_back = true;
            let name = f.held.pop().expect("two held");
            f.reported.retain(|n| *n != name);
            out.push(Output::Deliver(Note::Frees {
                id: family,
                names: vec![name.clone()],
            }));
            f.asking = true;
            self.tfa.release_abstract(family, vec![name.clone()], acts);
            return self.tfa.abstract_lock(now, h, family, name, acts);
        }
        f.release_at = Some(now + f.ex.hold);
    }

    /// The answer to family `h`'s ask, or a failure of its transaction.
    pub(crate) fn on_hold_answer(
        &mut self,
        now: u64,
        h: u64,
        answer: Result<bool, Failure>,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let Some(f) = self.holding.get_mut(&h) else {
            return;
        };
        f.asking = false;
        match answer {
            Ok(_) => {
                let name =
                    f.ex.names
                        .iter()
                        .find(|n| !f.held.contains(n))
                        .cloned()
                        .expect("an ask was outstanding");
                f.held.push(name.clone());
                f.reported.push(name.clone());
                out.push(Output::Deliver(Note::Holds {
                    id: f.ex.id,
                    name,
                    asked_at: f.started,
                }));
                self.ask_next(now, h, acts, out)
            }
            Err(Failure::Conflict(_)) => self.end_attempt(now, h, true, acts, out),
            Err(failure) => {
                let id = f.ex.id;
                self.end_attempt(now, h, false, acts, out);
                out.push(Output::Deliver(Note::Failed { id, failure }));
            }
        }
    }

    /// Releases what family `h` holds and ends its transaction; it tries again later if
    /// `again` (and attempts are left), else it is done.
    fn end_attempt(
        &mut self,
        now: u64,
        h: u64,
        again: bool,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let Some(f) = self.holding.get_mut(&h) else {
            return;
        };
        let family = f.ex.id;
        if !f.reported.is_empty() {
            out.push(Output::Deliver(Note::Frees {
                id: family,
                names: std::mem::take(&mut f.reported),
            }));
        }
        let held = std::mem::take(&mut f.held);
        f.release_at = None;
        f.asking = false;
        let retry = again && f.attempt < MAX_HOLD_ATTEMPTS;
        if retry {
            f.restart_at = Some(now + 1 + self.rng.below(20 * u64::from(f.attempt.min(8))));
        } else {
            self.holding.remove(&h);
        }
        if !held.is_empty() {
            self.tfa.release_abstract(family, held, acts);
        }
        self.tfa.abort(now, h, acts);
    }

    /// Per tick: families whose time is up release; families backing off try again.
    pub(crate) fn hold_tick(
        &mut self,
        now: u64,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let due: Vec<(u64, Due)> = self
            .holding
            .iter()
            .filter_map(|(&h, f)| {
                if f.release_at.is_some_and(|t| t <= now) {
                    Some((h, Due::Release))
                } else if f.asking && now > f.started + ANSWER_BY {
                    Some((h, Due::GiveUp))
                } else if f.restart_at.is_some_and(|t| t <= now) {
                    Some((h, Due::Restart))
                } else {
                    None
                }
            })
            .collect();
        for (h, due) in due {
            match due {
                Due::Release => self.end_attempt(now, h, false, acts, out),
                // Its transaction ends with the ask outstanding.
                Due::GiveUp => self.end_attempt(now, h, true, acts, out),
                Due::Restart => self.begin_holding(now, h, acts, out),
            }
        }
    }
}

/// What a family's time brought.
enum Due {
    Release,
    GiveUp,
    Restart,
}

/// One family's belief that it holds a name: from when it heard of the grant until it gave
/// the name back (or its node crashed, or the name's home restarted).
#[derive(Debug)]
struct Belief {
    family: u64,
    node: NodeId,
    from: u64,
    until: u64,
}

/// A belief still open: where, since when, and since when its family asked.
struct Open {
    node: NodeId,
    from: u64,
    asked_at: u64,
}

/// No two families believed they held one name at the same time. Returns how many beliefs
/// the run had.
pub(crate) fn check_exclusion(o: &Outcome, nodes: usize) -> Result<usize, String> {
    let dir = HashDirectory::new((1..=nodes as NodeId).collect()).expect("members");
    let home = |name: &str| dir.home(&Key::from(name));
    let crashed_between = |node: NodeId, from: u64, until: u64| {
        o.run
            .crashes
            .iter()
            .filter(|(t, n)| *n == node && *t >= from && *t < until)
            .map(|(t, _)| *t)
            .min()
    };
    // Homes that gave a holder up after hearing nothing from it: (home, node, family, when).
    let abandoned: Vec<(NodeId, NodeId, u64, u64)> = o
        .run
        .trace
        .iter()
        .filter_map(|line| {
            let (t, rest) = line.split_once(" warn ")?;
            let (home, text) = rest.split_once(' ')?;
            let text = text.strip_prefix("released the abstract locks of family ")?;
            let (family, text) = text.split_once(" of node ")?;
            let node = text.strip_suffix(" after no answer")?;
            // The family's number there carries its node's incarnation above bit 40.
            let family = family.parse::<u64>().ok()? & ((1 << 40) - 1);
            Some((
                home.parse().ok()?,
                node.parse().ok()?,
                family,
                t.parse().ok()?,
            ))
        })
        .collect();
    let given_up = |home: NodeId, node: NodeId, family: u64, from: u64, until: u64| {
        abandoned
            .iter()
            .filter(|(h, n, f, t)| (*h, *n, *f) == (home, node, family) && *t >= from && *t < until)
            .map(|(_, _, _, t)| *t)
            .min()
    };
    let mut open: BTreeMap<(u64, String), Open> = BTreeMap::new();
    let mut beliefs: BTreeMap<String, Vec<Belief>> = BTreeMap::new();
    let mut close = |name: String, family: u64, o: Open, until: u64| {
        // A crash of the holder ends the belief; one of the name's home after the ask voids
        // what follows it.
        let ends = [
            crashed_between(o.node, o.from, until),
            crashed_between(home(&name), o.asked_at, until),
            given_up(home(&name), o.node, family, o.from, until),
        ];
        let until = ends.into_iter().flatten().fold(until, u64::min);
        if until > o.from {
            beliefs.entry(name).or_default().push(Belief {
                family,
                node: o.node,
                from: o.from,
                until,
            });
        }
    };
    for (t, node, note) in &o.run.notes {
        match note {
            Note::Holds { id, name, asked_at } => {
                let belief = Open {
                    node: *node,
                    from: *t,
                    asked_at: *asked_at,
                };
                if let Some(other) = open.insert((*id, name.clone()), belief) {
                    return Err(format!(
                        "family {id} reported holding {name} again (since {} on node {})",
                        other.from, other.node
                    ));
                }
            }
            Note::Frees { id, names } => {
                for name in names {
                    if let Some(o) = open.remove(&(*id, name.clone())) {
                        close(name.clone(), *id, o, *t);
                    }
                }
            }
            _ => {}
        }
    }
    for ((family, name), o) in open {
        close(name, family, o, u64::MAX);
    }
    let mut count = 0;
    for (name, mut list) in beliefs {
        count += list.len();
        list.sort_by_key(|b| b.from);
        for (i, a) in list.iter().enumerate() {
            if let Some(b) = list[i + 1..]
                .iter()
                .find(|b| b.family != a.family && b.from < a.until)
            {
                return Err(format!(
                    "families {} (node {}, from {} to {}) and {} (node {}, from {}) both held \
                     {name}",
                    a.family, a.node, a.from, a.until, b.family, b.node, b.from
                ));
            }
        }
    }
    Ok(count)
}
