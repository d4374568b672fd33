//! One OS-Paxos replica: a Raft core (raft-rs `RawNode`) that orders batch ids, S-Paxos batch
//! dissemination around it, optimistic and final delivery, client deduplication, persistence,
//! snapshots. A deterministic state machine behind the protocol seam (its
//! [`Machine::step`] takes a tick, a message, a flush request or a persistence confirmation
//! and appends what to send, write and deliver); it reads no clock, owns no socket or file and
//! logs nothing (what an operator should know goes out as [`Output::Warn`]).
//!
//! Its state is split by owner, each part in a module of its own:
//! - [`dissemination`]: the batches formed, sent, acknowledged, proposed and fetched;
//! - [`delivery`]: optimistic and final delivery, revocation, the log's time;
//! - [`clients`]: deduplication in log order and the answers owed to waiting clients (pure);
//! - [`snapshot`]: snapshots, compaction, state transfer;
//! - [`consensus`]: the Raft glue (checked messages in, `Ready` out);
//! - [`reconfigure`]: membership changes, proposed by the leader and applied from the log;
//! - [`disk`]: which writes are emitted and which durable.
//!
//! Requests are deduplicated in log order, so every replica drops the same duplicates: a
//! request is delivered only if its number is above every number its client had delivered
//! (finally or optimistically) at earlier positions, a function of the log prefix alone. A
//! request whose deadline is before the log's time at its entry expires there (it never runs,
//! and counts as its client's latest request), on every replica alike; a copy that reaches a
//! replica whose final log time is past its deadline is answered at once.

mod clients;
mod config;
mod consensus;
mod delivery;
mod disk;
mod dissemination;
mod entries;
mod reconfigure;
mod seed;
mod snapshot;
mod transfer;

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use raft::eraftpb::{Entry, HardState, Snapshot};
use raft::RawNode;

use atomos_seam::stable::SplitMix64;
use atomos_seam::{Bytes, Machine, Output};
use rand_core::{RngCore, SeedableRng};

pub use config::{Command, Input, OrderStats, PlantedBug, ReplicaConfig};
pub use seed::SnapshotCopy;
pub use transfer::StreamProgress;

use crate::error::OrderError;
use crate::log_store::LogStore;
use crate::logging::raft_logger;
use crate::lost_log::LostLog;
use crate::membership::Membership;
use crate::record::Record;
use crate::types::{Action, Addr, Delivery, OrderMsg, Request, StateMachine};
use clients::{ClientTable, Reception};
use consensus::{raft_config, warn};
use delivery::Deliveries;
use disk::Disk;
use dissemination::Batches;
use entries::{entry_batch, fresh_batch_base};
use snapshot::{Image, SnapshotData};
use transfer::Streams;

/// One replica. `S` is the replicated state machine.
pub struct Replica<S> {
    cfg: ReplicaConfig,
    raft: RawNode<LogStore>,
    machine: S,
    disk: Disk,
    batches: Batches,
    delivery: Deliveries,
    clients: ClientTable,
    rng: SplitMix64,
    ticks: u64,
    /// The clock reading of the current step (milliseconds since the Unix epoch in
    /// production): what this replica stamps on the entries it proposes.
    now_ms: u64,
    /// The configuration in force (the latest one applied from the log).
    members: Membership,
    /// A snapshot is due at the next delivery (or once an encoding under way is done),
    /// whatever `snapshot_every` says: raft-rs wanted one the latest could not serve, or a
    /// change was applied to a log that still starts at the founding (see `reconfigure`).
    snapshot_due: bool,
    /// The log's time at the latest snapshot (taken, installed or opened): no entry the log
    /// holds is older (see `Batches::forget_lapsed`).
    snapshot_time: u64,
    /// A snapshot raft-rs wants is not taken before this tick: the last one failed (the host
    /// could not encode the state, or it did not pass its check), and raft-rs asks at every
    /// heartbeat.
    snapshot_retry_at: u64,
    /// The state machine's state at the latest snapshot's position.
    image: Image,
    /// A snapshot taken but for the state machine's state, which the host is encoding (see
    /// `Replica::maybe_snapshot`).
    encoding: Option<Snapshot>,
    /// The state streamed with a Raft snapshot message, until raft-rs hands the snapshot over
    /// to install (in the step that brought it) or refuses it.
    incoming_image: Option<Image>,
    /// The log on the disk must be rewritten before anything is appended to it (it ends in a
    /// torn install that replay dropped).
    rewrite_first: bool,
    /// Snapshots streamed to other replicas, and from them.
    streams: Streams,
    /// Whether this replica's log is known to have lost entries (see `lost_log`).
    lost_log: LostLog,
    /// How far the others delivered, as they report it to this replica when it leads.
    progress: reconfigure::Progress,
    stats: OrderStats,
}

/// What a replica's log held when it opened.
struct Replayed {
    store: LogStore,
    batches: BTreeMap<crate::types::BatchId, Vec<Request>>,
    /// What the log says of rejoining: still at it, caught up since, or nothing.
    rejoining: Option<bool>,
    /// The state machine's state at the latest snapshot, if the log holds it beside the
    /// snapshot (logs of earlier builds hold it inside).
    image: Option<Image>,
    /// Whether the log ended in an install torn before its state was written (dropped).
    torn_install: bool,
    /// Whether the log holds anything.
    empty: bool,
}

/// Drops a snapshot install whose state never reached the disk: the write that held the
/// snapshot, its marker and its state was torn after the snapshot (or its marker), so the log
/// ends there. Nothing after the install was sent before the whole write was durable, so the
/// log is read as if the install had not begun. Returns whether it dropped one: the disk still
/// holds its records, which later appends would follow (a marker would then take the next
/// record for the state), so the replica rewrites its log before it writes anything else.
fn drop_torn_install(log: &mut Vec<Record>) -> bool {
    let lacks_state = |bytes: &[u8]| {
        Snapshot::decode(bytes).is_ok_and(|snap| {
            snap.get_metadata().index > 0
                && SnapshotData::decode(&snap.data).is_ok_and(|data| data.machine.is_empty())
        })
    };
    let torn_from = match log.as_slice() {
        [.., Record::Installed(_), Record::ImageFollows { .. }] => log.len() - 2,
        [.., Record::Installed(bytes)] if lacks_state(bytes) => log.len() - 1,
        _ => return false,
    };
    log.truncate(torn_from);
    true
}

/// Replays a replica's records into its log store and batches.
fn replay(replicas: Vec<Addr>, mut log: Vec<Record>) -> Result<Replayed, OrderError> {
    let torn_install = drop_torn_install(&mut log);
    let mut replayed = Replayed {
        store: LogStore::new(replicas),
        batches: BTreeMap::new(),
        rejoining: None,
        image: None,
        torn_install,
        empty: log.is_empty(),
    };
    let mut image_of = None;
    let corrupt = |e: &dyn std::fmt::Display| OrderError::Corrupt(e.to_string());
    for record in log {
        match record {
            Record::Entries(list) => {
                let ents = list
                    .iter()
                    .map(|b| Entry::decode(b.as_slice()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| corrupt(&e))?;
                replayed.store.append(&ents).map_err(|e| corrupt(&e))?;
            }
            Record::HardState { term, vote, commit } => {
                let mut hs = HardState::default();
                (hs.term, hs.vote, hs.commit) = (term, vote, commit);
                replayed.store.set_hard_state(hs);
            }
            Record::Installed(bytes) => {
                let snap = Snapshot::decode(bytes.as_slice()).map_err(|e| corrupt(&e))?;
                replayed.store.install(snap);
            }
            Record::Batch { id, requests } => {
                replayed.batches.insert(id, requests);
            }
            Record::BatchWithoutDeadlines { id, requests } => {
                let requests = requests.into_iter().map(Request::from).collect();
                replayed.batches.insert(id, requests);
            }
            Record::Rejoining => replayed.rejoining = Some(true),
            Record::Rejoined => replayed.rejoining = Some(false),
            Record::Founders(voters) => replayed.store.found(voters),
            Record::ImageFollows { index } => image_of = Some(index),
            Record::Image(bytes) => {
                let index = image_of.take().ok_or_else(|| {
                    OrderError::Corrupt("a snapshot's state without its marker".into())
                })?;
                replayed.image = Some(Image {
                    index,
                    bytes: bytes.into(),
                });
            }
        }
    }
    Ok(replayed)
}

impl<S: StateMachine> Replica<S> {
    /// Opens replica `cfg.id` from the records its disk holds ([`crate::decode_log`]; none for a
    /// new replica) and starts Raft where the log left off. `machine` must be in its initial
    /// state.
    pub fn open(cfg: ReplicaConfig, log: Vec<Record>, mut machine: S) -> Result<Self, OrderError> {
        if cfg.id == 0 || !(cfg.replicas.is_empty() || cfg.replicas.contains(&cfg.id)) {
            return Err(OrderError::Config(format!(
                "replica id {} must be non-zero and among the founding replicas {:?} (or \
                 join with none)",
                cfg.id, cfg.replicas
            )));
        }
        let Replayed {
            mut store,
            batches,
            rejoining,
            image,
            torn_install,
            empty,
        } = replay(cfg.replicas.clone(), log)?;
        let base = store.snapshot_index();
        let mut clients = ClientTable::default();
        let ends_early = match cfg.planted_bug {
            Some(PlantedBug::SessionEndsEarly) => 100,
            _ => 0,
        };
        let mut delivered = BTreeMap::new();
        let mut log_time = 0;
        let mut contexts = BTreeMap::new();
        let mut removed = Vec::new();
        let mut held = Image::default();
        if base > 0 {
            let mut data = SnapshotData::decode(&store.latest_snapshot().data)
                .map_err(|e| OrderError::Corrupt(format!("snapshot: {e}")))?;
            held = if data.machine.is_empty() {
                image.filter(|i| i.index == base).ok_or_else(|| {
                    OrderError::Corrupt(format!("the snapshot of {base} has no state beside it"))
                })?
            } else {
                // An earlier build's snapshot, the state inside: taken out, so that the
                // snapshot raft-rs holds and sends is as small as this build's.
                let bytes = Bytes::from(std::mem::take(&mut data.machine));
                store.replace_snapshot_data(
                    postcard::to_stdvec(&data)
                        .map_err(|e| OrderError::Corrupt(format!("snapshot: {e}")))?,
                );
                Image { index: base, bytes }
            };
            machine
                .restore_shared(&held.bytes)
                .map_err(OrderError::Corrupt)?;
            clients = ClientTable::from_sessions(data.sessions(), data.forgotten());
            log_time = data.log_time;
            contexts = data.member_contexts();
            removed = data.removed.clone();
            delivered = data.delivered();
        }
        clients.end_sessions_early(ends_early);
        let members = Membership::of(store.conf_state(), &contexts).with_removed(removed);
        let commit = store.hard_state().commit.max(base);
        let in_log = store
            .entries_from(store.first())
            .iter()
            .filter_map(|e| Some((entry_batch(e)?, e.index)))
            .collect();
        // Batch numbers must never repeat, but a log does not always remember every number this
        // replica used (its disk may have been wiped, and its log may hold some of an earlier
        // run's batches, received back from peers, but not the last): each start numbers from
        // a base of its own drawn from its seed, which the runtime draws anew at each start.
        let batches = Batches::new(
            cfg.id,
            batches,
            delivered,
            in_log,
            fresh_batch_base(cfg.seed),
        );
        let raft = RawNode::new(&raft_config(&cfg, base), store, &raft_logger())?;
        // Told to rejoin and the log does not show it caught up since (an operator may leave
        // the setting on), or the log says an earlier start was still rejoining.
        let rejoin = rejoining.unwrap_or(cfg.rejoin);
        // A founder's log starts with the founding replicas, so that a restart starts from
        // them whatever the replica is configured with by then.
        let mut queued = Vec::new();
        if empty && !cfg.replicas.is_empty() {
            queued.push(Record::Founders(cfg.replicas.clone()));
        }
        // Written before anything else this start writes, so a crash before catching up
        // restarts rejoining, whatever the configuration says then.
        if rejoin && rejoining.is_none() {
            queued.push(Record::Rejoining);
        }
        // What the log held at start is on the disk.
        let disk = Disk::new(raft.store().last(), queued);
        let stream_base = SplitMix64::seed_from_u64(
            cfg.seed
                ^ 0xbb67_ae85_84ca_a73b
                ^ raft.store().last().rotate_left(17)
                ^ raft.store().hard_state().term.rotate_left(41),
        )
        .next_u64();
        Ok(Replica {
            raft,
            machine,
            disk,
            batches,
            delivery: Deliveries::new(base, log_time, commit),
            clients,
            rng: SplitMix64::seed_from_u64(cfg.seed ^ 0x6a09_e667_f3bc_c908),
            ticks: 0,
            now_ms: 0,
            members,
            snapshot_due: false,
            snapshot_time: log_time,
            snapshot_retry_at: 0,
            image: held,
            encoding: None,
            incoming_image: None,
            rewrite_first: torn_install,
            // Stream numbers of this start: drawn from its seed and where its log stands (a
            // caller that gives every start the same seed still numbers each start apart),
            // apart from the generator that times its ticks.
            streams: Streams::new(&cfg, stream_base),
            lost_log: LostLog::new(rejoin),
            progress: reconfigure::Progress::default(),
            stats: OrderStats::default(),
            cfg,
        })
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
        while replica.has_backlog() {
            replica.step(0, Input::Request(Command::Flush), &mut ignored)?;
        }
        let applied = replica.delivery.final_next - 1;
        Ok((replica.machine, applied))
    }

    /// This replica's address (its Raft id).
    pub fn id(&self) -> Addr {
        self.cfg.id
    }

    /// The replicated state machine.
    pub fn machine(&self) -> &S {
        &self.machine
    }

    /// The replicated state machine, to take what it recorded while applying (events for the
    /// node it runs on). Changing its state here would part this replica from the others.
    pub fn machine_mut(&mut self) -> &mut S {
        &mut self.machine
    }

    /// Whether this replica still rejoins after losing its log (it votes once caught up),
    /// or has not delivered every entry it knows committed yet (a rejoined replica may still
    /// fetch the batches of old entries).
    pub fn rejoining(&self) -> bool {
        self.lost_log.rejoining() || self.delivery.final_next <= self.delivery.commit
    }

    /// Whether the last step left entries it could have delivered for the next one (it
    /// delivers at most [`ReplicaConfig::deliveries_per_step`] each way): its host should
    /// step it again soon (any input goes on), without waiting for a message or a tick, after
    /// taking the messages waiting for it.
    pub fn has_backlog(&self) -> bool {
        self.delivery.cut_short
    }

    /// Whether this replica rebuilds a lost log (it does not vote until it caught up).
    pub fn lost_log(&self) -> bool {
        self.lost_log.rejoining()
    }

    /// Counters since this replica started.
    pub fn stats(&self) -> OrderStats {
        self.stats
    }

    /// Requests this replica took into its batches that are not delivered or dropped yet
    /// (bookkeeping that must not grow with the requests it has served).
    pub fn requests_in_flight(&self) -> usize {
        self.batches.in_flight()
    }

    /// Whether this replica is the Raft leader now.
    pub fn is_leader(&self) -> bool {
        self.raft.raft.state == raft::StateRole::Leader
    }

    /// The current Raft term (it grows with every election).
    pub fn term(&self) -> u64 {
        self.raft.raft.term
    }

    /// How far the snapshot streams this replica sends (first) and receives (second) have
    /// come.
    pub fn stream_progress(&self) -> (StreamProgress, StreamProgress) {
        (
            self.streams.senders.progress(),
            self.streams.receivers.progress(),
        )
    }

    /// The size in bytes of the latest snapshot this replica holds (0 before the first).
    pub fn snapshot_bytes(&self) -> usize {
        self.raft.store().latest_snapshot().data.len() + self.image.bytes.len()
    }

    /// The first and last positions of the entries this replica's log holds in memory (the
    /// first is past the latest snapshot's position unless entries before it are kept for
    /// replicas that catch up; see `Replica::maybe_snapshot`).
    pub fn log_span(&self) -> (u64, u64) {
        let store = self.raft.store();
        (store.first(), store.last())
    }

    /// What this replica remembers of batches: the ids delivered that it still knows (each
    /// forgotten once the final log time is past its lapse and the log no longer holds it),
    /// and the batches whose contents it holds.
    pub fn remembered_batches(&self) -> (usize, usize) {
        (self.batches.delivered.len(), self.batches.held.len())
    }

    /// How many client sessions this replica's table holds: the clients whose latest
    /// deadline the log's time has not passed yet.
    pub fn sessions(&self) -> usize {
        self.clients.sessions().len()
    }

    /// The position of the latest snapshot this replica holds (0 before the first).
    pub fn snapshot_index(&self) -> u64 {
        self.raft.store().snapshot_index()
    }

    /// The next position to be finally delivered.
    pub fn final_next(&self) -> u64 {
        self.delivery.final_next
    }

    /// The leader this replica follows or is (`None` while an election runs, or while it hears
    /// from no majority: a leader that hears from none steps down, and a follower that misses
    /// its heartbeats starts an election).
    pub fn leader(&self) -> Option<Addr> {
        let id = self.raft.raft.leader_id;
        (id != raft::INVALID_ID).then_some(id)
    }

    /// The highest position Raft reported committed here. A follower learns no commit past its
    /// own log: how far the leader's log runs ahead is not known here.
    pub fn commit(&self) -> u64 {
        self.delivery.commit
    }

    /// The log's time at the last finally delivered entry (see [`Delivery::Final`]): a
    /// request with an earlier deadline that has not run by now never will.
    pub fn log_time(&self) -> u64 {
        self.delivery.final_time
    }

    /// A one-line account of where this replica stands (for diagnostics).
    pub fn describe(&self) -> String {
        let store = self.raft.store();
        let d = &self.delivery;
        format!(
            "replica {}: {:?} term {}, log {}..={}, commit {}, opt_next {}, final_next {}, waiting for batch {:?}, {:?}",
            self.cfg.id,
            self.raft.raft.state,
            self.raft.raft.term,
            store.first(),
            store.last(),
            d.commit,
            d.opt_next,
            d.final_next,
            d.missing,
            self.stats
        )
    }

    /// The membership in force here (the latest configuration applied from the log).
    pub fn membership(&self) -> &Membership {
        &self.members
    }

    /// Whether `holders` hold a batch safely enough to order it: a quorum of the
    /// configuration in force (unless a planted bug counts the founding replicas instead).
    fn quorum(&self, holders: &BTreeSet<Addr>) -> bool {
        if self.cfg.planted_bug == Some(PlantedBug::FoundingQuorum) {
            let held = self.cfg.replicas.iter().filter(|r| holders.contains(r));
            return held.count() > self.cfg.replicas.len() / 2;
        }
        self.members.quorum(holders)
    }

    /// The other members (voters and learners), and the leader if this replica does not know
    /// it as one (it lags behind a change of members: the leader can still help it).
    fn others(&self) -> Vec<Addr> {
        let me = self.cfg.id;
        let mut others: Vec<Addr> = self
            .members
            .all()
            .into_iter()
            .filter(|&r| r != me)
            .collect();
        if let Some(leader) = self.leader().filter(|&l| l != me && !others.contains(&l)) {
            others.push(leader);
        }
        others
    }

    /// Whether this replica takes state from `from` (a snapshot, a stream, word that its log
    /// is behind): a member, the leader, or anyone while it knows no configuration (it joins
    /// and waits for the leader's snapshot).
    fn trusts(&self, from: Addr) -> bool {
        self.members.contains(from) || self.leader() == Some(from) || self.members.is_empty()
    }

    /// Queues a record for the next disk write.
    fn write(&mut self, record: &Record) {
        self.disk.queue(record);
    }

    /// Emits the queued records as one disk write: whatever is emitted after it waits until
    /// they are durable.
    fn flush(&mut self, out: &mut Vec<Action>) {
        if let Some(write) = self.disk.flush(self.raft.store().last()) {
            out.push(Output::Persist(write));
        }
    }

    fn tick(&mut self, out: &mut Vec<Action>) {
        self.ticks += 1;
        // One tick in eight is skipped, at random: replicas whose election timers started
        // together drift apart, so split votes do not repeat forever.
        if !self.rng.next_u64().is_multiple_of(8) {
            self.raft.tick();
        }
        self.seal_due(false, out);
        self.retry_dissemination(out);
        self.unstick(out);
        self.tick_streams(out);
        self.report_progress(out);
    }

    /// A message from `from`. Raft messages and batches are taken from any replica (a replica
    /// that lags may not know of the newest members yet; raft-rs's terms and pre-votes keep a
    /// removed replica that still runs from disturbing the others, its acknowledgements count
    /// in no quorum and its forwarded proposals are dropped); what replaces state here only
    /// from replicas it [`trusts`].
    ///
    /// [`trusts`]: Replica::trusts
    fn on_message(
        &mut self,
        from: Addr,
        msg: OrderMsg,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let replaces_state = matches!(
            msg,
            OrderMsg::State { .. }
                | OrderMsg::StreamOffer { .. }
                | OrderMsg::StreamChunk { .. }
                | OrderMsg::Behind { .. }
        );
        if replaces_state && !self.trusts(from) {
            // Reported once, then counted: a removed replica that still runs sends on.
            self.stats.from_non_members += 1;
            if self.stats.from_non_members == 1 {
                warn(
                    out,
                    format!(
                        "state from non-member {from} dropped (further messages from \
                         non-members are only counted)"
                    ),
                );
            }
            return Ok(());
        }
        match msg {
            OrderMsg::Raft(bytes) => self.on_raft(from, &bytes, out),
            OrderMsg::Batch { requests, .. } if requests.is_empty() => {
                // No replica seals an empty batch; taking one would deliver nothing where the
                // others deliver the batch's requests.
                warn(out, format!("empty batch from {from} refused"));
            }
            OrderMsg::Batch { id, requests } => self.on_batch(from, id, requests, out),
            OrderMsg::BatchAck { id } => self.on_batch_ack(from, id),
            OrderMsg::Delivered { through } => self.on_delivered(from, through),
            OrderMsg::FetchBatch { id } => self.on_fetch_batch(from, id, out),
            OrderMsg::FetchState { after } => self.on_fetch_state(from, after, out),
            OrderMsg::State { .. } => self.on_whole_state(from, out),
            OrderMsg::Behind { last } => self.restart_peer(from, last, out),
            OrderMsg::StreamOffer {
                stream,
                kind,
                total,
                checksum,
            } => self.on_stream_offer(from, stream, kind, total, checksum, out),
            OrderMsg::StreamChunk {
                stream,
                offset,
                data,
            } => self.on_stream_chunk(from, stream, offset, &data, out)?,
            OrderMsg::StreamAck { stream, next } => self.on_stream_ack(from, stream, next, out),
            OrderMsg::StreamRefused { stream, reason } => self
                .streams
                .senders
                .on_refused(self.ticks, from, stream, reason),
            OrderMsg::Request(req) => self.on_request(from, req, out),
            OrderMsg::Reply { .. } | OrderMsg::Expired { .. } | OrderMsg::Unknown { .. } => {}
        }
        Ok(())
    }

    /// A client's request: answered from the clients' table if decided, else ordered. A
    /// replica that is no member (removed, or joining) drops it: the client fails over.
    fn on_request(&mut self, from: Addr, req: Request, out: &mut Vec<Action>) {
        if !self.members.contains(self.cfg.id) {
            return;
        }
        match self.clients.receive(from, &req, self.delivery.final_time) {
            Reception::Answer(msg) => out.push(Output::Send { to: from, msg }),
            Reception::Drop => {}
            Reception::Order => self.take_request(req, out),
        }
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
        self.delivery.new_step(self.cfg.deliveries_per_step);
        if std::mem::take(&mut self.rewrite_first) {
            self.rewrite_log(out);
        }
        match input {
            Input::Tick => self.tick(out),
            Input::Request(Command::Flush) => self.seal_due(true, out),
            Input::Request(Command::ChangeMembership { ticket, change }) => {
                self.change_membership(ticket, change, out)
            }
            Input::Request(Command::SnapshotNow) => {
                self.snapshot_due = true;
                self.maybe_snapshot(out)?;
            }
            Input::Request(Command::SnapshotEncoded { seq, state }) => {
                self.on_snapshot_encoded(seq, state, out)
            }
            Input::Message { from, msg } => self.on_message(from, msg, out)?,
            // Writes are ordered before what depends on them; nothing waits for this.
            Input::Persisted { through } => self.disk.persisted(through),
        }
        // Applying an entry can make raft-rs ready again (leaving a joint configuration, or
        // stepping down after its own removal).
        loop {
            self.handle_ready(out)?;
            self.deliver(out)?;
            self.sync_applied();
            if !self.raft.has_ready() {
                break;
            }
        }
        // A state that came with a snapshot raft-rs did not take is not kept.
        self.incoming_image = None;
        self.flush(out);
        if self
            .lost_log
            .caught_up(self.raft.raft.raft_log.committed, self.is_leader())
        {
            warn(
                out,
                format!(
                    "replica {} caught up after losing its log: voting again",
                    self.cfg.id
                ),
            );
            self.write(&Record::Rejoined);
            self.flush(out);
        }
        Ok(())
    }
}
