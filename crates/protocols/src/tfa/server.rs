//! The serving side of a TFA node: what it answers as the owner of objects and the home of
//! keys, and how it applies committers' decisions.

use atomos_core::{AbortCause, Key};

use atomos_seam::Output;

use super::clock::MAX_CLOCK;
use super::directory::{Directory, NodeId};
use super::msg::{Body, Decision, FetchAnswer, TfaMsg};
use super::node::*;
use super::owner::{Refusal, TxId};

impl TfaNode {
    /// Handles a message from node `from`.
    pub fn on_message(&mut self, now: u64, from: NodeId, msg: TfaMsg, out: &mut Vec<Action>) {
        if msg.clock > MAX_CLOCK {
            // A clock no run reaches: taking it would stall or wrap this node's versions.
            out.push(Output::Warn(format!(
                "dropped a message from node {from} with clock {}, beyond {MAX_CLOCK}",
                msg.clock
            )));
            return;
        }
        self.clock.observe(msg.clock);
        match msg.body {
            Body::Fetch { req, key } => {
                let answer = self.lookup(&key);
                self.send(from, Body::Fetched { req, answer }, out);
            }
            Body::Fetched { req, answer } => {
                if let Some(&h) = self.requests.get(&req) {
                    self.requests.remove(&req);
                    let live = self
                        .active
                        .get(&h)
                        .is_some_and(|t| t.outstanding.contains_key(&req));
                    if live {
                        self.fetched(now, h, from, msg.clock, answer, out);
                    }
                }
            }
            Body::Lock { req, tx, items } => {
                // A late duplicate of a finished transaction's request may take locks again;
                // they are released once the committer, asked after the lease, says so.
                let result = self.objects.try_lock(tx, &items, now, self.cfg.lease);
                self.send(from, Body::Locked { req, result }, out);
            }
            Body::Locked { req, result } => {
                let Some(h) = self.take_request(req) else {
                    return;
                };
                match result {
                    Ok(()) => self.lock_progress(now, h, out),
                    Err(Refusal::Busy(key)) => {
                        self.counters.aborts_lock_busy += 1;
                        self.fail(now, h, refusal_failure(&Refusal::Busy(key)), out)
                    }
                    Err(Refusal::Invalid(key)) => {
                        self.counters.aborts_validation += 1;
                        self.reopen(now, h, vec![key], out)
                    }
                }
            }
            Body::Validate { req, tx, items } => {
                let invalid = items
                    .into_iter()
                    .filter(|(k, v)| !self.objects.validate(tx, k, *v))
                    .map(|(k, _)| k)
                    .collect();
                self.send(from, Body::Validated { req, invalid }, out);
            }
            Body::Validated { req, invalid } => {
                let Some(h) = self.take_request(req) else {
                    return;
                };
                if !invalid.is_empty() || self.active[&h].outstanding.is_empty() {
                    self.validated(now, h, invalid, out);
                }
            }
            Body::Decided { tx, decision } => {
                self.apply_decision(tx, decision);
                self.acks.entry(from).or_default().done.push(tx);
            }
            Body::Done { txs } => {
                for tx in txs {
                    if let Some(p) = self.decided.get_mut(&tx) {
                        p.waiting.remove(&from);
                        if p.waiting.is_empty() {
                            self.decided.remove(&tx);
                        }
                    }
                }
            }
            Body::Ask { tx } => {
                let decision = match self.decided.get(&tx) {
                    Some(p) => p.decision,
                    None => {
                        // Undecided (still committing) or unknown (finished and confirmed, or
                        // from before a restart): abort it; a committed transaction is only
                        // forgotten once every owner confirmed, so no asker waits for it.
                        if let Some(&h) = self.handles.get(&tx) {
                            self.counters.aborts_validation += 1;
                            self.fail(now, h, Failure::Conflict(AbortCause::CommitValidation), out);
                        }
                        Decision::Abort
                    }
                };
                self.send(from, Body::Decided { tx, decision }, out);
            }
            Body::Track { entries } => {
                let acks = &mut self.acks.entry(from).or_default().tracked;
                for (key, version) in entries {
                    if self.dir.home(&key) == self.me {
                        self.tracker.update(key.clone(), from, version);
                        acks.push((key, version));
                    }
                }
            }
            Body::AbstractLock { req, family, name } => {
                let granted = self.grant_abstract(now, (from, family), name);
                self.send(from, Body::AbstractLocked { req, granted }, out);
            }
            Body::AbstractLocked { req, granted } => {
                if let Some(h) = self.take_request(req) {
                    self.abstract_answer(h, granted, out);
                }
            }
            Body::AbstractRelease { family, names } => self.free_abstract((from, family), &names),
            Body::FamilyAlive { family } => {
                let alive = self.families.contains(&family);
                self.send(from, Body::FamilyState { family, alive }, out);
            }
            Body::FamilyState { family, alive } => {
                if !alive {
                    self.free_abstract_of((from, family));
                }
            }
            Body::Tracked { entries } => {
                for (key, version) in entries {
                    if self
                        .tracking
                        .get(&key)
                        .is_some_and(|t| t.version <= version)
                    {
                        self.tracking.remove(&key);
                    }
                }
            }
        }
    }

    /// What this node answers about `key` (to a `Fetch`, or to a read of its own).
    pub(super) fn lookup(&mut self, key: &Key) -> FetchAnswer {
        if let Some(held) = self.objects.get(key) {
            if held.locked_by.is_some() {
                return FetchAnswer::Busy;
            }
            return FetchAnswer::Found {
                value: held.value.map(<[u8]>::to_vec),
                version: held.version,
            };
        }
        if let Some(next) = self.objects.moved_to(key) {
            return FetchAnswer::Redirect(next);
        }
        if self.dir.home(key) == self.me {
            return match self.tracker.owner(key) {
                Some(owner) if owner != self.me => FetchAnswer::Redirect(owner),
                Some(_) => FetchAnswer::Busy,
                None => {
                    // Never created: the home owns it as a missing object, so creating it
                    // locks it here like any other write.
                    self.objects.adopt(key.clone(), None, 0);
                    FetchAnswer::Found {
                        value: None,
                        version: 0,
                    }
                }
            };
        }
        FetchAnswer::Redirect(self.dir.home(key))
    }

    pub(super) fn apply_decision(&mut self, tx: TxId, decision: Decision) {
        match decision {
            Decision::Commit { version } => {
                for key in self.objects.surrender(tx, tx.node, version) {
                    if self.dir.home(&key) == self.me {
                        self.tracker.update(key.clone(), tx.node, version);
                    }
                    self.cache.learn(key, tx.node);
                }
            }
            Decision::Abort => {
                self.objects.release(tx);
            }
        }
    }
}
