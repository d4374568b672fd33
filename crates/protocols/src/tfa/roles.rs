//! The state each role of a TFA node owns: the coordinator (the transactions its application
//! runs), the owner (the objects it holds and what it still owes their homes) and the home (the
//! records of where each of its keys lives, and the abstract locks named there). [`TfaNode`]
//! holds one of each beside what the roles share (identity, clock, peers, counters); the roles'
//! steps are its methods in `coordinator`, `server`, `abstract_locks` and `timers`, since one
//! step often acts in two roles (a commit installs objects the committer then owns).
//!
//! [`TfaNode`]: super::node::TfaNode

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap as HashMap;

use atomos_core::Key;

use super::directory::{NodeId, OwnerCache, Tracker};
use super::msg::{Body, Decision};
use super::owner::{OwnedObjects, TxId};

/// The coordinator's state: the transactions this node's application runs, their requests in
/// flight, and the decisions it repeats until every owner confirmed them.
pub(super) struct Coordinator {
    /// Running transactions by the application's handle.
    pub(super) active: BTreeMap<u64, Active>,
    /// Which handle each request number belongs to.
    pub(super) requests: HashMap<u64, u64>,
    /// The handle of each running transaction.
    pub(super) handles: HashMap<TxId, u64>,
    /// Decisions not yet confirmed by every owner they concern.
    pub(super) decided: BTreeMap<TxId, Pending>,
    /// Families of this node that hold abstract locks, with the names each holds as far as
    /// this node heard (a grant whose answer never came is freed by its home once the family
    /// ends, when it asks); a family waiting for a lock is here too. A family runs, for the homes that ask, while it
    /// is here: giving back some names (an open-nested block that aborted) keeps the others.
    families: BTreeMap<u64, BTreeSet<String>>,
    /// Where this node last found each object.
    pub(super) cache: OwnerCache,
    pub(super) next_tx: u64,
    pub(super) next_req: u64,
    /// Until when reads for writes take no locks (a transaction here met a lock).
    pub(super) contended_until: u64,
}

impl Coordinator {
    /// No transactions, numbering this run's transactions and requests from `incarnation`:
    /// numbers of different runs never meet, so an answer to an earlier run's request is never
    /// taken for one of this run's.
    pub(super) fn new(incarnation: u64) -> Coordinator {
        Coordinator {
            active: BTreeMap::new(),
            requests: HashMap::default(),
            handles: HashMap::default(),
            decided: BTreeMap::new(),
            families: BTreeMap::new(),
            cache: OwnerCache::new(),
            next_tx: incarnation << 32,
            next_req: incarnation << 32,
            contended_until: 0,
        }
    }

    /// A transaction here met a lock: reads for writes take none for `quiet` ticks.
    pub(super) fn note_contention(&mut self, now: u64, quiet: u64) {
        self.contended_until = now.saturating_add(quiet);
    }

    /// Takes the transaction of handle `h` out: its requests in flight are forgotten, and a
    /// family that was only asking for a lock no longer runs.
    pub(super) fn take(&mut self, h: u64) -> Option<Active> {
        let mut tx = self.active.remove(&h)?;
        drop_requests(&mut self.requests, &mut tx.outstanding);
        self.handles.remove(&tx.id);
        if let Wait::Abstract { family, .. } = tx.wait {
            self.forget_family_if_idle(family);
        }
        Some(tx)
    }

    /// Forgets the transaction of handle `h` (see [`Coordinator::take`]).
    pub(super) fn finish(&mut self, h: u64) {
        self.take(h);
    }

    /// How many families hold abstract locks or ask for one.
    pub(super) fn families(&self) -> usize {
        self.families.len()
    }

    /// Whether `family` holds abstract locks or is asking for one (what its homes are told).
    pub(super) fn family_runs(&self, family: u64) -> bool {
        self.families.contains_key(&family)
    }

    /// `family` asks for an abstract lock: it runs from now on.
    pub(super) fn family_asks(&mut self, family: u64) {
        self.families.entry(family).or_default();
    }

    /// The home of `name` answered `family`'s request: granted, or held by another. Whether
    /// the family did not hold `name` before (it is new to it, so it must release it).
    pub(super) fn family_answered(&mut self, family: u64, name: &str, granted: bool) -> bool {
        if granted {
            self.families
                .entry(family)
                .or_default()
                .insert(name.to_string())
        } else {
            self.forget_family_if_idle(family);
            false
        }
    }

    /// `family` gave back `names`; with nothing left it no longer runs.
    pub(super) fn family_released(&mut self, family: u64, names: &[String]) {
        if let Some(held) = self.families.get_mut(&family) {
            for name in names {
                held.remove(name);
            }
        }
        self.forget_family_if_idle(family);
    }

    fn forget_family_if_idle(&mut self, family: u64) {
        if self.families.get(&family).is_some_and(BTreeSet::is_empty) {
            self.families.remove(&family);
        }
    }

    /// Node `from` answered request `req` (with a `Fetched` if `fetched`): removes it and
    /// returns its transaction's handle if the transaction still waits for it and `from` is the
    /// node asked or, for a read answered by a `Fetched`, any node it may have been passed on
    /// to. (Request numbers of different runs never meet, so an answer meant for an earlier run
    /// of this node is not taken either.)
    pub(super) fn take_request(&mut self, req: u64, from: NodeId, fetched: bool) -> Option<u64> {
        let h = *self.requests.get(&req)?;
        let outstanding = self.active.get(&h).and_then(|tx| tx.outstanding.get(&req));
        // A read may be answered by the node it was passed on to (`Body::Forwarded`).
        let answerable = |o: &Outstanding| {
            o.to == from
                || (fetched && matches!(o.body, Body::Fetch { .. } | Body::FetchLock { .. }))
        };
        if outstanding.is_some_and(|o| !answerable(o)) {
            return None;
        }
        self.requests.remove(&req);
        self.active.get_mut(&h)?.outstanding.remove(&req)?;
        Some(h)
    }
}

/// Forgets the requests a transaction has in flight: answers still due to them are ignored.
pub(super) fn drop_requests(
    requests: &mut HashMap<u64, u64>,
    outstanding: &mut BTreeMap<u64, Outstanding>,
) {
    for req in std::mem::take(outstanding).into_keys() {
        requests.remove(&req);
    }
}

/// The owner's state: the objects this node holds, the nodes it passed locking reads on to,
/// and the moves of objects its keys' homes have not confirmed.
pub(super) struct Owner {
    pub(super) objects: OwnedObjects,
    /// Nodes this node passed reads for writes on to, by transaction, until it hears the
    /// transaction's decision: an abort is passed on to them too (the reader may have ended
    /// before it heard which node locked for it).
    pub(super) passed_locks: BTreeMap<TxId, BTreeSet<NodeId>>,
    /// `Track`s (and `Lost`s) the homes have not confirmed, by key.
    pub(super) tracking: BTreeMap<Key, Tracking>,
}

impl Owner {
    /// Holding nothing.
    pub(super) fn new() -> Owner {
        Owner {
            objects: OwnedObjects::new(),
            passed_locks: BTreeMap::new(),
            tracking: BTreeMap::new(),
        }
    }

    /// Tells `key`'s home, with the next timer tick and until it confirms, that this node now
    /// holds `key` at `version` (`lost_with: None`), or dropped it there as lost with a node.
    pub(super) fn track_later(
        &mut self,
        now: u64,
        key: Key,
        version: u64,
        lost_with: Option<NodeId>,
    ) {
        let t = Tracking {
            version,
            sent: None,
            since: now,
            lost_with,
        };
        self.tracking.insert(key, t);
    }
}

/// The home's state: where each key it is home to lives (persistent), and the abstract locks
/// named here.
pub(super) struct Home {
    pub(super) tracker: Tracker,
    /// Abstract locks this node is home to.
    pub(super) abstract_held: BTreeMap<String, AbstractHold>,
    /// When the home last heard from each holder of those locks: a grant, an ask again, or its
    /// node saying the family runs. A holder silent for the abandon time loses its locks here.
    pub(super) heard: BTreeMap<(NodeId, u64), u64>,
}

impl Home {
    /// The records recovered from the log (`tracker`), no abstract lock held.
    pub(super) fn new(tracker: Tracker) -> Home {
        Home {
            tracker,
            abstract_held: BTreeMap::new(),
            heard: BTreeMap::new(),
        }
    }
}

/// The outstanding entry of a read waiting to ask again after a "locked" answer.
pub(super) const BUSY_WAIT: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
pub(super) struct ReadInfo {
    pub(super) version: u64,
    pub(super) owner: NodeId,
}

/// A request in flight: re-sent until answered, failing its transaction at the deadline.
#[derive(Clone, Debug)]
pub(super) struct Outstanding {
    pub(super) to: NodeId,
    pub(super) key: Key,
    pub(super) body: Body,
    pub(super) sent: u64,
    pub(super) deadline: u64,
}

/// Where a running transaction stands when an owner has held its locks past the lease.
pub(super) enum Standing {
    /// Not running here (ended, or never known under that number).
    Gone,
    /// Running, not committing (the application works between operations, or waits for a
    /// read that takes no lock): handle `h`.
    Working(u64),
    /// A read that may take a lock is in flight (giving locks up now would let it take one
    /// under the number given up).
    Locking,
    /// Committing: handle `h`. Its decision, or its requests' timeout, ends its locks.
    Committing(u64),
}

#[derive(Debug)]
pub(super) enum Wait {
    Idle,
    /// A read is asking for `key` (after `hops` redirects and `busy` answers "locked"), with
    /// its commit lock if `lock` (a read for a write).
    Fetch {
        key: Key,
        hops: u32,
        busy: u32,
        lock: bool,
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
    /// An abstract lock asked of its home, for `family`.
    Abstract {
        family: u64,
        name: String,
    },
}

/// An abstract lock held at its home.
pub(super) struct AbstractHold {
    /// The number of the latest ask that granted it (the holder's request number; for a lock
    /// this node is home to and holds itself, its request count then). A release or a "no
    /// longer runs" sent before that ask does not free it.
    pub(super) req: u64,
    /// The holding family: its node and its number there.
    pub(super) holder: (NodeId, u64),
    pub(super) ask_at: u64,
}

pub(super) struct Active {
    pub(super) id: TxId,
    pub(super) rv: u64,
    pub(super) reads: BTreeMap<Key, ReadInfo>,
    pub(super) wait: Wait,
    /// Requests of the current step, by request number.
    pub(super) outstanding: BTreeMap<u64, Outstanding>,
    /// Owners asked for locks (they must hear the decision).
    pub(super) contacted: BTreeSet<NodeId>,
    /// Objects locked when read for a write, with the version read and their owner. Kept
    /// when the read is forgotten: the lock stays until the decision.
    pub(super) prelocked: BTreeMap<Key, ReadInfo>,
    /// At commit: the written objects of each other owner, with the version read (what the
    /// decision names).
    pub(super) taken: BTreeMap<NodeId, Vec<(Key, Option<u64>)>>,
    /// Whether reads made for writes still take locks (not after the transaction waited).
    pub(super) lock_reads: bool,
}

/// A decision the committer repeats until every owner confirmed it.
pub(super) struct Pending {
    pub(super) decision: Decision,
    pub(super) waiting: BTreeSet<NodeId>,
    /// With a commit: what it names to each owner (see [`Body::Decided`]).
    pub(super) taken: BTreeMap<NodeId, Vec<(Key, Option<u64>)>>,
    pub(super) sent: u64,
    pub(super) since: u64,
}

/// A `Track` (or `Lost`) the home has not confirmed.
pub(super) struct Tracking {
    pub(super) version: u64,
    /// When it was last sent (`None`: not yet).
    pub(super) sent: Option<u64>,
    pub(super) since: u64,
    /// `Some(node)`: this node dropped its copy as lost with `node` (a `Lost` entry).
    pub(super) lost_with: Option<NodeId>,
}
