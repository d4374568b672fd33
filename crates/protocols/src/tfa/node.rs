//! One TFA node as a deterministic state machine: the owner of some objects, the home (tracker)
//! of some keys, and the coordinator of the transactions its application runs. Each role's state
//! is a struct of its own (`roles`: `Coordinator`, `Owner`, `Home`); this file holds the node
//! that joins them and what the roles share (identity, clock, peers, the acknowledgements
//! owed). The steps are in a file per job: `coordinator` (the application's transactions),
//! `server` (answering as owner and home), `abstract_locks` (open nesting), `timers` (what
//! happens as time passes), `recovery` (the log).
//!
//! Inputs are method calls with the current time in ticks (`begin`, `read`, `commit`, `abort`
//! from the application; `on_message` from the network; `tick` from a timer), or the same
//! through the protocol seam ([`atomos_seam::Machine`], requests as
//! [`super::TfaRequest`]); outputs are [`Action`]s appended to a vector: messages to send,
//! answers to the application, warnings. Nothing here reads a clock, a socket or a random
//! source.
//!
//! The transaction path (thesis figures 5.1 and 5.2):
//! - A transaction starts at its node's clock (`rv`). A read goes to the owner (cached, else the
//!   key's home, which knows it; redirects correct the cache). An answer whose version is newer
//!   than `rv` forwards the transaction: the read set is validated at its owners and `rv`
//!   moves up to the owner's clock, or the transaction aborts. Reads of versions at most `rv`
//!   need no check: every owner that served a read has seen the reader's clock, so later
//!   writes of what was read get larger versions.
//! - A read made for a write (`read_for_write`: the transaction's first access to the object
//!   is a write) takes the object's commit lock with the copy, so the commit need not ask for
//!   it. A transaction never waits holding such locks: before it waits for a locked object it
//!   gives its locks up (under a new number) and goes on as one that took none, so no cycle of
//!   waits forms.
//! - Commit locks the rest of the write set at its owners (each owner all-or-nothing and
//!   without waiting, so no deadlock whatever the order), then validates the other reads, then
//!   advances the clock, installs the writes here (the committer becomes their owner), tells
//!   the old owners (`Decided`, naming the objects written at the versions read), which hand
//!   those objects over and release the transaction's other locks, and tells each key's home
//!   (`Track`). A transaction that ends otherwise releases every lock it took.
//! - A lock is held until the owner hears the decision; an owner asks a silent committer
//!   (`Ask`) after the lease; a committer asked about an undecided transaction gives up its
//!   read locks if it is still working, or aborts it if it is committing; one
//!   that never answers loses its locks after the abandon time. An owner holding locks of its
//!   own node's transaction past the lease asks nobody: a transaction still working gives up
//!   the locks it took with reads there and then, as it would if asked.
//! - Requests are re-sent until answered; one unanswered for the request timeout fails the
//!   transaction with the unreachable node and key.

use std::collections::{BTreeMap, BTreeSet};

use atomos_core::{AbortCause, Key};

use atomos_seam::Output;

use super::clock::NodeClock;
pub use super::config::{PlantedBug, TfaConfig};
use super::directory::{Directory, HashDirectory, NodeId};
use super::msg::{Body, Decision, TfaMsg};
use super::owner::{OwnedObjects, Refusal, TxId};
use super::roles::{Coordinator, Home, Outstanding, Owner, Pending};
pub use super::vocabulary::{Action, Answer, Failure, OpenError, Reply, TfaCounters};

/// Confirmations owed to one node, sent together on the next tick.
#[derive(Default)]
pub(super) struct Acks {
    pub(super) done: Vec<TxId>,
    pub(super) tracked: Vec<(Key, u64, bool)>,
}

/// One TFA node.
pub struct TfaNode {
    pub(super) me: NodeId,
    pub(super) cfg: TfaConfig,
    pub(super) dir: HashDirectory,
    pub(super) clock: NodeClock,
    /// The application's transactions.
    pub(super) coord: Coordinator,
    /// The objects this node holds.
    pub(super) owner: Owner,
    /// The keys this node is home to.
    pub(super) home: Home,
    /// Confirmations owed, by node (sent together on the next tick).
    pub(super) acks: BTreeMap<NodeId, Acks>,
    pub(super) incarnation: u64,
    /// The latest incarnation seen of each node (this one's included).
    pub(super) peers: BTreeMap<NodeId, u64>,
    /// Members that have not answered this node's `Hello` yet, and when it was last sent.
    pub(super) greeting: (BTreeSet<NodeId>, Option<u64>),
    /// Records written since the log was last rewritten whole.
    pub(super) logged: usize,
    pub(super) counters: TfaCounters,
}

impl TfaNode {
    /// Node `me` of `members` (which must contain it), starting with nothing on disk.
    /// `incarnation` must grow each time the node restarts (a start time will do): transaction
    /// numbers of different runs never meet. Returns `None` if `members` lacks `me`.
    pub fn new(
        me: NodeId,
        members: Vec<NodeId>,
        incarnation: u64,
        cfg: TfaConfig,
    ) -> Option<TfaNode> {
        Self::open(me, members, incarnation, cfg, &[]).ok()
    }

    /// The latest incarnation of node `me` its log records (`None` for an empty log): the next
    /// run must use a larger one.
    pub fn last_incarnation(me: NodeId, log: &[Vec<u8>]) -> Result<Option<u64>, OpenError> {
        Ok(super::durable::recover(log)?.peers.get(&me).copied())
    }

    /// Node `me` of `members` restarting from its log (the payloads of its records, in
    /// order), as incarnation `incarnation`, which must be larger than every earlier one. What
    /// the log says this node owned is lost (it keeps no objects): its home records say so
    /// from now on. The first step writes that down before anything else goes out.
    pub fn open(
        me: NodeId,
        members: Vec<NodeId>,
        incarnation: u64,
        cfg: TfaConfig,
        log: &[Vec<u8>],
    ) -> Result<TfaNode, OpenError> {
        if !members.contains(&me) {
            return Err(OpenError::NotAMember(me));
        }
        if incarnation >= 1 << 32 {
            return Err(OpenError::IncarnationTooLarge(incarnation));
        }
        let log = match cfg.planted_bug {
            Some(PlantedBug::ForgetHomeRecords) => &[],
            _ => log,
        };
        let mut recovered = super::durable::recover(log)?;
        // Whatever the log says an earlier run of a node held is lost, even if the record of
        // the loss did not reach the disk before the record of the restart did.
        for (&node, &seen) in &recovered.peers {
            recovered.tracker.lose_owner(node, seen);
        }
        recovered.tracker.lose_owner(me, incarnation);
        if let Some(&last) = recovered.peers.get(&me) {
            if last >= incarnation {
                return Err(OpenError::OldIncarnation {
                    given: incarnation,
                    last,
                });
            }
        }
        let others: BTreeSet<NodeId> = members.iter().copied().filter(|&m| m != me).collect();
        Ok(TfaNode {
            me,
            cfg,
            dir: HashDirectory::new(members).ok_or(OpenError::NotAMember(me))?,
            clock: NodeClock::new(0),
            coord: Coordinator::new(incarnation),
            owner: Owner::new(),
            home: Home::new(recovered.tracker),
            acks: BTreeMap::new(),
            incarnation,
            peers: recovered.peers,
            greeting: (others, None),
            logged: log.len(),
            counters: TfaCounters::default(),
        })
    }

    /// How many families of this node hold abstract locks or ask for one (none once every
    /// family ended).
    pub fn abstract_families(&self) -> usize {
        self.coord.families()
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
        &self.owner.objects
    }

    /// The home of `key`.
    pub fn home(&self, key: &Key) -> NodeId {
        self.dir.home(key)
    }

    /// This node's record of `key` as its home (`None` if it has none, or is not its home).
    pub fn home_record(&self, key: &Key) -> Option<super::directory::OwnerRecord> {
        self.home.tracker.record(key)
    }

    /// Counters since the node started.
    pub fn counters(&self) -> &TfaCounters {
        &self.counters
    }

    /// Transactions running, decisions not yet confirmed by every owner, and directory updates
    /// not yet confirmed by their home.
    pub fn in_flight(&self) -> (usize, usize, usize) {
        (
            self.coord.active.len(),
            self.coord.decided.len(),
            self.owner.tracking.len(),
        )
    }

    /// Requests sent and waiting for their answer (every one belongs to a running transaction).
    pub fn pending_requests(&self) -> usize {
        self.coord.requests.len()
    }

    /// One line per running transaction: its number, snapshot and what it waits for.
    pub fn describe_active(&self) -> Vec<String> {
        self.coord
            .active
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
            self.owner
                .objects
                .get(key)
                .map(|h| (h.version, h.locked_by)),
            self.owner.objects.moved_to(key),
            self.home.tracker.record(key),
            self.dir.home(key),
        )
    }

    pub(super) fn send(&self, to: NodeId, body: Body, out: &mut Vec<Action>) {
        out.push(Output::Send {
            to,
            msg: TfaMsg {
                clock: self.clock.now(),
                incarnation: self.incarnation,
                body,
            },
        });
    }

    /// Sends the request `body(req)` for transaction `h` and keeps it until answered.
    pub(super) fn request(
        &mut self,
        now: u64,
        h: u64,
        to: NodeId,
        key: Key,
        body: impl FnOnce(u64) -> Body,
        out: &mut Vec<Action>,
    ) {
        let Some(tx) = self.coord.active.get_mut(&h) else {
            return;
        };
        let req = self.coord.next_req;
        self.coord.next_req += 1;
        self.coord.requests.insert(req, h);
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

    /// Tells each of `owners` the decision about `tx` (with a commit, the objects it names to
    /// each, from `taken`) and repeats it until each confirms.
    pub(super) fn announce(
        &mut self,
        now: u64,
        tx: TxId,
        decision: Decision,
        owners: BTreeSet<NodeId>,
        mut taken: BTreeMap<NodeId, Vec<(Key, Option<u64>)>>,
        out: &mut Vec<Action>,
    ) {
        if owners.is_empty() {
            return;
        }
        taken.retain(|owner, _| owners.contains(owner));
        for &owner in &owners {
            let named = taken.get(&owner).cloned().unwrap_or_default();
            let body = Body::Decided {
                tx,
                decision,
                taken: named,
            };
            self.send(owner, body, out);
        }
        self.coord.decided.insert(
            tx,
            Pending {
                decision,
                waiting: owners,
                taken,
                sent: now,
                since: now,
            },
        );
    }

    /// Aborts `tx`'s locks: those here are released, and the owners it asked are told.
    pub(super) fn release_locks(
        &mut self,
        now: u64,
        tx: TxId,
        owners: BTreeSet<NodeId>,
        out: &mut Vec<Action>,
    ) {
        self.owner.objects.release(tx);
        self.announce(now, tx, Decision::Abort, owners, BTreeMap::new(), out);
    }
}

/// The failure an owner's refusal to lock means.
pub(super) fn refusal_failure(r: &Refusal) -> Failure {
    match r {
        Refusal::Busy(_) => Failure::Conflict(AbortCause::LockConflict),
        Refusal::Invalid(_) => Failure::Conflict(AbortCause::CommitValidation),
        Refusal::Lost(key, node) => Failure::Lost {
            key: key.clone(),
            node: *node,
        },
    }
}
