//! The coordinator's side of a TFA node: the application's transactions, their reads with
//! forwarding (figure 5.1), validation and the commit of figure 5.2.

use std::collections::{BTreeMap, BTreeSet};

use atomos_core::{AbortCause, Key};
use atomos_seam::Output;

use super::directory::{Directory, NodeId};
use super::msg::{Body, Decision, FetchAnswer};
use super::node::*;
use super::owner::{Refusal, TxId};
use super::roles::*;

impl TfaNode {
    /// Starts transaction `h` (a handle the caller picks, unique among running ones) at the
    /// node's clock.
    pub fn begin(&mut self, h: u64) {
        let id = TxId {
            node: self.me,
            n: self.coord.next_tx,
        };
        self.coord.next_tx += 1;
        self.coord.handles.insert(id, h);
        self.coord.active.insert(
            h,
            Active {
                id,
                rv: self.clock.now(),
                reads: BTreeMap::new(),
                wait: Wait::Idle,
                outstanding: BTreeMap::new(),
                contacted: BTreeSet::new(),
                prelocked: BTreeMap::new(),
                taken: BTreeMap::new(),
                lock_reads: self.cfg.lock_writes_at_read,
            },
        );
    }

    /// Reads `key` for transaction `h`; the answer is a [`Reply::Read`] (at once when this node
    /// owns the object). A failed read ends the transaction.
    pub fn read(&mut self, now: u64, h: u64, key: Key, out: &mut Vec<Action>) {
        self.start_read(now, h, key, false, out);
    }

    /// Reads `key` for transaction `h`, which is about to write it: like [`TfaNode::read`],
    /// and with [`TfaConfig::lock_writes_at_read`] the owner locks the object for the
    /// transaction with the same answer, so its commit asks no lock of that owner. An object
    /// locked so that the transaction does not write after all is released at its end.
    pub fn read_for_write(&mut self, now: u64, h: u64, key: Key, out: &mut Vec<Action>) {
        let quiet = now >= self.coord.contended_until;
        let lock = quiet && self.coord.active.get(&h).is_some_and(|tx| tx.lock_reads);
        self.start_read(now, h, key, lock, out);
    }

    fn start_read(&mut self, now: u64, h: u64, key: Key, lock: bool, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        // An object this transaction holds locked answers only to it: read it again locking.
        let (target, lock) = match tx.prelocked.get(&key) {
            Some(p) => (p.owner, true),
            // Held here (a commit here took it; the cache forgets what this node owns): read
            // here, rather than ask its home, which would only point back here.
            None if self.owner.objects.get(&key).is_some() => (self.me, lock),
            None => (self.coord.cache.ask(&key, &self.dir), lock),
        };
        tx.wait = Wait::Fetch {
            key: key.clone(),
            hops: 0,
            busy: 0,
            lock,
        };
        self.fetch_from(now, h, key, target, out);
    }

    /// Commits transaction `h` with its buffered writes (`None` deletes); the answer is a
    /// [`Reply::Commit`]. Every written key should have been read by the transaction.
    pub fn commit(
        &mut self,
        now: u64,
        h: u64,
        mut writes: Vec<(Key, Option<Vec<u8>>)>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        if writes.is_empty() {
            // Read-only: every read was consistent at `rv` when it was made. Objects locked
            // for writes that did not happen are released.
            let (id, contacted) = (tx.id, std::mem::take(&mut tx.contacted));
            self.counters.commits += 1;
            self.coord.finish(h);
            self.release_locks(now, id, contacted, out);
            out.push(Output::Deliver(Answer {
                h,
                reply: Reply::Commit(Ok(())),
            }));
            return;
        }
        writes.sort_by(|a, b| a.0.cmp(&b.0));
        writes.dedup_by(|later, earlier| later.0 == earlier.0);
        let mut by_owner: BTreeMap<NodeId, Vec<(Key, Option<u64>)>> = BTreeMap::new();
        tx.taken.clear();
        for (key, _) in &writes {
            let (owner, version, locked) = match (tx.prelocked.get(key), tx.reads.get(key)) {
                (Some(p), _) => (p.owner, Some(p.version), true),
                (None, Some(r)) => (r.owner, Some(r.version), false),
                (None, None) => (self.coord.cache.ask(key, &self.dir), None, false),
            };
            if owner != self.me {
                let named = (key.clone(), version);
                tx.taken.entry(owner).or_default().push(named);
            }
            if !locked {
                let item = (key.clone(), version);
                by_owner.entry(owner).or_default().push(item);
            }
        }
        let id = tx.id;
        if let Some(local) = by_owner.remove(&self.me) {
            let locked = match self.lost_refusal(&local) {
                Some(lost) => Err(lost),
                None => self.owner.objects.try_lock(id, &local, now, self.cfg.lease),
            };
            match locked {
                Ok(()) => self.note_creations(&local, out),
                Err(Refusal::Invalid(key)) => return self.reopen(now, h, vec![key], out),
                Err(busy) => return self.fail(now, h, refusal_failure(&busy), out),
            }
        }
        let tx = self.coord.active.get_mut(&h).expect("checked above");
        tx.wait = Wait::Lock { writes };
        tx.contacted.extend(by_owner.keys().copied());
        for (owner, items) in by_owner {
            let key = items[0].0.clone();
            self.request(
                now,
                h,
                owner,
                key,
                |req| Body::Lock { req, tx: id, items },
                out,
            );
        }
        self.lock_progress(now, h, out);
    }

    /// Drops `keys` from transaction `h`'s reads (a nested block or checkpoint that read them
    /// rolls back after [`Failure::Stale`]); the transaction goes on with the rest.
    pub fn forget(&mut self, h: u64, keys: &[Key]) {
        if let Some(tx) = self.coord.active.get_mut(&h) {
            if matches!(tx.wait, Wait::Idle) {
                for k in keys {
                    tx.reads.remove(k);
                }
            }
        }
    }

    /// Abandons transaction `h` before commit (the application gave up): objects it locked
    /// when reading them for a write are released (their owners are told).
    pub fn abort(&mut self, now: u64, h: u64, out: &mut Vec<Action>) {
        if let Some(tx) = self.coord.active.get_mut(&h) {
            if matches!(
                tx.wait,
                Wait::Idle | Wait::Fetch { .. } | Wait::Forward { .. } | Wait::Abstract { .. }
            ) {
                let (id, contacted) = (tx.id, std::mem::take(&mut tx.contacted));
                self.coord.finish(h);
                self.release_locks(now, id, contacted, out);
            }
        }
    }

    pub(super) fn fetch_from(
        &mut self,
        now: u64,
        h: u64,
        key: Key,
        target: NodeId,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        let lock = matches!(tx.wait, Wait::Fetch { lock: true, .. }).then_some(tx.id);
        if target == self.me {
            let answer = match lock {
                Some(id) => self.lookup_locking(now, &key, id),
                None => self.lookup(&key),
            };
            let clock = self.clock.now();
            return self.fetched(now, h, self.me, clock, answer, out);
        }
        let k = key.clone();
        match lock {
            Some(tx_id) => {
                // It may lock whether or not its answer arrives: it must hear the decision.
                tx.contacted.insert(target);
                let body = |req| Body::FetchLock {
                    req,
                    tx: tx_id,
                    key: k,
                };
                self.request(now, h, target, key, body, out)
            }
            None => self.request(now, h, target, key, |req| Body::Fetch { req, key: k }, out),
        }
    }

    pub(super) fn fetched(
        &mut self,
        now: u64,
        h: u64,
        from: NodeId,
        sender_clock: u64,
        answer: FetchAnswer,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        let Wait::Fetch {
            key,
            hops,
            busy,
            lock,
        } = &tx.wait
        else {
            return;
        };
        let (key, hops, busy, lock) = (key.clone(), *hops, *busy, *lock);
        drop_requests(&mut self.coord.requests, &mut tx.outstanding);
        if from != self.me {
            self.counters.remote_reads += 1;
        }
        match answer {
            FetchAnswer::Busy if busy < self.cfg.busy_retries => {
                self.coord.note_contention(now, self.cfg.contention_quiet);
                // A commit is installing: its lock is short-lived, so ask again after the
                // busy delay rather than abort at once. A transaction never waits holding
                // locks (no cycle of waits can form): it gives them up first, and reads
                // without locking from then on.
                self.give_up_locks(now, h, out);
                let Some(tx) = self.coord.active.get_mut(&h) else {
                    return;
                };
                tx.wait = Wait::Fetch {
                    key: key.clone(),
                    hops,
                    busy: busy + 1,
                    lock: false,
                };
                let k = key.clone();
                tx.outstanding.insert(
                    BUSY_WAIT,
                    Outstanding {
                        to: from,
                        key,
                        body: Body::Fetch { req: 0, key: k },
                        sent: now,
                        deadline: now + self.cfg.busy_delay,
                    },
                );
            }
            FetchAnswer::Busy => {
                self.coord.note_contention(now, self.cfg.contention_quiet);
                self.counters.aborts_busy_read += 1;
                self.fail(now, h, Failure::Conflict(AbortCause::ReadLocked), out)
            }
            FetchAnswer::Lost(node) => self.fail(now, h, Failure::Lost { key, node }, out),
            FetchAnswer::Redirect(next) => {
                if hops >= self.cfg.max_hops {
                    // Owners that point at each other: a home that has not yet learned its
                    // object's owner restarted. Not a conflict to re-run at once.
                    self.counters.unavailable += 1;
                    return self.fail(now, h, Failure::Unavailable { key, node: next }, out);
                }
                self.counters.redirects += 1;
                self.coord.cache.learn(key.clone(), next);
                tx.wait = Wait::Fetch {
                    key: key.clone(),
                    hops: hops + 1,
                    busy,
                    lock,
                };
                self.fetch_from(now, h, key, next, out)
            }
            FetchAnswer::Found { value, version } => {
                if from != self.me {
                    self.coord.cache.learn(key.clone(), from);
                }
                if lock && value.is_some() {
                    // The owner locked it (a missing object is locked at commit). It may not be
                    // the node asked (the read was passed on): it must hear the decision too.
                    if from != self.me {
                        tx.contacted.insert(from);
                    }
                    let owner = from;
                    tx.prelocked
                        .insert(key.clone(), ReadInfo { version, owner });
                }
                if version <= tx.rv {
                    return self.deliver(now, h, key, value, version, from, None, out);
                }
                // Figure 5.1: forward to the owner's clock if everything read is still
                // current; a transaction that read nothing moves up at once.
                let to_clock = sender_clock.max(version);
                tx.wait = Wait::Forward {
                    key,
                    value,
                    version,
                    owner: from,
                    to_clock,
                };
                let items: Vec<(Key, ReadInfo)> =
                    tx.reads.iter().map(|(k, r)| (k.clone(), *r)).collect();
                self.validate_reads(now, h, items, out);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn deliver(
        &mut self,
        now: u64,
        h: u64,
        key: Key,
        value: Option<Vec<u8>>,
        version: u64,
        owner: NodeId,
        forward_to: Option<u64>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        if let Some(c) = forward_to {
            tx.rv = tx.rv.max(c);
            self.counters.forwards += 1;
        }
        if let Some(earlier) = tx.reads.insert(key, ReadInfo { version, owner }) {
            // Read again (after a nested block rolled back): it must not have changed.
            if earlier.version != version {
                self.counters.aborts_forward += 1;
                return self.fail(now, h, Failure::Conflict(AbortCause::ReadValidation), out);
            }
        }
        tx.wait = Wait::Idle;
        drop_requests(&mut self.coord.requests, &mut tx.outstanding);
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Read(Ok(value)),
        }));
    }

    /// Checks `items` at their owners: local ones now, remote ones by request; the outcome goes
    /// to `validated`.
    pub(super) fn validate_reads(
        &mut self,
        now: u64,
        h: u64,
        items: Vec<(Key, ReadInfo)>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get(&h) else {
            return;
        };
        let id = tx.id;
        let mut by_owner: BTreeMap<NodeId, Vec<(Key, u64)>> = BTreeMap::new();
        for (key, r) in items {
            if r.owner == self.me {
                if !self.owner.objects.validate(id, &key, r.version) {
                    return self.validated(now, h, vec![key], out);
                }
            } else {
                by_owner.entry(r.owner).or_default().push((key, r.version));
            }
        }
        for (owner, items) in by_owner {
            let key = items[0].0.clone();
            let body = |req| Body::Validate { req, tx: id, items };
            self.request(now, h, owner, key, body, out);
        }
        if self.coord.active[&h].outstanding.is_empty() {
            self.validated(now, h, Vec::new(), out);
        }
    }

    /// All validation answers are in (`invalid` empty: nothing changed), or one named reads
    /// that are no longer current. A failed forward leaves the transaction open: the
    /// application may drop the reads of a nested block or checkpoint that covers them
    /// ([`TfaNode::forget`]) and go on, or abort.
    pub(super) fn validated(&mut self, now: u64, h: u64, invalid: Vec<Key>, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        drop_requests(&mut self.coord.requests, &mut tx.outstanding);
        if !invalid.is_empty() {
            if matches!(tx.wait, Wait::Forward { .. }) {
                self.counters.aborts_forward += 1;
                tx.wait = Wait::Idle;
                out.push(Output::Deliver(Answer {
                    h,
                    reply: Reply::Read(Err(Failure::Stale(invalid))),
                }));
                return;
            }
            self.counters.aborts_validation += 1;
            return self.reopen(now, h, invalid, out);
        }
        match std::mem::replace(&mut tx.wait, Wait::Idle) {
            Wait::Forward {
                key,
                value,
                version,
                owner,
                to_clock,
            } => self.deliver(now, h, key, value, version, owner, Some(to_clock), out),
            Wait::Validate { writes } => self.decide_commit(now, h, writes, out),
            other => tx.wait = other,
        }
    }

    /// Called after each lock answer: once every owner granted, validate the other reads.
    pub(super) fn lock_progress(&mut self, now: u64, h: u64, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        if !tx.outstanding.is_empty() {
            return;
        }
        let Wait::Lock { writes } = std::mem::replace(&mut tx.wait, Wait::Idle) else {
            return;
        };
        let written: BTreeSet<&Key> = writes.iter().map(|(k, _)| k).collect();
        let items: Vec<(Key, ReadInfo)> = tx
            .reads
            .iter()
            .filter(|(k, _)| !written.contains(k))
            .map(|(k, r)| (k.clone(), *r))
            .collect();
        tx.wait = Wait::Validate { writes };
        self.validate_reads(now, h, items, out);
    }

    pub(super) fn decide_commit(
        &mut self,
        now: u64,
        h: u64,
        writes: Vec<(Key, Option<Vec<u8>>)>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.remove(&h) else {
            return;
        };
        self.coord.handles.remove(&tx.id);
        let version = self.clock.advance_for_commit();
        for (key, _) in &writes {
            if tx.reads.get(key).is_some_and(|r| r.owner != self.me) {
                self.counters.migrations_in += 1;
            }
        }
        // Objects locked here for writes that did not happen are released; the written
        // ones are replaced, unlocked.
        self.owner.objects.release(tx.id);
        self.owner.objects.install(tx.id, &writes, version);
        let decision = Decision::Commit { version };
        self.announce(now, tx.id, decision, tx.contacted, tx.taken, out);
        for (key, _) in writes {
            self.coord.cache.forget(&key);
            let home = self.dir.home(&key);
            if home == self.me {
                self.record_owner(key, self.me, self.incarnation, version, out);
            } else {
                self.owner.track_later(now, key, version, None);
            }
        }
        self.counters.commits += 1;
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Commit(Ok(())),
        }));
    }

    /// Ends transaction `h` with `failure`: locks it holds here are released, owners it asked
    /// for locks are told (until they confirm), and the application gets the failure.
    pub(super) fn fail(&mut self, now: u64, h: u64, failure: Failure, out: &mut Vec<Action>) {
        let Some(mut tx) = self.coord.take(h) else {
            return;
        };
        self.release_locks(now, tx.id, std::mem::take(&mut tx.contacted), out);
        if matches!(failure, Failure::Unavailable { .. }) {
            self.counters.unavailable += 1;
        }
        let reply = if matches!(tx.wait, Wait::Fetch { .. } | Wait::Forward { .. }) {
            Reply::Read(Err(failure))
        } else {
            Reply::Commit(Err(failure))
        };
        out.push(Output::Deliver(Answer { h, reply }));
    }

    /// Transaction `h` is about to wait for a lock, or an owner asked about a lock it took with
    /// a read long ago: if it holds locks taken with reads, it gives them up and goes on under
    /// a new number (so that a late release of the old one never touches the new one's
    /// locks), its reads kept, their versions checked at commit as plain reads are; it takes no
    /// more locks with reads. Must not be called while a read that may lock is in flight (its
    /// lock would be granted to the old number). Returns whether it held any.
    pub(super) fn give_up_locks(&mut self, now: u64, h: u64, out: &mut Vec<Action>) -> bool {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return false;
        };
        tx.lock_reads = false;
        if tx.prelocked.is_empty() {
            return false;
        }
        self.counters.locks_given_up += 1;
        self.renumber(now, h, out);
        true
    }

    /// Where transaction `tx` of this node stands, for an owner holding its locks past the
    /// lease.
    pub(super) fn standing(&self, tx: TxId) -> Standing {
        let Some(&h) = self.coord.handles.get(&tx) else {
            return Standing::Gone;
        };
        match self.coord.active.get(&h).map(|a| &a.wait) {
            None => Standing::Gone,
            Some(Wait::Fetch { lock: true, .. }) => Standing::Locking,
            Some(Wait::Lock { .. } | Wait::Validate { .. }) => Standing::Committing(h),
            Some(
                Wait::Idle
                | Wait::Abstract { .. }
                | Wait::Forward { .. }
                | Wait::Fetch { lock: false, .. },
            ) => Standing::Working(h),
        }
    }

    /// An owner asked about transaction `h`, which still runs, and is answered "abort": `h`
    /// gives its locks up ([`TfaNode::give_up_locks`]) and goes on under a new number even if
    /// it knows of no lock there (a late duplicate of one of its reads for writes may have
    /// taken it), so that the abort releases nothing the transaction locks later.
    pub(super) fn give_up_number(&mut self, now: u64, h: u64, out: &mut Vec<Action>) {
        if !self.give_up_locks(now, h, out) {
            self.renumber(now, h, out);
        }
    }

    /// Transaction `h` goes on under a new number, holding no locks: those of the old number
    /// are released (here, and by the owners it asked, who are told), so a late release of the
    /// old number never touches the new one's. Its reads stay.
    fn renumber(&mut self, now: u64, h: u64, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        let old = tx.id;
        tx.id = TxId {
            node: self.me,
            n: self.coord.next_tx,
        };
        self.coord.next_tx += 1;
        let contacted = std::mem::take(&mut tx.contacted);
        // The locks go with the old number: reads made for writes are plain reads now.
        tx.prelocked.clear();
        tx.taken.clear();
        self.coord.handles.remove(&old);
        self.coord.handles.insert(tx.id, h);
        self.release_locks(now, old, contacted, out);
    }

    /// A commit found reads that are no longer current (`keys`): its locks are released (the
    /// owners it asked are told), and the transaction stays open under a new number with its
    /// reads, answering `Reply::Commit(Err(Failure::Stale(keys)))`. The application drops the
    /// reads of the checkpoint that covers them and commits again, or aborts. (A new number, so
    /// that a late "abort" for the first attempt never releases the second's locks.)
    pub(super) fn reopen(&mut self, now: u64, h: u64, keys: Vec<Key>, out: &mut Vec<Action>) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        drop_requests(&mut self.coord.requests, &mut tx.outstanding);
        tx.wait = Wait::Idle;
        self.renumber(now, h, out);
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Commit(Err(Failure::Stale(keys))),
        }));
    }
}
