//! The serving side of a TFA node: what it answers as the owner of objects and the home of
//! keys, and how it applies committers' decisions.

use atomos_core::{AbortCause, Key};

use atomos_seam::Output;

use super::clock::MAX_CLOCK;
use super::directory::{Directory, NodeId};
use super::msg::{Body, Decision, FetchAnswer, PassedRead, TfaMsg};
use super::node::*;
use super::owner::{Refusal, TxId};
use super::roles::*;

/// Times a read is passed on before a node answers with a redirect instead (owners that
/// point at each other while a home catches up would otherwise pass it around).
const FORWARD_HOPS: u32 = 4;

/// Transactions whose passed-on reads for writes a node remembers (see `pass_decision_on`).
const PASSED_LOCKS_KEPT: usize = 4096;

impl PassedRead {
    /// The read of `origin` (run `origin_incarnation`) as it reached the first node asked.
    fn asked(
        origin: NodeId,
        origin_incarnation: u64,
        req: u64,
        lock: Option<TxId>,
        key: Key,
    ) -> PassedRead {
        PassedRead {
            origin,
            origin_incarnation,
            req,
            lock,
            key,
            hops: 0,
        }
    }
}

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
        self.start(now, out);
        if !self.learn_incarnation(now, from, msg.incarnation, out) {
            // From an earlier run of the sender: what it says no longer holds.
            return;
        }
        self.clock.observe(msg.clock);
        match msg.body {
            Body::Hello => {
                let incarnation = msg.incarnation;
                self.send(from, Body::Welcome { incarnation }, out)
            }
            Body::Welcome { incarnation } => {
                if incarnation == self.incarnation {
                    self.greeting.0.remove(&from);
                }
            }
            Body::Fetch { req, key } => {
                let read = PassedRead::asked(from, msg.incarnation, req, None, key);
                self.serve_read(now, read, out);
            }
            Body::FetchLock { req, tx, key } => {
                // A late duplicate of a finished transaction's request may lock again; the
                // lock is released once the committer, asked after the lease, says so, and a
                // commit's decision never hands over an object it does not name.
                let read = PassedRead::asked(from, msg.incarnation, req, Some(tx), key);
                self.serve_read(now, read, out);
            }
            Body::Forwarded(read) => {
                // Served as if the origin had asked: an earlier run's request is dropped, a
                // later run's is learned of first (its earlier locks here are dropped).
                let origin = read.origin;
                let valid = origin != self.me
                    && self.dir.is_member(origin)
                    && read.lock.is_none_or(|tx| tx.node == origin);
                if !valid || !self.learn_incarnation(now, origin, read.origin_incarnation, out) {
                    return;
                }
                self.serve_read(now, read, out);
            }
            Body::Fetched { req, answer } => {
                if let Some(h) = self.coord.take_request(req, from, true) {
                    self.fetched(now, h, from, msg.clock, answer, out);
                }
            }
            Body::Lock { req, tx, items } => {
                // A late duplicate of a finished transaction's request may take locks again;
                // they are released once the committer, asked after the lease, says so.
                let result = match self.lost_refusal(&items) {
                    Some(lost) => Err(lost),
                    None => self.owner.objects.try_lock(tx, &items, now, self.cfg.lease),
                };
                if result.is_ok() {
                    self.note_creations(&items, out);
                }
                self.send(from, Body::Locked { req, result }, out);
            }
            Body::Locked { req, result } => {
                let Some(h) = self.coord.take_request(req, from, false) else {
                    return;
                };
                match result {
                    Ok(()) => self.lock_progress(now, h, out),
                    Err(Refusal::Busy(key)) => {
                        self.coord.note_contention(now, self.cfg.contention_quiet);
                        self.counters.aborts_lock_busy += 1;
                        self.fail(now, h, refusal_failure(&Refusal::Busy(key)), out)
                    }
                    Err(lost @ Refusal::Lost(..)) => self.fail(now, h, refusal_failure(&lost), out),
                    Err(Refusal::Invalid(key)) => {
                        self.counters.aborts_validation += 1;
                        self.reopen(now, h, vec![key], out)
                    }
                }
            }
            Body::Validate { req, tx, items } => {
                let invalid = items
                    .into_iter()
                    .filter(|(k, v)| !self.owner.objects.validate(tx, k, *v))
                    .map(|(k, _)| k)
                    .collect();
                self.send(from, Body::Validated { req, invalid }, out);
            }
            Body::Validated { req, invalid } => {
                let Some(h) = self.coord.take_request(req, from, false) else {
                    return;
                };
                if !invalid.is_empty() || self.coord.active[&h].outstanding.is_empty() {
                    self.validated(now, h, invalid, out);
                }
            }
            Body::Decided {
                tx,
                decision,
                taken,
            } => {
                self.apply_decision(now, tx, decision, &taken, out);
                self.acks.entry(from).or_default().done.push(tx);
                self.pass_decision_on(tx, decision, from, out);
            }
            Body::Done { txs } => {
                for tx in txs {
                    if let Some(p) = self.coord.decided.get_mut(&tx) {
                        p.waiting.remove(&from);
                        if p.waiting.is_empty() {
                            self.coord.decided.remove(&tx);
                        }
                    }
                }
            }
            Body::Ask { tx } => {
                let mut taken = Vec::new();
                let decision = match self.coord.decided.get(&tx) {
                    Some(p) => {
                        taken = p.taken.get(&from).cloned().unwrap_or_default();
                        p.decision
                    }
                    // From an earlier run of this node: nothing is known of it here.
                    None if tx.n >> 32 < self.incarnation => Decision::Unknown,
                    None => {
                        // Undecided or unknown (finished and confirmed): abort it. A committed
                        // decision is kept until every owner confirmed it, or twice the abandon
                        // time, after which every owner that did not confirm has given its
                        // locks up (as lost): no asker waits for it.
                        match self.standing(tx) {
                            // Still running (not committing): it gives up the locks it took
                            // with reads and goes on without them.
                            Standing::Working(h) => self.give_up_number(now, h, out),
                            // A read that may lock is in flight: asked again after a lease.
                            Standing::Locking => return,
                            Standing::Committing(h) => {
                                self.counters.aborts_validation += 1;
                                let failure = Failure::Conflict(AbortCause::CommitValidation);
                                self.fail(now, h, failure, out);
                            }
                            Standing::Gone => {}
                        }
                        Decision::Abort
                    }
                };
                let body = Body::Decided {
                    tx,
                    decision,
                    taken,
                };
                self.send(from, body, out);
            }
            Body::Track { entries } => {
                for (key, version) in entries {
                    if self.dir.home(&key) == self.me {
                        self.record_owner(key.clone(), from, msg.incarnation, version, out);
                        self.acks
                            .entry(from)
                            .or_default()
                            .tracked
                            .push((key, version, false));
                    }
                }
            }
            Body::Lost { entries } => {
                for (key, version, node) in entries {
                    if self.dir.home(&key) == self.me {
                        self.record_lost(key.clone(), node, version, out);
                        self.acks
                            .entry(from)
                            .or_default()
                            .tracked
                            .push((key, version, true));
                    }
                }
            }
            Body::AbstractLock { req, family, name } => {
                let granted = self.grant_abstract(now, (from, family), name, req);
                self.send(from, Body::AbstractLocked { req, granted }, out);
            }
            Body::AbstractLocked { req, granted } => {
                if let Some(h) = self.coord.take_request(req, from, false) {
                    self.abstract_asked(h, granted, out);
                }
            }
            Body::AbstractRelease {
                family,
                names,
                before,
            } => self.free_abstract((from, family), &names, before),
            Body::FamilyAlive { family } => {
                let alive = self.coord.family_runs(family);
                let before = self.coord.next_req;
                let body = Body::FamilyState {
                    family,
                    alive,
                    before,
                };
                self.send(from, body, out);
            }
            Body::FamilyState {
                family,
                alive,
                before,
            } => {
                if alive {
                    self.heard_from(now, (from, family));
                } else {
                    self.free_abstract_of((from, family), before);
                }
            }
            Body::Tracked { entries } => {
                for (key, version, lost) in entries {
                    // A confirmation of a newer entry, or of this very one (same version, same
                    // kind: a move and a loss can carry the same version).
                    let confirmed = self.owner.tracking.get(&key).is_some_and(|t| {
                        t.version < version
                            || (t.version == version && t.lost_with.is_some() == lost)
                    });
                    if confirmed {
                        self.owner.tracking.remove(&key);
                    }
                }
            }
        }
    }

    /// Answers a read of another node (asked directly or passed on): with the object if this
    /// node owns it, else, within the hop limit, by passing the request on to the node it
    /// believes owns it (the origin then hears from that node), else with a redirect.
    fn serve_read(&mut self, now: u64, read: PassedRead, out: &mut Vec<Action>) {
        let answer = match read.lock {
            Some(tx) => self.lookup_locking(now, &read.key, tx),
            None => self.lookup(&read.key),
        };
        if let FetchAnswer::Redirect(next) = answer {
            let passable = next != read.origin && next != self.me;
            if self.cfg.forward_reads && passable && read.hops < FORWARD_HOPS {
                self.counters.reads_forwarded += 1;
                if let Some(tx) = read.lock {
                    self.owner.passed_locks.entry(tx).or_default().insert(next);
                    // A late duplicate passed on after its transaction's decision leaves an
                    // entry no decision removes: the oldest go first (their holders still ask).
                    while self.owner.passed_locks.len() > PASSED_LOCKS_KEPT {
                        self.owner.passed_locks.pop_first();
                    }
                }
                let hops = read.hops + 1;
                return self.send(next, Body::Forwarded(PassedRead { hops, ..read }), out);
            }
        }
        let body = Body::Fetched {
            req: read.req,
            answer,
        };
        self.send(read.origin, body, out);
    }

    /// The decision for `tx`, from `from`, reached this node, which passed reads for writes of
    /// `tx` on: an abort goes on to the nodes it passed them to, which may hold locks the
    /// transaction never heard of (their answer had not reached it when it ended), so they do not
    /// wait out a lease to ask, or for good if they cannot reach the transaction's node. A
    /// commit goes nowhere: the committer tells every node it knows locked for it, and a lock
    /// it does not know of is released when its holder asks.
    fn pass_decision_on(
        &mut self,
        tx: TxId,
        decision: Decision,
        from: NodeId,
        out: &mut Vec<Action>,
    ) {
        if from != tx.node {
            return;
        }
        let Some(nodes) = self.owner.passed_locks.remove(&tx) else {
            return;
        };
        if decision == Decision::Abort {
            for node in nodes.into_iter().filter(|&n| n != self.me && n != from) {
                let body = Body::Decided {
                    tx,
                    decision,
                    taken: Vec::new(),
                };
                self.send(node, body, out);
            }
        }
    }

    /// What this node answers about `key` (to a `Fetch`, or to a read of its own).
    pub(super) fn lookup(&mut self, key: &Key) -> FetchAnswer {
        if let Some(held) = self.owner.objects.get(key) {
            if held.locked_by.is_some() {
                return FetchAnswer::Busy;
            }
            return FetchAnswer::Found {
                value: held.value.map(<[u8]>::to_vec),
                version: held.version,
            };
        }
        let home = self.dir.home(key) == self.me;
        let record = home.then(|| self.home.tracker.record(key)).flatten();
        if let Some((to, version)) = self.owner.objects.moved(key) {
            // Follow the forwarding address unless the home knows of something newer (a
            // later owner, or the object's loss).
            if record.is_none_or(|r| r.version < version || (r.version == version && !r.lost)) {
                return FetchAnswer::Redirect(to);
            }
        }
        if home {
            return match record {
                Some(r) if r.lost => FetchAnswer::Lost(r.owner),
                Some(r) if r.owner != self.me => FetchAnswer::Redirect(r.owner),
                Some(_) => FetchAnswer::Busy,
                None => {
                    // Never created: the home owns it as a missing object, so creating it
                    // locks it here like any other write.
                    self.owner.objects.adopt(key.clone(), None, 0);
                    FetchAnswer::Found {
                        value: None,
                        version: 0,
                    }
                }
            };
        }
        FetchAnswer::Redirect(self.dir.home(key))
    }

    /// What this node answers about `key` to transaction `tx`, which reads it to write it: as
    /// [`TfaNode::lookup`], and a copy found is locked for `tx` (one it holds locked already
    /// is found again). An object that does not exist is not locked: a write to it must be a
    /// creation, which takes its lock at commit (reads of missing objects are mostly of things
    /// not there yet, and would hold locks for nothing).
    pub(super) fn lookup_locking(&mut self, now: u64, key: &Key, tx: TxId) -> FetchAnswer {
        if let Some(held) = self
            .owner
            .objects
            .get(key)
            .filter(|h| h.locked_by == Some(tx))
        {
            return FetchAnswer::Found {
                value: held.value.map(<[u8]>::to_vec),
                version: held.version,
            };
        }
        let answer = self.lookup(key);
        if matches!(answer, FetchAnswer::Found { value: Some(_), .. })
            && self.cfg.planted_bug != Some(PlantedBug::UnlockedWriteRead)
        {
            // Found means owned here and unlocked: the lock cannot be refused. (An object with a
            // value was written: no creation to record, unlike a lock at commit.)
            let item = [(key.clone(), None)];
            let _ = self.owner.objects.try_lock(tx, &item, now, self.cfg.lease);
        }
        answer
    }

    pub(super) fn apply_decision(
        &mut self,
        now: u64,
        tx: TxId,
        decision: Decision,
        taken: &[(Key, Option<u64>)],
        out: &mut Vec<Action>,
    ) {
        match decision {
            Decision::Commit { version } => {
                let everything: Vec<(Key, Option<u64>)>;
                let taken = if self.cfg.planted_bug == Some(PlantedBug::SurrenderUnnamed) {
                    everything = self
                        .owner
                        .objects
                        .locked_keys(tx)
                        .map(|k| (k, None))
                        .collect();
                    &everything
                } else {
                    taken
                };
                for key in self.owner.objects.surrender(tx, tx.node, version, taken) {
                    if self.dir.home(&key) == self.me {
                        self.record_owner(key.clone(), tx.node, tx.n >> 32, version, out);
                    }
                    self.coord.cache.learn(key, tx.node);
                }
            }
            Decision::Abort => {
                self.owner.objects.release(tx);
            }
            Decision::Unknown => self.drop_in_doubt(now, tx, out),
        }
    }
}
