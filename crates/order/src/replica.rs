//! One OS-Paxos replica: a Raft core (raft-rs `RawNode`) that orders batch ids, S-Paxos batch
//! dissemination around it, optimistic and final delivery, client deduplication, persistence,
//! snapshots. A deterministic state machine behind the protocol seam (its
//! [`Machine::step`] takes a tick, a message, a flush request or a persistence confirmation
//! and appends what to send, write and deliver); it reads no clock and owns no socket or file.
//!
//! - A client's request goes into the replica's open batch; a batch is sealed when full or after
//!   `batch_delay_ticks`, persisted, and sent to every replica. Each persists it and acknowledges;
//!   once a majority holds it, the origin proposes its id to Raft (proposals from followers are
//!   forwarded to the leader by raft-rs). With at most three replicas the leader and the origin
//!   are already a majority when the batch reaches the leader, so the leader proposes it on
//!   receipt, and a follower origin leaves it to the leader (proposing it itself only if it is
//!   not in the log after `retry_ticks`): two message delays fewer than acknowledging back and
//!   forwarding the proposal. The leader orders ids only, so its work does not grow with
//!   request size.
//! - An entry is optimistically delivered when it is in this replica's log (the leader's
//!   proposal, persisted), its batch is here, and every earlier entry was optimistically
//!   delivered; finally delivered when it is committed (and was optimistically delivered).
//!   Raft overwrites a follower's uncommitted entries after a leader change without telling
//!   anyone: the log store reports the first replaced index, and every optimistic delivery from
//!   there on is revoked.
//! - Requests are deduplicated in log order, so every replica drops the same duplicates: a
//!   request is delivered only if its number is above every number its client had delivered
//!   (finally or optimistically) at earlier positions, a function of the log prefix alone.
//! - Every entry carries its proposer's clock reading (in the Raft entry's context). The log's
//!   time at an entry is the latest reading on it and before it: a function of the log alone,
//!   which never goes back. A request whose deadline is before the log's time at its entry
//!   expires there (it never runs, and counts as its client's latest request), on every replica
//!   alike; a copy that reaches a replica whose final log time is past its deadline is answered
//!   at once.
//! - A missing batch is fetched from the other replicas; lost batches, acknowledgements and
//!   proposals are re-sent every `retry_ticks`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use prost::Message as _;
use raft::eraftpb::{Entry, EntryType, HardState, Message, MessageType, Snapshot};
use raft::{RawNode, SnapshotStatus};
use serde::{Deserialize, Serialize};

use atomos_seam::stable::{mix64, SplitMix64, GOLDEN};
use atomos_seam::{Machine, Output, Write};
use rand_core::{RngCore, SeedableRng};

use crate::log_store::LogStore;
use crate::logging::raft_logger;
use crate::lost_log::LostLog;
use crate::raft_guard;
use crate::record::Record;
use crate::types::{Action, Addr, BatchId, Delivery, OrderMsg, Request, StateMachine};

/// Settings of a replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's address (also its Raft id; not 0).
    pub id: Addr,
    /// Every replica's address, this one included.
    pub replicas: Vec<Addr>,
    /// A batch is sealed when it holds this many requests...
    pub batch_max: usize,
    /// ...or when it has been open this many ticks (0: at the next tick).
    pub batch_delay_ticks: u64,
    /// Raft election timeout in ticks.
    pub election_ticks: usize,
    /// Raft heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// Unacknowledged batches, unordered proposals and missing batches are retried this often.
    pub retry_ticks: u64,
    /// A snapshot is taken (and the log compacted) every this many finally delivered entries.
    pub snapshot_every: u64,
    /// Append messages in flight per follower (pipelining).
    pub max_inflight: usize,
    /// Seeds the jitter added to ticks, which keeps elections from splitting forever, and the
    /// numbering of this start's batches: give each start of a replica a seed of its own.
    pub seed: u64,
    /// This replica lost its log (its data directory was wiped) and the cluster has a
    /// history: it neither votes nor campaigns until it has caught up (see `lost_log`). Only
    /// an operator can say so: a new replica's empty log looks the same. Ignored once the
    /// log shows it caught up, so it may stay set.
    pub rejoin: bool,
    /// A deliberate bug, for the tests that prove the simulation catches it; `None` in any
    /// real use.
    #[doc(hidden)]
    pub planted_bug: Option<PlantedBug>,
}

/// Bugs a replica can be built with on purpose, so that a test shows the simulation finds
/// them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Deliver (and apply) entries finally as soon as they are in the log, before Raft commits
    /// them.
    FinalBeforeCommit,
    /// Deliver (and apply) committed entries before this replica's own write of them is
    /// durable: a leader's readers then see entries that its crash can take back.
    ApplyBeforeDurable,
    /// Decide whether a request expired by this replica's own clock instead of the log's
    /// time: replicas whose clocks differ then run different requests.
    ExpireByOwnClock,
}

impl ReplicaConfig {
    /// Defaults for replica `id` of `replicas`: batches of up to 256 requests sealed at the next
    /// tick, election after 10 ticks, heartbeat every 2, retries every 10 ticks, a snapshot every
    /// 10,000 entries, 256 appends in flight.
    pub fn new(id: Addr, replicas: Vec<Addr>) -> ReplicaConfig {
        ReplicaConfig {
            id,
            replicas,
            batch_max: 256,
            batch_delay_ticks: 0,
            election_ticks: 10,
            heartbeat_ticks: 2,
            retry_ticks: 10,
            snapshot_every: 10_000,
            max_inflight: 256,
            seed: id,
            rejoin: false,
            planted_bug: None,
        }
    }
}

/// A replica's local requests (besides the messages clients send it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Seal the open batch now: the driver has no more requests waiting (batching by load,
    /// like group commit, on top of the size and tick limits).
    Flush,
}

/// What a replica reacts to: messages, ticks (one each), [`Command`]s and persistence
/// confirmations.
pub type Input = atomos_seam::Input<OrderMsg, Command>;

/// Why a replica cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The configuration is unusable.
    #[error("bad order configuration: {0}")]
    Config(String),
    /// The log holds something this build cannot read.
    #[error("corrupt record in the log: {0}")]
    Corrupt(String),
    /// Raft replaced entries this replica had already delivered finally: its log disagrees with
    /// the cluster's committed order (a lost write or a damaged disk), and it must stop.
    #[error(
        "raft replaced entries from {cut} on, but entries before {final_next} were finally \
         delivered here: this replica's log diverged from the committed order"
    )]
    Diverged {
        /// The first replaced entry.
        cut: u64,
        /// The next entry this replica would have delivered finally.
        final_next: u64,
    },
    /// raft-rs refused to start.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
}

/// Counters of one replica (since it last started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Entries optimistically delivered.
    pub opt_delivered: u64,
    /// Entries finally delivered.
    pub final_delivered: u64,
    /// Optimistic deliveries revoked.
    pub revoked: u64,
    /// Requests finally delivered (duplicates excluded).
    pub requests_delivered: u64,
    /// Snapshots installed from the leader.
    pub snapshots_installed: u64,
    /// Snapshots taken here.
    pub snapshots_taken: u64,
    /// Snapshots not taken because the state machine's did not pass its own check.
    pub snapshots_failed: u64,
    /// Snapshots from peers refused because their state does not decode.
    pub snapshots_refused: u64,
    /// Raft messages from peers refused as malformed (see `raft_guard`).
    pub raft_refused: u64,
    /// Votes withheld while this replica, rejoining after losing its log, caught up.
    pub votes_withheld: u64,
    /// Peers this leader started over with because their log was shorter than acknowledged.
    pub peers_restarted: u64,
}

/// What a snapshot holds besides Raft's metadata. Fields are only ever appended (postcard
/// encodes them in order), so a snapshot written by an earlier build decodes as a prefix.
#[derive(Serialize, Deserialize)]
struct SnapshotData {
    machine: Vec<u8>,
    /// Per client: its latest request's number and answer (empty if it expired).
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
    /// The log's time at the snapshot's position.
    log_time: u64,
    /// The clients whose latest request expired.
    expired: Vec<u64>,
}

/// A snapshot as builds before request deadlines wrote it.
#[derive(Deserialize)]
struct SnapshotDataWithoutTime {
    machine: Vec<u8>,
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
}

impl SnapshotData {
    /// Decodes a snapshot of this build or of an earlier one (without log time: 0, and no
    /// expired requests). The current layout extends the earlier one, so earlier bytes fail
    /// only for want of the new fields.
    fn decode(bytes: &[u8]) -> Result<SnapshotData, String> {
        postcard::from_bytes::<SnapshotData>(bytes).or_else(|e| {
            postcard::from_bytes::<SnapshotDataWithoutTime>(bytes)
                .map(|old| SnapshotData {
                    machine: old.machine,
                    clients: old.clients,
                    delivered_batches: old.delivered_batches,
                    log_time: 0,
                    expired: Vec::new(),
                })
                .map_err(|_| e.to_string())
        })
    }

    /// What a snapshot holds of `machine`'s state and a replica's tables.
    fn new(
        machine: Vec<u8>,
        clients: &BTreeMap<u64, (u64, Last)>,
        delivered_batches: &BTreeSet<BatchId>,
        log_time: u64,
    ) -> SnapshotData {
        let mut expired = Vec::new();
        let clients = clients
            .iter()
            .map(|(c, (s, last))| match last {
                Last::Answered(r) => (*c, *s, r.clone()),
                Last::Expired => {
                    expired.push(*c);
                    (*c, *s, Vec::new())
                }
            })
            .collect();
        SnapshotData {
            machine,
            clients,
            delivered_batches: delivered_batches.iter().copied().collect(),
            log_time,
            expired,
        }
    }

    /// The clients' table it holds.
    fn clients(&self) -> BTreeMap<u64, (u64, Last)> {
        let expired: BTreeSet<u64> = self.expired.iter().copied().collect();
        self.clients
            .iter()
            .map(|(c, s, r)| {
                let last = if expired.contains(c) {
                    Last::Expired
                } else {
                    Last::Answered(r.clone())
                };
                (*c, (*s, last))
            })
            .collect()
    }
}

/// What became of a client's latest finally delivered request.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Last {
    /// It ran; the state machine's answer.
    Answered(Vec<u8>),
    /// It expired (it never ran).
    Expired,
}

impl Last {
    /// What a client that sent request `seq` (the one this is the outcome of) is told.
    fn message(&self, client: u64, seq: u64) -> OrderMsg {
        match self {
            Last::Answered(response) => OrderMsg::Reply {
                client,
                seq,
                response: response.clone(),
            },
            Last::Expired => OrderMsg::Expired { client, seq },
        }
    }
}

/// An entry optimistically delivered and not yet final.
struct Pending {
    batch: Option<BatchId>,
    requests: Vec<Request>,
    /// Requests of the entry's batch that expired there: (client, seq).
    expired: Vec<(u64, u64)>,
    /// The log's time at the entry.
    time: u64,
}

/// One replica. `S` is the replicated state machine.
pub struct Replica<S> {
    cfg: ReplicaConfig,
    raft: RawNode<LogStore>,
    /// Records written since the last flush into a disk write.
    unflushed: Vec<Vec<u8>>,
    /// Disk writes emitted so far (numbered from 1, as `Input::Persisted` counts them).
    writes: u64,
    /// Emitted writes not known durable yet, each with the last log index it makes durable.
    unsynced: VecDeque<(u64, u64)>,
    /// The last log index durable on this replica's disk: it applies nothing beyond it, so
    /// what its readers see is on a majority's disks (the commit index counts this replica
    /// as holding what it has only queued for writing).
    durable_index: u64,
    machine: S,
    rng: SplitMix64,
    ticks: u64,
    /// The clock reading of the current step (milliseconds since the Unix epoch in
    /// production): what this replica stamps on the entries it proposes.
    now_ms: u64,
    /// The log's time at the last optimistically delivered entry...
    opt_time: u64,
    /// ...and at the last finally delivered one.
    final_time: u64,

    batches: BTreeMap<BatchId, Vec<Request>>,
    delivered_batches: BTreeSet<BatchId>,
    /// The latest log index holding each batch id.
    in_log: BTreeMap<BatchId, u64>,
    fetch_sent: BTreeMap<BatchId, u64>,

    open: Vec<Request>,
    open_since: u64,
    next_batch: u64,
    /// Own batches not yet held by a majority: who acknowledged, when last sent.
    unacked: BTreeMap<BatchId, (BTreeSet<Addr>, u64)>,
    /// Own batches held by a majority and not yet delivered: when last proposed.
    proposed: BTreeMap<BatchId, u64>,
    /// Requests in this replica's batches that are not delivered yet.
    in_flight: BTreeSet<(u64, u64)>,

    /// Per client: the last delivered request number and what became of it.
    clients: BTreeMap<u64, (u64, Last)>,
    /// Per client: the request waiting for an answer here, and where to send it.
    awaiting: BTreeMap<u64, (u64, Addr)>,

    pending: BTreeMap<u64, Pending>,
    pending_requests: BTreeSet<(u64, u64)>,
    opt_next: u64,
    final_next: u64,
    commit: u64,
    /// The configured replicas, sorted (what a peer's snapshot must be configured with).
    voters: Vec<u64>,
    snapshot_to: Vec<u64>,
    /// The batch the next optimistic delivery waits for, and since when.
    missing: Option<(BatchId, u64)>,
    /// Whether this replica's log is known to have lost entries (see `lost_log`).
    lost_log: LostLog,
    stats: OrderStats,
}

/// Where a start of a replica numbers its batches from: 2^32 times a number from 1 to 2^32 - 1
/// drawn from `seed`, so two starts with different seeds collide with probability 2^-32.
fn fresh_batch_base(seed: u64) -> u64 {
    // Mixed: nearby seeds give unrelated bases.
    let z = mix64(seed.wrapping_add(GOLDEN));
    ((z & 0xFFFF_FFFF).max(1)) << 32
}

fn encode_entry_data(id: BatchId) -> Vec<u8> {
    postcard::to_stdvec(&id).unwrap_or_default()
}

/// An entry's context: its proposer's clock reading.
fn encode_stamp(now_ms: u64) -> Vec<u8> {
    postcard::to_stdvec(&now_ms).unwrap_or_default()
}

/// The clock reading an entry carries (0 for none: a leader's empty entry, or an entry
/// written before entries were stamped).
fn entry_stamp(e: &Entry) -> u64 {
    if e.context.is_empty() {
        return 0;
    }
    postcard::from_bytes(&e.context).unwrap_or(0)
}

fn entry_batch(e: &Entry) -> Option<BatchId> {
    if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
        return None;
    }
    postcard::from_bytes(&e.data).ok()
}

/// What becomes of a batch's requests at its entry.
struct Admission {
    /// The requests delivered there, in the batch's order.
    admitted: Vec<Request>,
    /// The requests that expired there: (client, seq).
    expired: Vec<(u64, u64)>,
}

/// Decides a batch's requests at its entry, where the log's time is `time`, in the batch's
/// order. A request whose number is not above every number its client had delivered before it
/// in the log (finally, in `clients`; optimistically and not revoked, in `pending`; or earlier
/// in this batch) is a duplicate, or older than a request already ordered, and is dropped.
/// Of the others, one whose deadline is before `time` expires; the rest are admitted. Both
/// expired and admitted requests count as delivered (they are added to `pending`). Both tables
/// hold exactly what the entries before this one delivered and `time` is the log's, so the
/// verdict is a function of the log prefix alone: the same on every replica and every replay
/// of a log, however a client's numbers arrive.
fn admit_newest(
    batch: &[Request],
    time: u64,
    clients: &BTreeMap<u64, (u64, Last)>,
    pending: &mut BTreeSet<(u64, u64)>,
) -> Admission {
    let mut admission = Admission {
        admitted: Vec::new(),
        expired: Vec::new(),
    };
    for r in batch {
        let last_final = clients.get(&r.client).map_or(0, |(seq, _)| *seq);
        let last_pending = pending
            .range((r.client, 0)..=(r.client, u64::MAX))
            .next_back()
            .map_or(0, |(_, seq)| *seq);
        if r.seq > last_final.max(last_pending) {
            pending.insert((r.client, r.seq));
            if r.deadline_ms < time {
                admission.expired.push((r.client, r.seq));
            } else {
                admission.admitted.push(r.clone());
            }
        }
    }
    admission
}

impl<S: StateMachine> Replica<S> {
    /// Opens replica `cfg.id` from the records its disk holds ([`crate::decode_log`]; none for a
    /// new replica) and starts Raft where the log left off. `machine` must be in its initial
    /// state.
    pub fn open(cfg: ReplicaConfig, log: Vec<Record>, mut machine: S) -> Result<Self, OrderError> {
        if cfg.id == 0 || !cfg.replicas.contains(&cfg.id) {
            return Err(OrderError::Config(format!(
                "replica id {} must be non-zero and among the replicas {:?}",
                cfg.id, cfg.replicas
            )));
        }
        // What the log says of rejoining: still at it, caught up since, or nothing.
        let mut rejoining: Option<bool> = None;
        let mut store = LogStore::new(cfg.replicas.clone());
        let mut batches = BTreeMap::new();
        // Batch numbers must never repeat, but a log does not always remember every number this
        // replica used (its disk may have been wiped, and its log may hold some of an earlier
        // run's batches, received back from peers, but not the last): each start numbers from
        // a base of its own drawn from its seed, which the runtime draws anew at each start.
        let next_batch = fresh_batch_base(cfg.seed);
        for record in log {
            match record {
                Record::Entries(list) => {
                    let ents = list
                        .iter()
                        .map(|b| Entry::decode(b.as_slice()))
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| OrderError::Corrupt(e.to_string()))?;
                    store.append(&ents);
                }
                Record::HardState { term, vote, commit } => {
                    let mut hs = HardState::default();
                    (hs.term, hs.vote, hs.commit) = (term, vote, commit);
                    store.set_hard_state(hs);
                }
                Record::Installed(bytes) => {
                    let snap = Snapshot::decode(bytes.as_slice())
                        .map_err(|e| OrderError::Corrupt(e.to_string()))?;
                    store.install(snap);
                }
                Record::Batch { id, requests } => {
                    batches.insert(id, requests);
                }
                Record::BatchWithoutDeadlines { id, requests } => {
                    batches.insert(id, requests.into_iter().map(Request::from).collect());
                }
                Record::Rejoining => rejoining = Some(true),
                Record::Rejoined => rejoining = Some(false),
            }
        }
        let base = store.snapshot_index();
        let mut clients = BTreeMap::new();
        let mut delivered_batches = BTreeSet::new();
        let mut log_time = 0;
        if base > 0 {
            let data = SnapshotData::decode(&store.latest_snapshot().data)
                .map_err(|e| OrderError::Corrupt(format!("snapshot: {e}")))?;
            machine
                .restore(&data.machine)
                .map_err(OrderError::Corrupt)?;
            clients = data.clients();
            log_time = data.log_time;
            delivered_batches = data.delivered_batches.into_iter().collect();
        }
        let commit = store.hard_state().commit.max(base);
        let mut in_log = BTreeMap::new();
        for e in store.entries_from(store.first()) {
            if let Some(id) = entry_batch(e) {
                in_log.insert(id, e.index);
            }
        }
        // Own batches that may never have reached a majority go round again.
        let unacked = batches
            .keys()
            .filter(|id| {
                id.origin == cfg.id && !delivered_batches.contains(id) && !in_log.contains_key(id)
            })
            .map(|id| (*id, (BTreeSet::from([cfg.id]), 0)))
            .collect();
        let raft_cfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            applied: base,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: cfg.max_inflight,
            check_quorum: true,
            pre_vote: true,
            // One value only: raft-rs draws it from its own generator, and runs must be
            // reproducible. The jitter comes from skipped ticks instead (see `tick`).
            min_election_tick: cfg.election_ticks,
            max_election_tick: cfg.election_ticks + 1,
            ..raft::Config::default()
        };
        let raft = RawNode::new(&raft_cfg, store, &raft_logger())?;
        // Told to rejoin and the log does not show it caught up since (an operator may leave
        // the setting on), or the log says an earlier start was still rejoining.
        let rejoin = rejoining.unwrap_or(cfg.rejoin);
        let lost_log = LostLog::new(rejoin);
        // Written before anything else this start writes, so a crash before catching up
        // restarts rejoining, whatever the configuration says then.
        let unflushed = if rejoin && rejoining.is_none() {
            vec![Record::Rejoining.encode()]
        } else {
            Vec::new()
        };
        let rng = SplitMix64::seed_from_u64(cfg.seed ^ 0x6a09_e667_f3bc_c908);
        // What the log held at start is on the disk.
        let durable_index = raft.store().last();
        Ok(Replica {
            raft,
            unflushed,
            writes: 0,
            unsynced: VecDeque::new(),
            durable_index,
            machine,
            rng,
            ticks: 0,
            now_ms: 0,
            opt_time: log_time,
            final_time: log_time,
            batches,
            delivered_batches,
            in_log,
            fetch_sent: BTreeMap::new(),
            open: Vec::new(),
            open_since: 0,
            next_batch,
            unacked,
            proposed: BTreeMap::new(),
            in_flight: BTreeSet::new(),
            clients,
            awaiting: BTreeMap::new(),
            pending: BTreeMap::new(),
            pending_requests: BTreeSet::new(),
            opt_next: base + 1,
            final_next: base + 1,
            commit,
            voters: {
                let mut v = cfg.replicas.clone();
                v.sort_unstable();
                v
            },
            snapshot_to: Vec::new(),
            missing: None,
            lost_log,
            stats: OrderStats::default(),
            cfg,
        })
    }

    /// This replica's address (its Raft id).
    pub fn id(&self) -> Addr {
        self.cfg.id
    }

    /// The replicated state machine.
    pub fn machine(&self) -> &S {
        &self.machine
    }

    /// Whether this replica still rejoins after losing its log (it votes once caught up),
    /// or has not delivered every entry it knows committed yet (a rejoined replica may still
    /// fetch the batches of old entries).
    pub fn rejoining(&self) -> bool {
        self.lost_log.rejoining() || self.final_next <= self.commit
    }

    /// The replicated state machine, to take what it recorded while applying (events for the
    /// node it runs on). Changing its state here would part this replica from the others.
    pub fn machine_mut(&mut self) -> &mut S {
        &mut self.machine
    }

    /// Counters since this replica started.
    pub fn stats(&self) -> OrderStats {
        self.stats
    }

    /// Requests this replica took into its batches that are not delivered or dropped yet
    /// (bookkeeping that must not grow with the requests it has served).
    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether this replica is the Raft leader now.
    pub fn is_leader(&self) -> bool {
        self.raft.raft.state == raft::StateRole::Leader
    }

    /// The current Raft term (it grows with every election).
    pub fn term(&self) -> u64 {
        self.raft.raft.term
    }

    /// The next position to be finally delivered.
    pub fn final_next(&self) -> u64 {
        self.final_next
    }

    /// The log's time at the last finally delivered entry (see [`Delivery::Final`]): a
    /// request with an earlier deadline that has not run by now never will.
    pub fn log_time(&self) -> u64 {
        self.final_time
    }

    /// A one-line account of where this replica stands (for diagnostics).
    pub fn describe(&self) -> String {
        let store = self.raft.store();
        format!(
            "replica {}: {:?} term {}, log {}..={}, commit {}, opt_next {}, final_next {}, waiting for batch {:?}, {:?}",
            self.cfg.id,
            self.raft.raft.state,
            self.raft.raft.term,
            store.first(),
            store.last(),
            self.commit,
            self.opt_next,
            self.final_next,
            self.missing,
            self.stats
        )
    }

    /// Opens a replica's log without joining the cluster and applies every committed entry it
    /// holds: the state the replica had reached (or would reach on restart before hearing from
    /// anyone). For tools and tests that inspect a stopped replica.
    pub fn recover(
        cfg: ReplicaConfig,
        log: Vec<Record>,
        machine: S,
    ) -> Result<(S, u64), OrderError> {
        let mut replica = Replica::open(cfg, log, machine)?;
        let mut ignored = Vec::new();
        replica.step(0, Input::Request(Command::Flush), &mut ignored)?;
        let applied = replica.final_next - 1;
        Ok((replica.machine, applied))
    }

    fn majority(&self) -> usize {
        self.cfg.replicas.len() / 2 + 1
    }

    /// Whether this replica, as leader, proposes the batches `origin` sends it on receipt: it
    /// leads, `origin` is another replica, and the two of them are a majority.
    fn leader_orders_for(&self, origin: Addr) -> bool {
        self.is_leader() && origin != self.cfg.id && self.majority() <= 2
    }

    fn others(&self) -> impl Iterator<Item = Addr> + '_ {
        let me = self.cfg.id;
        self.cfg.replicas.iter().copied().filter(move |&r| r != me)
    }

    fn next_random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Queues a record for the next disk write.
    fn write(&mut self, record: &Record) {
        self.unflushed.push(record.encode());
    }

    /// Emits the queued records as one disk write: whatever is emitted after it waits until
    /// they are durable.
    fn flush(&mut self, out: &mut Vec<Action>) {
        if !self.unflushed.is_empty() {
            let records = std::mem::take(&mut self.unflushed);
            self.emit_write(Write::Append(records), out);
        }
    }

    /// Emits a disk write. Every entry in the log store was queued in it or in an earlier
    /// write, so once it is durable the whole log up to the store's last index is.
    fn emit_write(&mut self, write: Write, out: &mut Vec<Action>) {
        self.writes += 1;
        self.unsynced
            .push_back((self.writes, self.raft.store().last()));
        out.push(Output::Persist(write));
    }

    /// The log after `index` was replaced: no write made so far holds its entries.
    fn clamp_durable(&mut self, index: u64) {
        self.durable_index = self.durable_index.min(index);
        for (_, last) in &mut self.unsynced {
            *last = (*last).min(index);
        }
    }

    /// The writes up to number `through` are durable.
    fn persisted(&mut self, through: u64) {
        while let Some(&(write, last)) = self.unsynced.front() {
            if write > through {
                break;
            }
            self.unsynced.pop_front();
            self.durable_index = self.durable_index.max(last);
        }
    }

    fn tick(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        self.ticks += 1;
        // One tick in eight is skipped, at random: replicas whose election timers started
        // together drift apart, so split votes do not repeat forever.
        if !self.next_random().is_multiple_of(8) {
            self.raft.tick();
        }
        if !self.open.is_empty() && self.ticks - self.open_since >= self.cfg.batch_delay_ticks {
            self.seal(out)?;
        }
        // Batches delivered meanwhile (a snapshot can deliver them wholesale) are done; their
        // contents may already be forgotten, so they must not be re-sent below.
        let delivered = &self.delivered_batches;
        self.proposed.retain(|id, _| !delivered.contains(id));
        self.unacked.retain(|id, _| !delivered.contains(id));
        let (now, retry) = (self.ticks, self.cfg.retry_ticks);
        let resend: Vec<(BatchId, Vec<Addr>)> = self
            .unacked
            .iter_mut()
            .filter(|(_, (_, sent))| now >= *sent + retry)
            .map(|(id, (acks, sent))| {
                *sent = now;
                let missing = self
                    .cfg
                    .replicas
                    .iter()
                    .copied()
                    .filter(|r| !acks.contains(r))
                    .collect();
                (*id, missing)
            })
            .collect();
        for (id, to) in resend {
            // Never a batch without its contents: a replica taking one would deliver nothing
            // where the others deliver the requests.
            let Some(requests) = self.batches.get(&id).cloned() else {
                continue;
            };
            for r in to {
                out.push(Output::Send {
                    to: r,
                    msg: OrderMsg::Batch {
                        id,
                        requests: requests.clone(),
                    },
                });
            }
        }
        let repropose: Vec<BatchId> = self
            .proposed
            .iter()
            .filter(|(id, at)| !self.in_log.contains_key(id) && now >= **at + retry)
            .map(|(id, _)| *id)
            .collect();
        for id in repropose {
            self.propose(id);
        }
        self.unstick(out);
        Ok(())
    }

    /// The replicas drop a batch's contents when they compact the log past its entry. A replica
    /// that still needs one by then (it was away, and its log is not behind enough for Raft to
    /// send a snapshot) asks the others for their latest snapshot instead and adopts it.
    fn unstick(&mut self, out: &mut Vec<Action>) {
        let Some((id, since)) = self.missing else {
            return;
        };
        if self.ticks < since + 4 * self.cfg.retry_ticks {
            return;
        }
        self.missing = Some((id, self.ticks));
        for to in self.others().collect::<Vec<_>>() {
            out.push(Output::Send {
                to,
                msg: OrderMsg::FetchState {
                    after: self.opt_next,
                },
            });
        }
    }

    fn on_message(
        &mut self,
        from: Addr,
        msg: OrderMsg,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let member = self.cfg.replicas.contains(&from);
        match msg {
            OrderMsg::Raft(bytes) if member => match Message::decode(bytes.as_slice()) {
                Ok(m) if m.from == from && m.to == self.cfg.id => {
                    let view = raft_guard::View {
                        voters: &self.voters,
                        last_index: self.raft.raft.raft_log.last_index(),
                    };
                    let kind = m.msg_type;
                    let is = |t: MessageType| kind == t as i32;
                    if let Err(why) = raft_guard::check(&m, &view) {
                        self.stats.raft_refused += 1;
                        tracing::warn!(from, kind, why, "raft message refused");
                        if is(MessageType::MsgHeartbeat)
                            && m.commit > view.last_index
                            && self
                                .lost_log
                                .report_behind(self.ticks, self.cfg.retry_ticks)
                        {
                            out.push(Output::Send {
                                to: from,
                                msg: OrderMsg::Behind {
                                    last: view.last_index,
                                },
                            });
                        }
                    } else if (is(MessageType::MsgRequestVote)
                        || is(MessageType::MsgRequestPreVote))
                        && self.lost_log.refuses_vote()
                    {
                        self.stats.votes_withheld += 1;
                        tracing::info!(
                            from,
                            "vote withheld: this replica rejoins after losing its log and has \
                             not caught up"
                        );
                    } else if m.msg_type == MessageType::MsgSnapshot as i32
                        && self.check_snapshot(m.get_snapshot()).is_err()
                    {
                        self.stats.snapshots_refused += 1;
                        tracing::warn!(from, "raft snapshot whose state does not decode refused");
                    } else {
                        if is(MessageType::MsgAppend) {
                            self.lost_log.leader_appended(m.commit);
                        }
                        // Errors here are stale or irrelevant messages (raft-rs ignores them).
                        let _ = self.raft.step(m);
                    }
                }
                Ok(m) => tracing::warn!(
                    from,
                    claimed = m.from,
                    to = m.to,
                    "misaddressed raft message dropped"
                ),
                Err(e) => tracing::warn!(from, error = %e, "undecodable raft message dropped"),
            },
            OrderMsg::Batch { requests, .. } if requests.is_empty() => {
                // No replica seals an empty batch; taking one would deliver nothing where the
                // others deliver the batch's requests.
                tracing::warn!(from, "empty batch refused");
            }
            OrderMsg::Batch { id, requests } if member => {
                if !self.batches.contains_key(&id) && !self.delivered_batches.contains(&id) {
                    self.write(&Record::Batch {
                        id,
                        requests: requests.clone(),
                    });
                    // The acknowledgement below promises the batch is durable here.
                    self.flush(out);
                    self.batches.insert(id, requests);
                }
                if id.origin == from {
                    out.push(Output::Send {
                        to: from,
                        msg: OrderMsg::BatchAck { id },
                    });
                    if self.leader_orders_for(from)
                        && self.batches.contains_key(&id)
                        && !self.in_log.contains_key(&id)
                        && !self.delivered_batches.contains(&id)
                    {
                        // The origin persisted the batch before sending it and this replica
                        // has just persisted it (the proposal's messages wait for that write):
                        // a majority holds it.
                        self.propose_entry(id);
                    }
                }
            }
            OrderMsg::BatchAck { id } if member => {
                let majority = self.majority();
                if let Some((acks, _)) = self.unacked.get_mut(&id) {
                    acks.insert(from);
                    if acks.len() >= majority {
                        self.unacked.remove(&id);
                        let leader = self.raft.raft.leader_id;
                        if leader != 0 && leader != self.cfg.id && self.majority() <= 2 {
                            // The leader proposed it when the batch reached it; proposing here
                            // too would order it twice. It is proposed from here only if it is
                            // not in the log after `retry_ticks` (the leader changed, say).
                            self.proposed.insert(id, self.ticks);
                        } else {
                            self.propose(id);
                        }
                    }
                }
            }
            OrderMsg::FetchBatch { id } if member => {
                if let Some(requests) = self.batches.get(&id) {
                    out.push(Output::Send {
                        to: from,
                        msg: OrderMsg::Batch {
                            id,
                            requests: requests.clone(),
                        },
                    });
                }
            }
            OrderMsg::FetchState { after } if member => {
                let snap = self.raft.store().latest_snapshot();
                if snap.get_metadata().index >= after {
                    out.push(Output::Send {
                        to: from,
                        msg: OrderMsg::State {
                            snapshot: snap.encode_to_vec(),
                        },
                    });
                }
            }
            OrderMsg::State { snapshot } if member => {
                match Snapshot::decode(snapshot.as_slice())
                    .map_err(|e| e.to_string())
                    .and_then(|snap| self.check_snapshot(&snap).map(|()| snap))
                {
                    Ok(snap) => self.adopt(snap, out)?,
                    Err(error) => {
                        self.stats.snapshots_refused += 1;
                        tracing::warn!(from, %error, "undecodable snapshot refused");
                    }
                }
            }
            OrderMsg::Behind { last } if member => self.restart_peer(from, last),
            OrderMsg::Request(req) => self.on_request(from, req, out)?,
            OrderMsg::Behind { .. }
            | OrderMsg::Raft(_)
            | OrderMsg::Batch { .. }
            | OrderMsg::BatchAck { .. }
            | OrderMsg::FetchBatch { .. }
            | OrderMsg::FetchState { .. }
            | OrderMsg::State { .. } => {
                tracing::warn!(from, "replica message from a non-member dropped");
            }
            OrderMsg::Reply { .. } | OrderMsg::Expired { .. } => {}
        }
        Ok(())
    }

    /// A peer's log ends at `last`: if this leader believes it holds more, it starts over with
    /// it from there (probing, or a snapshot if the log here no longer reaches back).
    fn restart_peer(&mut self, peer: Addr, last: u64) {
        if self.raft.raft.state != raft::StateRole::Leader {
            return;
        }
        if let Some(pr) = self.raft.raft.mut_prs().get_mut(peer) {
            if pr.matched > last {
                tracing::warn!(
                    peer,
                    last,
                    believed = pr.matched,
                    "a replica's log ends before what it acknowledged: starting over with it"
                );
                pr.matched = last;
                pr.next_idx = last + 1;
                pr.become_probe();
                self.stats.peers_restarted += 1;
            }
        }
    }

    fn on_request(
        &mut self,
        from: Addr,
        req: Request,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        if let Some((last, outcome)) = self.clients.get(&req.client) {
            if *last >= req.seq {
                if *last == req.seq {
                    out.push(Output::Send {
                        to: from,
                        msg: outcome.message(req.client, req.seq),
                    });
                }
                return Ok(());
            }
        }
        if req.deadline_ms < self.final_time {
            // No copy ran at a final position (its client's table says so), and every later
            // position's time is past the deadline: it never runs.
            out.push(Output::Send {
                to: from,
                msg: OrderMsg::Expired {
                    client: req.client,
                    seq: req.seq,
                },
            });
            return Ok(());
        }
        self.awaiting.insert(req.client, (req.seq, from));
        if self.in_flight.insert((req.client, req.seq)) {
            if self.open.is_empty() {
                self.open_since = self.ticks;
            }
            self.open.push(req);
            if self.open.len() >= self.cfg.batch_max {
                self.seal(out)?;
            }
        }
        Ok(())
    }

    fn seal(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let id = BatchId {
            origin: self.cfg.id,
            n: self.next_batch,
        };
        self.next_batch += 1;
        let requests = std::mem::take(&mut self.open);
        self.write(&Record::Batch {
            id,
            requests: requests.clone(),
        });
        self.flush(out);
        for to in self.others().collect::<Vec<_>>() {
            out.push(Output::Send {
                to,
                msg: OrderMsg::Batch {
                    id,
                    requests: requests.clone(),
                },
            });
        }
        self.batches.insert(id, requests);
        if self.majority() <= 1 {
            self.propose(id);
        } else {
            self.unacked
                .insert(id, (BTreeSet::from([self.cfg.id]), self.ticks));
        }
        Ok(())
    }

    fn propose(&mut self, id: BatchId) {
        self.proposed.insert(id, self.ticks);
        // Dropped when there is no leader: retried after `retry_ticks`.
        self.propose_entry(id);
    }

    /// Proposes an entry ordering batch `id`, stamped with this replica's clock reading.
    fn propose_entry(&mut self, id: BatchId) {
        let _ = self
            .raft
            .propose(encode_stamp(self.now_ms), encode_entry_data(id));
    }

    fn send_raft(&mut self, msgs: Vec<Message>, out: &mut Vec<Action>) {
        for m in msgs {
            let kind = m.get_msg_type();
            if self.lost_log.refuses_vote()
                && matches!(
                    kind,
                    MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
                )
            {
                // Rejoining: it neither votes nor campaigns (with another replica that missed
                // the entries it lost, it could win without them).
                continue;
            }
            if kind == MessageType::MsgSnapshot {
                self.snapshot_to.push(m.to);
            }
            out.push(Output::Send {
                to: m.to,
                msg: OrderMsg::Raft(m.encode_to_vec()),
            });
        }
    }

    fn persist_hard_state(&mut self, hs: &HardState) {
        self.write(&Record::HardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        });
    }

    fn handle_ready(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        while self.raft.has_ready() {
            let mut rd = self.raft.ready();
            let msgs = rd.take_messages();
            self.send_raft(msgs, out);
            let mut wrote = false;
            if !rd.snapshot().is_empty() {
                let snap = rd.snapshot().clone();
                self.install(snap, out)?;
                wrote = true;
            }
            if !rd.entries().is_empty() {
                let ents = rd.take_entries();
                self.append(&ents, out)?;
                wrote = true;
            }
            if let Some(hs) = rd.hs() {
                let hs = hs.clone();
                self.persist_hard_state(&hs);
                self.raft.mut_store().set_hard_state(hs);
                wrote = true;
            }
            if wrote {
                self.flush(out);
            }
            let persisted = rd.take_persisted_messages();
            self.send_raft(persisted, out);
            if let Some(last) = rd.committed_entries().last() {
                self.commit = self.commit.max(last.index);
            }
            let mut light = self.raft.advance(rd);
            if let Some(commit) = light.commit_index() {
                self.raft.mut_store().set_commit(commit);
                let hs = self.raft.store().hard_state().clone();
                self.persist_hard_state(&hs);
                self.flush(out);
            }
            let msgs = light.take_messages();
            self.send_raft(msgs, out);
            if let Some(last) = light.committed_entries().last() {
                self.commit = self.commit.max(last.index);
            }
            self.raft.advance_apply();
        }
        // A snapshot message may be lost: report it sent, and raft-rs probes the follower
        // again (sending another snapshot if it still needs one).
        for to in std::mem::take(&mut self.snapshot_to) {
            self.raft.report_snapshot(to, SnapshotStatus::Finish);
        }
        Ok(())
    }

    /// Appends entries to the log; revokes optimistic deliveries they replace.
    fn append(&mut self, ents: &[Entry], out: &mut Vec<Action>) -> Result<(), OrderError> {
        let encoded = ents.iter().map(|e| e.encode_to_vec()).collect();
        self.write(&Record::Entries(encoded));
        if let Some(cut) = self.raft.mut_store().append(ents) {
            if cut < self.final_next {
                return Err(OrderError::Diverged {
                    cut,
                    final_next: self.final_next,
                });
            }
            self.revoke(cut, out);
            self.in_log.retain(|_, at| *at < cut);
            // The entries from `cut` on are new: no earlier write holds them.
            self.clamp_durable(cut - 1);
        }
        for e in ents {
            if let Some(id) = entry_batch(e) {
                self.in_log.insert(id, e.index);
            }
        }
        Ok(())
    }

    fn revoke(&mut self, from: u64, out: &mut Vec<Action>) {
        if from >= self.opt_next {
            return;
        }
        let from = from.max(self.final_next);
        let revoked = self.pending.split_off(&from);
        self.stats.revoked += revoked.len() as u64;
        self.pending_requests = self
            .pending
            .values()
            .flat_map(|p| {
                let ran = p.requests.iter().map(|r| (r.client, r.seq));
                ran.chain(p.expired.iter().copied())
            })
            .collect();
        self.opt_time = self
            .pending
            .values()
            .next_back()
            .map_or(self.final_time, |p| p.time);
        self.opt_next = from;
        self.machine.revoked(from);
        out.push(Output::Deliver(Delivery::Revoke { from }));
    }

    /// Whether a snapshot's state decodes (ours and the machine's), changing nothing: a
    /// snapshot from a peer that fails is refused before anything of it is taken.
    fn check_snapshot(&self, snap: &Snapshot) -> Result<(), String> {
        let data = SnapshotData::decode(&snap.data)?;
        self.machine.check_snapshot(&data.machine)
    }

    /// Takes the delivered state of a snapshot: the state machine, the clients' table, the
    /// delivered batches. Optimistic deliveries not yet final are revoked.
    fn restore_state(&mut self, snap: &Snapshot, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        let data = SnapshotData::decode(&snap.data)
            .map_err(|e| OrderError::Corrupt(format!("snapshot: {e}")))?;
        self.machine
            .restore(&data.machine)
            .map_err(OrderError::Corrupt)?;
        self.clients = data.clients();
        self.delivered_batches = data.delivered_batches.into_iter().collect();
        if self.opt_next > self.final_next {
            self.revoke(self.final_next, out);
        }
        // What the snapshot covers is done: delivered, or older than its client's last.
        let clients = &self.clients;
        self.in_flight
            .retain(|(c, seq)| clients.get(c).is_none_or(|(last, _)| seq > last));
        self.forget_delivered_batches(index);
        self.in_log.retain(|_, at| *at > index);
        self.missing = None;
        self.opt_next = index + 1;
        self.final_next = index + 1;
        self.final_time = data.log_time;
        self.opt_time = data.log_time;
        self.commit = self.commit.max(index);
        self.stats.snapshots_installed += 1;
        out.push(Output::Deliver(Delivery::Installed { seq: index }));
        Ok(())
    }

    /// A snapshot Raft hands over because this replica's log is behind the leader's first
    /// entry: it replaces the log.
    fn install(&mut self, snap: Snapshot, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        self.restore_state(&snap, out)?;
        self.write(&Record::Installed(snap.encode_to_vec()));
        self.raft.mut_store().install(snap);
        // The log after the snapshot starts anew (raft-rs installs one over entries of another
        // term too): no earlier write holds what comes next.
        self.clamp_durable(index);
        Ok(())
    }

    /// A snapshot another replica sent because this one waits for a batch nobody keeps any
    /// more. Taken only if it covers the waiting entry and lies within this replica's committed
    /// log, whose entries up to it it then replaces (the log itself stays Raft's).
    fn adopt(&mut self, snap: Snapshot, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        let usable = index >= self.opt_next
            && index <= self.commit
            && index <= self.raft.store().last()
            && index > self.raft.store().snapshot_index();
        if !usable {
            return Ok(());
        }
        self.restore_state(&snap, out)?;
        self.raft.mut_store().compact(snap);
        self.rewrite_disk(out)
    }

    fn want(&mut self, id: BatchId, out: &mut Vec<Action>) {
        let due = self
            .fetch_sent
            .get(&id)
            .is_none_or(|at| self.ticks >= at + self.cfg.retry_ticks);
        if due {
            self.fetch_sent.insert(id, self.ticks);
            for to in self.others().collect::<Vec<_>>() {
                out.push(Output::Send {
                    to,
                    msg: OrderMsg::FetchBatch { id },
                });
            }
        }
    }

    fn deliver(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        while self.opt_next <= self.raft.store().last() {
            let seq = self.opt_next;
            let entry = self.raft.store().entry(seq);
            let batch = entry.and_then(entry_batch);
            let time = self.opt_time.max(entry.map_or(0, entry_stamp));
            let duplicate = batch.is_some_and(|id| {
                self.delivered_batches.contains(&id)
                    || self.pending.values().any(|p| p.batch == Some(id))
            });
            // What decides expiry: the log's time, unless a planted bug makes it the clock.
            let expiry_time = match self.cfg.planted_bug {
                Some(PlantedBug::ExpireByOwnClock) => self.now_ms,
                _ => time,
            };
            let admission = match batch {
                Some(id) if !duplicate => match self.batches.get(&id) {
                    Some(reqs) => {
                        admit_newest(reqs, expiry_time, &self.clients, &mut self.pending_requests)
                    }
                    None => {
                        if self.missing.is_none_or(|(m, _)| m != id) {
                            self.missing = Some((id, self.ticks));
                        }
                        self.want(id, out);
                        break;
                    }
                },
                _ => Admission {
                    admitted: Vec::new(),
                    expired: Vec::new(),
                },
            };
            let requests = admission.admitted;
            self.machine.optimistic(seq, &requests);
            out.push(Output::Deliver(Delivery::Opt {
                seq,
                requests: requests.clone(),
            }));
            self.pending.insert(
                seq,
                Pending {
                    batch: if duplicate { None } else { batch },
                    requests,
                    expired: admission.expired,
                    time,
                },
            );
            self.opt_time = time;
            self.opt_next += 1;
            self.stats.opt_delivered += 1;
            self.missing = None;
        }
        let committed = match self.cfg.planted_bug {
            Some(PlantedBug::FinalBeforeCommit) => self.raft.store().last(),
            Some(PlantedBug::ApplyBeforeDurable) => self.commit,
            None | Some(PlantedBug::ExpireByOwnClock) => self.commit.min(self.durable_index),
        };
        while self.final_next <= committed && self.final_next < self.opt_next {
            let seq = self.final_next;
            let Some(p) = self.pending.remove(&seq) else {
                break;
            };
            for &(client, seq) in &p.expired {
                self.pending_requests.remove(&(client, seq));
                self.in_flight.remove(&(client, seq));
                self.record_last(client, seq, Last::Expired, out);
            }
            for (index, r) in p.requests.iter().enumerate() {
                self.pending_requests.remove(&(r.client, r.seq));
                let response = self.machine.apply_final(seq, index as u32, r);
                self.in_flight.remove(&(r.client, r.seq));
                self.record_last(r.client, r.seq, Last::Answered(response), out);
                self.stats.requests_delivered += 1;
            }
            if let Some(id) = p.batch {
                // Requests of the batch that were not delivered (older than one of their
                // client's already ordered) are done too: they never run.
                if let Some(requests) = self.batches.get(&id) {
                    for r in requests {
                        self.in_flight.remove(&(r.client, r.seq));
                    }
                }
                self.delivered_batches.insert(id);
                self.proposed.remove(&id);
                self.fetch_sent.remove(&id);
            }
            for text in self.machine.take_alarms() {
                out.push(Output::Deliver(Delivery::Alarm { seq, text }));
            }
            out.push(Output::Deliver(Delivery::Final {
                seq,
                time_ms: p.time,
            }));
            self.final_time = p.time;
            self.final_next += 1;
            self.stats.final_delivered += 1;
        }
        self.maybe_snapshot(out)
    }

    /// Request `seq` of `client` was finally delivered with `outcome`: its client's table
    /// keeps it if it is the client's highest, and a client waiting for it here hears of it.
    fn record_last(&mut self, client: u64, seq: u64, outcome: Last, out: &mut Vec<Action>) {
        if let Some(&(wanted, to)) = self.awaiting.get(&client) {
            if wanted == seq {
                self.awaiting.remove(&client);
                out.push(Output::Send {
                    to,
                    msg: outcome.message(client, seq),
                });
            }
        }
        if self
            .clients
            .get(&client)
            .is_none_or(|(last, _)| *last < seq)
        {
            self.clients.insert(client, (seq, outcome));
        }
    }

    /// Takes a snapshot at the last finally delivered entry once `snapshot_every` entries have
    /// been delivered since the last one; compacts the log and rewrites the disk.
    fn maybe_snapshot(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let applied = self.final_next - 1;
        let base = self.raft.store().snapshot_index();
        if applied < base + self.cfg.snapshot_every.max(1) {
            return Ok(());
        }
        let Some(term) = self.raft.store().term_of(applied) else {
            return Ok(());
        };
        let machine = self.machine.snapshot();
        if let Err(why) = self.machine.check_snapshot(&machine) {
            // Compacting would leave a log this replica could not restart from: keep the log.
            self.stats.snapshots_failed += 1;
            out.push(Output::Warn(format!(
                "no snapshot taken at {applied} (the log is kept whole): the state machine's \
                 snapshot does not pass its own check: {why}"
            )));
            return Ok(());
        }
        let data = SnapshotData::new(
            machine,
            &self.clients,
            &self.delivered_batches,
            self.final_time,
        );
        let mut snap = Snapshot {
            data: postcard::to_stdvec(&data).map_err(|e| OrderError::Corrupt(e.to_string()))?,
            ..Snapshot::default()
        };
        let meta = snap.mut_metadata();
        meta.index = applied;
        meta.term = term;
        meta.set_conf_state(self.raft.store().conf_state().clone());
        self.raft.mut_store().compact(snap);
        self.forget_delivered_batches(applied);
        self.rewrite_disk(out)?;
        self.stats.snapshots_taken += 1;
        Ok(())
    }

    /// Drops the contents of delivered batches whose entries are at or before `index`: only
    /// entries still in the log need them.
    fn forget_delivered_batches(&mut self, index: u64) {
        let gone: Vec<BatchId> = self
            .in_log
            .iter()
            .filter(|(id, at)| **at <= index && self.delivered_batches.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.in_log.remove(&id);
            self.batches.remove(&id);
        }
    }

    /// Rewrites the disk with what the replica holds now: its snapshot, the entries after it,
    /// the hard state, the batches it keeps.
    fn rewrite_disk(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        let store = self.raft.store();
        let snap = store.latest_snapshot();
        let mut records = vec![Record::Installed(snap.encode_to_vec())];
        let rest: Vec<Vec<u8>> = store
            .entries_from(store.first())
            .iter()
            .map(|e| e.encode_to_vec())
            .collect();
        if !rest.is_empty() {
            records.push(Record::Entries(rest));
        }
        let hs = store.hard_state();
        records.push(Record::HardState {
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
        });
        records.extend(self.batches.iter().map(|(id, requests)| Record::Batch {
            id: *id,
            requests: requests.clone(),
        }));
        if self.lost_log.rejoining() {
            records.push(Record::Rejoining);
        } else if self.cfg.rejoin {
            // The setting may stay on: the log must keep saying that it caught up.
            records.push(Record::Rejoined);
        }
        // Records queued before go first (the rewrite holds their facts too, but a write
        // emitted earlier is never dropped).
        self.flush(out);
        self.emit_write(
            Write::Rewrite(records.iter().map(Record::encode).collect()),
            out,
        );
        Ok(())
    }
}

impl<S: StateMachine> Machine for Replica<S> {
    type Msg = OrderMsg;
    type Request = Command;
    type Delivery = Delivery;
    type Error = OrderError;

    /// Reacts to one input; appends messages to send, disk writes and deliveries to `out`
    /// (every record a message or delivery depends on is written before it: see
    /// [`atomos_seam`]). The replica counts its timers in ticks; `now` (milliseconds since the
    /// Unix epoch in production) is only stamped on the entries it proposes.
    fn step(&mut self, now: u64, input: Input, out: &mut Vec<Action>) -> Result<(), OrderError> {
        self.now_ms = now;
        match input {
            Input::Tick => self.tick(out)?,
            Input::Request(Command::Flush) => {
                if !self.open.is_empty() {
                    self.seal(out)?;
                }
            }
            Input::Message { from, msg } => self.on_message(from, msg, out)?,
            // Writes are ordered before what depends on them; nothing waits for this.
            Input::Persisted { through } => self.persisted(through),
        }
        self.handle_ready(out)?;
        self.deliver(out)?;
        self.flush(out);
        let leads = self.raft.raft.state == raft::StateRole::Leader;
        if self
            .lost_log
            .caught_up(self.raft.raft.raft_log.committed, leads)
        {
            tracing::info!(
                node = self.cfg.id,
                "caught up after losing its log: voting again"
            );
            self.write(&Record::Rejoined);
            self.flush(out);
        }
        Ok(())
    }
}
