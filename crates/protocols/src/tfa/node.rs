//! One TFA node as a deterministic state machine: the owner of some objects, the home (tracker)
//! of some keys, and the coordinator of the transactions its application runs.
//!
//! Inputs are method calls with the current time in ticks (`begin`, `read`, `commit`, `abort`
//! from the application; `on_message` from the network; `tick` from a timer); outputs are
//! [`Action`]s appended to a vector: messages to send, answers to the application, warnings.
//! Nothing here reads a clock, a socket or a random source.
//!
//! The transaction path (thesis figures 5.1 and 5.2):
//! - A transaction starts at its node's clock (`rv`). A read goes to the owner (cached, else the
//!   key's home, which knows it; redirects correct the cache). An answer whose version is newer
//!   than `rv` forwards the transaction: the read set is validated at its owners and `rv`
//!   moves up to the owner's clock, or the transaction aborts. Reads of versions at most `rv`
//!   need no check: every owner that served a read has seen the reader's clock, so later
//!   writes of what was read get larger versions.
//! - Commit locks the write set at its owners (each owner all-or-nothing and without waiting,
//!   so no deadlock whatever the order), then validates the other reads, then advances the
//!   clock, installs the writes here (the committer becomes their owner), tells the old owners
//!   (`Decided`), which hand the objects over, and tells each key's home (`Track`).
//! - A lock is held until the owner hears the decision; an owner asks a silent committer
//!   (`Ask`) after the lease; a committer asked about an undecided transaction aborts it; one
//!   that never answers loses its locks after the abandon time.
//! - Requests are re-sent until answered; one unanswered for the request timeout fails the
//!   transaction with the unreachable node and key.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap as HashMap;

use atomos_core::{AbortCause, Key};

use atomos_seam::Output;

use super::clock::NodeClock;
use super::directory::{Directory, HashDirectory, NodeId, OwnerCache, Tracker};
use super::msg::{Body, Decision, FetchAnswer, TfaMsg};
use super::owner::{OwnedObjects, Refusal, TxId};

/// Timing of a node, in ticks.
#[derive(Clone, Debug)]
pub struct TfaConfig {
    /// A lock held this long without a decision makes its owner ask the committer.
    pub lease: u64,
    /// A lock whose committer has not answered for this long is released (the committer is
    /// presumed gone). Must be longer than any partition the deployment expects to heal.
    pub abandon: u64,
    /// Unanswered requests and unconfirmed decisions are re-sent this often.
    pub resend: u64,
    /// A request unanswered this long fails its transaction (the node is unreachable).
    pub request_timeout: u64,
    /// Redirects followed by one read before it gives up (the object is moving).
    pub max_hops: u32,
    /// A read that finds the object locked asks again after this long ...
    pub busy_delay: u64,
    /// ... this many times, then aborts its transaction.
    pub busy_retries: u32,
}

impl Default for TfaConfig {
    /// For ticks of 1 ms: lease 0.5 s, abandon 30 s, re-send 0.2 s, request timeout 2 s; a
    /// locked object is asked again on the next tick, three times.
    fn default() -> TfaConfig {
        TfaConfig {
            lease: 500,
            abandon: 30_000,
            resend: 200,
            request_timeout: 2_000,
            max_hops: 16,
            busy_delay: 1,
            busy_retries: 3,
        }
    }
}

/// Why a transaction failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A conflict: re-run the transaction.
    Conflict(AbortCause),
    /// Forwarding or commit-time validation found these reads no longer current. The
    /// transaction is still open (holding no locks): drop the reads of whatever part of it
    /// covers them ([`TfaNode::forget`]) and go on, or abort it.
    Stale(Vec<Key>),
    /// A node did not answer in time about `key`; if it crashed, the objects it owned are lost.
    Unavailable {
        /// The object the request was about.
        key: Key,
        /// The node that did not answer.
        node: NodeId,
    },
}

/// An answer to the application, for the transaction with handle `h`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// An abstract lock: taken now (`true`), already the family's (`false`), or held by
    /// another family (`Failure::Conflict(AbortCause::AbstractLock)`).
    Abstract(Result<bool, Failure>),
    /// The committed value read (`None`: the object does not exist).
    Read(Result<Option<Vec<u8>>, Failure>),
    /// The transaction committed, or failed (and then nothing it wrote is visible).
    Commit(Result<(), Failure>),
}

/// An answer to the application's transaction `h`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The handle the application chose at `begin`.
    pub h: u64,
    /// The answer.
    pub reply: Reply,
}

/// What the node asks its driver to do: send messages, answer the application (a
/// [`Answer`] delivered), warn an operator (a lock released without a decision). TFA keeps
/// nothing on disk, so it never persists.
pub type Action = Output<TfaMsg, Answer>;

/// Counters of a node since it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TfaCounters {
    /// Transactions committed, read-only ones included.
    pub commits: u64,
    /// Aborts because a read met a locked object.
    pub aborts_busy_read: u64,
    /// Aborts because the read set was invalid when forwarding.
    pub aborts_forward: u64,
    /// Aborts because a lock was busy at commit.
    pub aborts_lock_busy: u64,
    /// Aborts because validation failed at commit.
    pub aborts_validation: u64,
    /// Transactions failed because a node did not answer.
    pub unavailable: u64,
    /// Reads answered by another node.
    pub remote_reads: u64,
    /// Forwardings that succeeded.
    pub forwards: u64,
    /// Objects that moved here from another owner.
    pub migrations_in: u64,
    /// Locks released without hearing a decision (the committer was presumed gone).
    pub abandoned_locks: u64,
}

/// The outstanding entry of a read waiting to ask again after a "locked" answer.
const BUSY_WAIT: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
struct ReadInfo {
    version: u64,
    owner: NodeId,
}

/// A request in flight: re-sent until answered, failing its transaction at the deadline.
#[derive(Clone, Debug)]
struct Outstanding {
    to: NodeId,
    key: Key,
    body: Body,
    sent: u64,
    deadline: u64,
}

#[derive(Debug)]
enum Wait {
    Idle,
    /// A read is asking for `key` (after `hops` redirects and `busy` answers "locked").
    Fetch {
        key: Key,
        hops: u32,
        busy: u32,
    },
    /// A read found a newer version; the read set is being validated before forwarding.
    Forward {
        key: Key,
        value: Option<Vec<u8>>,
        version: u64,
        owner: NodeId,
        to_clock: u64,
    },
    /// Commit: locks requested.
    Lock {
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// Commit: locks held, the other reads being validated.
    Validate {
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// An abstract lock asked of its home.
    Abstract,
}

/// An abstract lock held at its home.
struct AbstractHold {
    /// The holding family: its node and its number there.
    holder: (NodeId, u64),
    since: u64,
    ask_at: u64,
}

struct Active {
    id: TxId,
    rv: u64,
    reads: BTreeMap<Key, ReadInfo>,
    wait: Wait,
    /// Requests of the current step, by request number.
    outstanding: BTreeMap<u64, Outstanding>,
    /// Owners asked for locks (they must hear the decision).
    contacted: BTreeSet<NodeId>,
}

/// A decision the committer repeats until every owner confirmed it.
struct Pending {
    decision: Decision,
    waiting: BTreeSet<NodeId>,
    sent: u64,
    since: u64,
}

/// A `Track` the home has not confirmed.
struct Tracking {
    version: u64,
    /// When it was last sent (`None`: not yet).
    sent: Option<u64>,
    since: u64,
}

/// Confirmations owed to one node, sent together on the next tick.
#[derive(Default)]
struct Acks {
    done: Vec<TxId>,
    tracked: Vec<(Key, u64)>,
}

/// One TFA node.
pub struct TfaNode {
    me: NodeId,
    cfg: TfaConfig,
    dir: HashDirectory,
    clock: NodeClock,
    objects: OwnedObjects,
    tracker: Tracker,
    cache: OwnerCache,
    /// Running transactions by the application's handle.
    active: BTreeMap<u64, Active>,
    /// Which handle each request number belongs to.
    requests: HashMap<u64, u64>,
    /// The handle of each running transaction.
    handles: HashMap<TxId, u64>,
    decided: BTreeMap<TxId, Pending>,
    tracking: BTreeMap<Key, Tracking>,
    acks: BTreeMap<NodeId, Acks>,
    /// Abstract locks this node is home to.
    abstract_held: BTreeMap<String, AbstractHold>,
    /// Families of this node that may hold abstract locks (until they release them).
    families: BTreeSet<u64>,
    incarnation: u64,
    next_tx: u64,
    next_req: u64,
    counters: TfaCounters,
}

impl TfaNode {
    /// Node `me` of `members` (which must contain it). `incarnation` must grow each time the
    /// node restarts (a start time will do): transaction numbers of different runs never meet.
    pub fn new(
        me: NodeId,
        members: Vec<NodeId>,
        incarnation: u64,
        cfg: TfaConfig,
    ) -> Option<TfaNode> {
        if !members.contains(&me) {
            return None;
        }
        Some(TfaNode {
            me,
            cfg,
            dir: HashDirectory::new(members)?,
            clock: NodeClock::new(0),
            objects: OwnedObjects::new(),
            tracker: Tracker::new(),
            cache: OwnerCache::new(),
            active: BTreeMap::new(),
            requests: HashMap::default(),
            handles: HashMap::default(),
            decided: BTreeMap::new(),
            tracking: BTreeMap::new(),
            acks: BTreeMap::new(),
            abstract_held: BTreeMap::new(),
            families: BTreeSet::new(),
            incarnation,
            next_tx: incarnation << 32,
            next_req: 0,
            counters: TfaCounters::default(),
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// The node's clock.
    pub fn clock(&self) -> u64 {
        self.clock.now()
    }

    /// The objects this node owns.
    pub fn objects(&self) -> &OwnedObjects {
        &self.objects
    }

    /// The home of `key`.
    pub fn home(&self, key: &Key) -> NodeId {
        self.dir.home(key)
    }

    /// Counters since the node started.
    pub fn counters(&self) -> &TfaCounters {
        &self.counters
    }

    /// Transactions running, decisions not yet confirmed by every owner, and directory updates
    /// not yet confirmed by their home.
    pub fn in_flight(&self) -> (usize, usize, usize) {
        (self.active.len(), self.decided.len(), self.tracking.len())
    }

    /// Requests sent and waiting for their answer (every one belongs to a running transaction).
    pub fn pending_requests(&self) -> usize {
        self.requests.len()
    }

    /// One line per running transaction: its number, snapshot and what it waits for.
    pub fn describe_active(&self) -> Vec<String> {
        self.active
            .iter()
            .map(|(h, t)| {
                format!(
                    "h={h} tx={}:{} rv={} reads={} wait={:?} outstanding={:?}",
                    t.id.node,
                    t.id.n,
                    t.rv,
                    t.reads.len(),
                    t.wait,
                    t.outstanding
                )
            })
            .collect()
    }

    /// What this node knows about `key`: its copy, where it went, its tracker record (at the
    /// home) and the cached owner.
    pub fn describe_key(&self, key: &Key) -> String {
        format!(
            "node {}: held {:?}, moved to {:?}, tracker {:?}, home {}",
            self.me,
            self.objects.get(key).map(|h| (h.version, h.locked_by)),
            self.objects.moved_to(key),
            self.tracker.owner(key),
            self.dir.home(key),
        )
    }

    fn send(&self, to: NodeId, body: Body, out: &mut Vec<Action>) {
        out.push(Output::Send {
            to,
            msg: TfaMsg {
                clock: self.clock.now(),
                body,
            },
        });
    }

    // ----- the application's side -----

    /// Starts transaction `h` (a handle the caller picks, unique among running ones) at the
    /// node's clock.
    pub fn begin(&mut self, h: u64) {
        let id = TxId {
            node: self.me,
            n: self.next_tx,
        };
        self.next_tx += 1;
        self.handles.insert(id, h);
        self.active.insert(
            h,
            Active {
                id,
                rv: self.clock.now(),
                reads: BTreeMap::new(),
                wait: Wait::Idle,
                outstanding: BTreeMap::new(),
                contacted: BTreeSet::new(),
            },
        );
    }

    /// Reads `key` for transaction `h`; the answer is a [`Reply::Read`] (at once when this node
    /// owns the object). A failed read ends the transaction.
    pub fn read(&mut self, now: u64, h: u64, key: Key, out: &mut Vec<Action>) {
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        let target = self.cache.ask(&key, &self.dir);
        tx.wait = Wait::Fetch {
            key: key.clone(),
            hops: 0,
            busy: 0,
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
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        if writes.is_empty() {
            // Read-only: every read was consistent at `rv` when it was made.
            self.counters.commits += 1;
            self.finish(h);
            out.push(Output::Deliver(Answer {
                h,
                reply: Reply::Commit(Ok(())),
            }));
            return;
        }
        writes.sort_by(|a, b| a.0.cmp(&b.0));
        writes.dedup_by(|later, earlier| later.0 == earlier.0);
        let mut by_owner: BTreeMap<NodeId, Vec<(Key, Option<u64>)>> = BTreeMap::new();
        for (key, _) in &writes {
            let (owner, version) = match tx.reads.get(key) {
                Some(r) => (r.owner, Some(r.version)),
                None => (self.cache.ask(key, &self.dir), None),
            };
            by_owner
                .entry(owner)
                .or_default()
                .push((key.clone(), version));
        }
        let id = tx.id;
        if let Some(local) = by_owner.remove(&self.me) {
            match self.objects.try_lock(id, &local, now, self.cfg.lease) {
                Ok(()) => {}
                Err(Refusal::Invalid(key)) => return self.reopen(now, h, vec![key], out),
                Err(busy) => return self.fail(now, h, refusal_failure(&busy), out),
            }
        }
        let tx = self.active.get_mut(&h).expect("checked above");
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
        if let Some(tx) = self.active.get_mut(&h) {
            if matches!(tx.wait, Wait::Idle) {
                for k in keys {
                    tx.reads.remove(k);
                }
            }
        }
    }

    // ----- abstract locks (open nesting) -----

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
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        self.families.insert(family);
        let key = Key::from(name.as_str());
        let home = self.dir.home(&key);
        if home == self.me {
            let granted = self.grant_abstract(now, (self.me, family), name);
            return self.abstract_answer(h, granted, out);
        }
        tx.wait = Wait::Abstract;
        let body = |req| Body::AbstractLock { req, family, name };
        self.request(now, h, home, key, body, out);
    }

    /// `family` ended: its abstract locks are released (on their homes, by message).
    pub fn release_abstract(&mut self, family: u64, names: Vec<String>, out: &mut Vec<Action>) {
        let family = self.family_id(family);
        self.families.remove(&family);
        let mut by_home: BTreeMap<NodeId, Vec<String>> = BTreeMap::new();
        for name in names {
            by_home
                .entry(self.dir.home(&Key::from(name.as_str())))
                .or_default()
                .push(name);
        }
        for (home, names) in by_home {
            if home == self.me {
                self.free_abstract((self.me, family), &names);
            } else {
                self.send(home, Body::AbstractRelease { family, names }, out);
            }
        }
    }

    /// How many abstract locks this node is home to and holds right now.
    pub fn abstract_locks_held(&self) -> usize {
        self.abstract_held.len()
    }

    fn grant_abstract(&mut self, now: u64, holder: (NodeId, u64), name: String) -> Option<bool> {
        match self.abstract_held.get(&name) {
            Some(hold) if hold.holder == holder => Some(false),
            Some(_) => None,
            None => {
                self.abstract_held.insert(
                    name,
                    AbstractHold {
                        holder,
                        since: now,
                        ask_at: now + self.cfg.lease,
                    },
                );
                Some(true)
            }
        }
    }

    fn free_abstract(&mut self, holder: (NodeId, u64), names: &[String]) {
        for name in names {
            if self
                .abstract_held
                .get(name)
                .is_some_and(|hold| hold.holder == holder)
            {
                self.abstract_held.remove(name);
            }
        }
    }

    /// The application's family number made unique across this node's restarts (the
    /// application may number families from 1 again after a restart).
    fn family_id(&self, family: u64) -> u64 {
        (self.incarnation << 40) ^ family
    }

    fn free_abstract_of(&mut self, holder: (NodeId, u64)) {
        self.abstract_held.retain(|_, hold| hold.holder != holder);
    }

    fn abstract_answer(&mut self, h: u64, granted: Option<bool>, out: &mut Vec<Action>) {
        if let Some(tx) = self.active.get_mut(&h) {
            tx.wait = Wait::Idle;
        }
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Abstract(granted.ok_or(Failure::Conflict(AbortCause::AbstractLock))),
        }));
    }

    /// Abandons transaction `h` before commit (the application gave up). It holds no lock
    /// before commit, so nothing needs to be told.
    pub fn abort(&mut self, h: u64) {
        if let Some(tx) = self.active.get(&h) {
            if matches!(
                tx.wait,
                Wait::Idle | Wait::Fetch { .. } | Wait::Forward { .. } | Wait::Abstract
            ) {
                self.finish(h);
            }
        }
    }

    // ----- reads -----

    fn fetch_from(&mut self, now: u64, h: u64, key: Key, target: NodeId, out: &mut Vec<Action>) {
        if target == self.me {
            let answer = self.lookup(&key);
            let clock = self.clock.now();
            return self.fetched(now, h, self.me, clock, answer, out);
        }
        let k = key.clone();
        self.request(now, h, target, key, |req| Body::Fetch { req, key: k }, out);
    }

    /// Sends the request `body(req)` for transaction `h` and keeps it until answered.
    fn request(
        &mut self,
        now: u64,
        h: u64,
        to: NodeId,
        key: Key,
        body: impl FnOnce(u64) -> Body,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        let req = self.next_req;
        self.next_req += 1;
        self.requests.insert(req, h);
        let body = body(req);
        tx.outstanding.insert(
            req,
            Outstanding {
                to,
                key,
                body: body.clone(),
                sent: now,
                deadline: now + self.cfg.request_timeout,
            },
        );
        self.send(to, body, out);
    }

    /// What this node answers about `key` (to a `Fetch`, or to a read of its own).
    fn lookup(&mut self, key: &Key) -> FetchAnswer {
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

    fn fetched(
        &mut self,
        now: u64,
        h: u64,
        from: NodeId,
        sender_clock: u64,
        answer: FetchAnswer,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        let Wait::Fetch { key, hops, busy } = &tx.wait else {
            return;
        };
        let (key, hops, busy) = (key.clone(), *hops, *busy);
        // Answers still due to the requests dropped here are ignored.
        for req in std::mem::take(&mut tx.outstanding).into_keys() {
            self.requests.remove(&req);
        }
        if from != self.me {
            self.counters.remote_reads += 1;
        }
        match answer {
            FetchAnswer::Busy if busy < self.cfg.busy_retries => {
                // A commit is installing: its lock is short-lived, so ask again after the
                // busy delay rather than abort at once.
                tx.wait = Wait::Fetch {
                    key: key.clone(),
                    hops,
                    busy: busy + 1,
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
                self.counters.aborts_busy_read += 1;
                self.fail(now, h, Failure::Conflict(AbortCause::ReadLocked), out)
            }
            FetchAnswer::Redirect(next) => {
                if hops >= self.cfg.max_hops {
                    self.counters.aborts_busy_read += 1;
                    return self.fail(now, h, Failure::Conflict(AbortCause::ReadLocked), out);
                }
                self.cache.learn(key.clone(), next);
                tx.wait = Wait::Fetch {
                    key: key.clone(),
                    hops: hops + 1,
                    busy,
                };
                self.fetch_from(now, h, key, next, out)
            }
            FetchAnswer::Found { value, version } => {
                if from != self.me {
                    self.cache.learn(key.clone(), from);
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
    fn deliver(
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
        let Some(tx) = self.active.get_mut(&h) else {
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
        // Answers still due to the requests dropped here are ignored.
        for req in std::mem::take(&mut tx.outstanding).into_keys() {
            self.requests.remove(&req);
        }
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Read(Ok(value)),
        }));
    }

    // ----- validation (forwarding and commit) -----

    /// Checks `items` at their owners: local ones now, remote ones by request; the outcome goes
    /// to `validated`.
    fn validate_reads(
        &mut self,
        now: u64,
        h: u64,
        items: Vec<(Key, ReadInfo)>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.active.get(&h) else {
            return;
        };
        let id = tx.id;
        let mut by_owner: BTreeMap<NodeId, Vec<(Key, u64)>> = BTreeMap::new();
        for (key, r) in items {
            if r.owner == self.me {
                if !self.objects.validate(id, &key, r.version) {
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
        if self.active[&h].outstanding.is_empty() {
            self.validated(now, h, Vec::new(), out);
        }
    }

    /// All validation answers are in (`invalid` empty: nothing changed), or one named reads
    /// that are no longer current. A failed forward leaves the transaction open: the
    /// application may drop the reads of a nested block or checkpoint that covers them
    /// ([`TfaNode::forget`]) and go on, or abort.
    fn validated(&mut self, now: u64, h: u64, invalid: Vec<Key>, out: &mut Vec<Action>) {
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        // Answers still due to the requests dropped here are ignored.
        for req in std::mem::take(&mut tx.outstanding).into_keys() {
            self.requests.remove(&req);
        }
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

    // ----- commit -----

    /// Called after each lock answer: once every owner granted, validate the other reads.
    fn lock_progress(&mut self, now: u64, h: u64, out: &mut Vec<Action>) {
        let Some(tx) = self.active.get_mut(&h) else {
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

    fn decide_commit(
        &mut self,
        now: u64,
        h: u64,
        writes: Vec<(Key, Option<Vec<u8>>)>,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.active.remove(&h) else {
            return;
        };
        self.handles.remove(&tx.id);
        let version = self.clock.advance_for_commit();
        for (key, _) in &writes {
            if tx.reads.get(key).is_some_and(|r| r.owner != self.me) {
                self.counters.migrations_in += 1;
            }
        }
        self.objects.install(tx.id, &writes, version);
        if !tx.contacted.is_empty() {
            let decision = Decision::Commit { version };
            for &owner in &tx.contacted {
                self.send(
                    owner,
                    Body::Decided {
                        tx: tx.id,
                        decision,
                    },
                    out,
                );
            }
            self.decided.insert(
                tx.id,
                Pending {
                    decision,
                    waiting: tx.contacted.clone(),
                    sent: now,
                    since: now,
                },
            );
        }
        for (key, _) in writes {
            self.cache.forget(&key);
            let home = self.dir.home(&key);
            if home == self.me {
                self.tracker.update(key, self.me, version);
            } else {
                // Sent with the next timer tick, batched per home.
                self.tracking.insert(
                    key,
                    Tracking {
                        version,
                        sent: None,
                        since: now,
                    },
                );
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
    fn fail(&mut self, now: u64, h: u64, failure: Failure, out: &mut Vec<Action>) {
        let Some(tx) = self.active.remove(&h) else {
            return;
        };
        for req in tx.outstanding.keys() {
            self.requests.remove(req);
        }
        self.handles.remove(&tx.id);
        self.objects.release(tx.id);
        if !tx.contacted.is_empty() {
            for &owner in &tx.contacted {
                self.send(
                    owner,
                    Body::Decided {
                        tx: tx.id,
                        decision: Decision::Abort,
                    },
                    out,
                );
            }
            self.decided.insert(
                tx.id,
                Pending {
                    decision: Decision::Abort,
                    waiting: tx.contacted,
                    sent: now,
                    since: now,
                },
            );
        }
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

    /// A commit found reads that are no longer current (`keys`): its locks are released (the
    /// owners it asked are told), and the transaction stays open under a new number with its
    /// reads, answering `Reply::Commit(Err(Failure::Stale(keys)))`. The application drops the
    /// reads of the checkpoint that covers them and commits again, or aborts. (A new number, so
    /// that a late "abort" for the first attempt never releases the second's locks.)
    fn reopen(&mut self, now: u64, h: u64, keys: Vec<Key>, out: &mut Vec<Action>) {
        let Some(tx) = self.active.get_mut(&h) else {
            return;
        };
        for req in std::mem::take(&mut tx.outstanding).into_keys() {
            self.requests.remove(&req);
        }
        let old = tx.id;
        tx.id = TxId {
            node: self.me,
            n: self.next_tx,
        };
        self.next_tx += 1;
        tx.wait = Wait::Idle;
        let contacted = std::mem::take(&mut tx.contacted);
        self.handles.remove(&old);
        self.handles.insert(tx.id, h);
        self.objects.release(old);
        if !contacted.is_empty() {
            for &owner in &contacted {
                let decision = Decision::Abort;
                self.send(owner, Body::Decided { tx: old, decision }, out);
            }
            self.decided.insert(
                old,
                Pending {
                    decision: Decision::Abort,
                    waiting: contacted,
                    sent: now,
                    since: now,
                },
            );
        }
        out.push(Output::Deliver(Answer {
            h,
            reply: Reply::Commit(Err(Failure::Stale(keys))),
        }));
    }

    fn finish(&mut self, h: u64) {
        if let Some(tx) = self.active.remove(&h) {
            for req in tx.outstanding.keys() {
                self.requests.remove(req);
            }
            self.handles.remove(&tx.id);
        }
    }

    // ----- the network's side -----

    /// Handles a message from node `from`.
    pub fn on_message(&mut self, now: u64, from: NodeId, msg: TfaMsg, out: &mut Vec<Action>) {
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

    /// The request `req` was answered: removes it and returns its transaction's handle if the
    /// transaction still waits for it.
    fn take_request(&mut self, req: u64) -> Option<u64> {
        let h = self.requests.remove(&req)?;
        let tx = self.active.get_mut(&h)?;
        tx.outstanding.remove(&req)?;
        Some(h)
    }

    fn apply_decision(&mut self, tx: TxId, decision: Decision) {
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

    /// Time passes: re-sends what is unanswered, fails transactions whose requests timed out,
    /// and asks committers about locks past their lease.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Action>) {
        let mut expired = Vec::new();
        let mut resend = Vec::new();
        let mut refetch = Vec::new();
        for (&h, tx) in &mut self.active {
            if let Some(o) = tx.outstanding.get(&BUSY_WAIT) {
                if now >= o.deadline {
                    refetch.push((h, o.key.clone(), o.to));
                }
                continue;
            }
            for o in tx.outstanding.values_mut() {
                if now >= o.deadline {
                    expired.push((
                        h,
                        Failure::Unavailable {
                            key: o.key.clone(),
                            node: o.to,
                        },
                    ));
                    break;
                }
                if now >= o.sent + self.cfg.resend {
                    o.sent = now;
                    resend.push((o.to, o.body.clone()));
                }
            }
        }
        expired.sort_by_key(|(h, _)| *h);
        for (to, body) in resend {
            self.send(to, body, out);
        }
        for (h, failure) in expired {
            self.fail(now, h, failure, out);
        }
        for (h, key, to) in refetch {
            if let Some(tx) = self.active.get_mut(&h) {
                tx.outstanding.remove(&BUSY_WAIT);
            }
            self.fetch_from(now, h, key, to, out);
        }
        let mut gone = Vec::new();
        let mut repeat = Vec::new();
        for (tx, p) in &mut self.decided {
            if now >= p.since + self.cfg.abandon {
                gone.push(*tx);
            } else if now >= p.sent + self.cfg.resend {
                p.sent = now;
                for &owner in &p.waiting {
                    repeat.push((
                        owner,
                        Body::Decided {
                            tx: *tx,
                            decision: p.decision,
                        },
                    ));
                }
            }
        }
        for tx in gone {
            self.decided.remove(&tx);
        }
        repeat.sort_by_key(|(to, _)| *to);
        for (to, body) in repeat {
            self.send(to, body, out);
        }
        let mut tracks: BTreeMap<NodeId, Vec<(Key, u64)>> = BTreeMap::new();
        let (dir, resend, abandon) = (&self.dir, self.cfg.resend, self.cfg.abandon);
        self.tracking.retain(|key, t| {
            if now >= t.since + abandon {
                return false;
            }
            if t.sent.is_none_or(|s| now >= s + resend) {
                t.sent = Some(now);
                tracks
                    .entry(dir.home(key))
                    .or_default()
                    .push((key.clone(), t.version));
            }
            true
        });
        for (home, entries) in tracks {
            self.send(home, Body::Track { entries }, out);
        }
        for (to, acks) in std::mem::take(&mut self.acks) {
            if !acks.done.is_empty() {
                self.send(to, Body::Done { txs: acks.done }, out);
            }
            if !acks.tracked.is_empty() {
                self.send(
                    to,
                    Body::Tracked {
                        entries: acks.tracked,
                    },
                    out,
                );
            }
        }
        let mut ask: BTreeSet<(NodeId, u64)> = BTreeSet::new();
        let mut gone: BTreeSet<(NodeId, u64)> = BTreeSet::new();
        for hold in self.abstract_held.values_mut() {
            if hold.ask_at <= now {
                hold.ask_at = now + self.cfg.lease;
                if now >= hold.since + self.cfg.abandon {
                    gone.insert(hold.holder);
                } else {
                    ask.insert(hold.holder);
                }
            }
        }
        for holder in gone {
            self.free_abstract_of(holder);
            out.push(Output::Warn(format!(
                "released the abstract locks of family {} of node {} after no answer",
                holder.1, holder.0
            )));
        }
        for (node, family) in ask {
            if node == self.me {
                if !self.families.contains(&family) {
                    self.free_abstract_of((node, family));
                }
            } else {
                self.send(node, Body::FamilyAlive { family }, out);
            }
        }
        for (tx, held_for) in self.objects.overdue(now, self.cfg.lease) {
            if tx.node == self.me {
                // Our own transaction: it resolves its locks itself (decision or timeout).
                continue;
            }
            if held_for >= self.cfg.abandon {
                let n = self.objects.release(tx);
                self.counters.abandoned_locks += n as u64;
                out.push(Output::Warn(format!(
                    "released {n} locks of transaction {}:{} after {held_for} ticks without \
                     hearing from node {}",
                    tx.node, tx.n, tx.node
                )));
            } else {
                self.send(tx.node, Body::Ask { tx }, out);
            }
        }
    }
}

fn refusal_failure(r: &Refusal) -> Failure {
    match r {
        Refusal::Busy(_) => Failure::Conflict(AbortCause::LockConflict),
        Refusal::Invalid(_) => Failure::Conflict(AbortCause::CommitValidation),
    }
}
