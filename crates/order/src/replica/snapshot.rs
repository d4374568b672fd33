//! Snapshots and state transfer. Once `snapshot_every` finally delivered entries hold an eighth
//! of the state's size, and when raft-rs wants to send a replica a snapshot the latest cannot
//! serve (a learner added since it, see `reconfigure`), a replica snapshots its state (the state machine's, encoded off its step when the machine can
//! pin it; the clients' table, the delivered batches, the log's time), compacts its log and
//! rewrites its disk. Raft's snapshot holds only the replica's own tables; the state
//! machine's state at that position, its [`Image`], lies beside it, shared (never copied) by
//! the disk writes and the streams that carry it, so that raft-rs, which copies snapshots
//! freely, never holds a copy of the whole state. A replica whose log is behind the
//! leader's first entry gets a snapshot through Raft (`install`); one that waits for a batch
//! nobody keeps any more (it was away while the others compacted) asks the others for their
//! latest snapshot and adopts it (`adopt`). A snapshot from a peer whose state does not decode
//! is refused before anything of it is taken.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use raft::eraftpb::{Message, MessageType, Snapshot};
use raft::SnapshotStatus;
use serde::{Deserialize, Serialize};

use atomos_seam::{Bytes, Output, Write};

use super::clients::{Forgotten, Last, Session};
use super::config::PlantedBug;
use super::transfer::{Offer, Parts, Received, Sent};
use super::Replica;
use crate::error::OrderError;
use crate::membership::Membership;
use crate::record::Record;
use crate::types::{
    Action, Addr, BatchId, Delivery, EncodeJob, OrderMsg, StateMachine, StreamHeader, StreamKind,
};

/// Batch bytes a snapshot always lets the entries since the previous one keep: the newest of
/// them stay while their batches hold at most this or a quarter of the state's size,
/// whichever is larger (see `Replica::finish_snapshot`).
const KEEP_BATCH_BYTES_MIN: u64 = 1 << 20;

/// Retry periods a snapshot raft-rs wants waits after one failed (ten seconds at the
/// defaults of an order node).
const RETRY_FAILED: u64 = 100;

/// A snapshot is taken once the log since the last one holds at least the state's size over
/// this (and `snapshot_every` entries): the log then costs at most an eighth of the state in
/// memory, and rewriting the state costs at most eight bytes per byte the log took in.
const STATE_PER_LOG_BYTE: u64 = 8;

/// The state machine's state at a snapshot's position, as it encodes it: kept beside Raft's
/// snapshot, shared by the disk writes and the streams that carry it.
#[derive(Clone, Debug, Default)]
pub(super) struct Image {
    /// The snapshot's index (0: none taken or received).
    pub(super) index: u64,
    /// The state.
    pub(super) bytes: Bytes,
}

/// What a snapshot holds besides Raft's metadata. Fields are only ever appended (postcard
/// encodes them in order), so a snapshot written by an earlier build decodes as a prefix.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotData {
    /// The state machine's state, in snapshots of earlier builds; empty since the state lies
    /// beside the snapshot as its [`Image`].
    pub(super) machine: Vec<u8>,
    /// Per client: its latest request's number and answer (empty if it expired).
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
    /// The log's time at the snapshot's position.
    pub(super) log_time: u64,
    /// The clients whose latest request expired.
    expired: Vec<u64>,
    /// The contexts the members that joined through the log were added with.
    members: Vec<(u64, Vec<u8>)>,
    /// The replicas changes removed (see `Membership::removed`).
    pub(super) removed: Vec<u64>,
    /// When each of `delivered_batches` lapses, in the same order.
    delivered_lapses: Vec<u64>,
    /// Until when each client of `clients` has its session, in the same order...
    session_until: Vec<u64>,
    /// ...and since when.
    session_since: Vec<u64>,
    /// The clients whose latest request expired with its outcome unknown (see
    /// `clients::Last::Unknown`).
    unknown: Vec<u64>,
    /// Per bucket of clients, the forgotten session that lived latest: (bucket, until,
    /// client, latest number, since).
    forgotten: Vec<(u16, u64, u64, u64, u64)>,
}

/// A snapshot as builds before client sessions ended wrote it.
#[derive(Deserialize)]
struct SnapshotDataWithoutSessions {
    machine: Vec<u8>,
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
    log_time: u64,
    expired: Vec<u64>,
    members: Vec<(u64, Vec<u8>)>,
    removed: Vec<u64>,
    delivered_lapses: Vec<u64>,
}

/// A snapshot as builds before batches lapsed wrote it.
#[derive(Deserialize)]
struct SnapshotDataWithoutLapses {
    machine: Vec<u8>,
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
    log_time: u64,
    expired: Vec<u64>,
    members: Vec<(u64, Vec<u8>)>,
    removed: Vec<u64>,
}

/// A snapshot as builds before membership changes wrote it.
#[derive(Deserialize)]
struct SnapshotDataWithoutMembers {
    machine: Vec<u8>,
    clients: Vec<(u64, u64, Vec<u8>)>,
    delivered_batches: Vec<BatchId>,
    log_time: u64,
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
    /// Decodes a snapshot of this build or of an earlier one (without sessions' ends: every
    /// session lives for good; without lapses: every batch never lapses; without member
    /// contexts: none; without log time: 0, and no expired requests). Each layout extends the
    /// one before, so earlier bytes fail only for want of the new fields.
    pub(super) fn decode(bytes: &[u8]) -> Result<SnapshotData, String> {
        let without_sessions = |old: SnapshotDataWithoutSessions| SnapshotData {
            machine: old.machine,
            clients: old.clients,
            delivered_batches: old.delivered_batches,
            log_time: old.log_time,
            expired: old.expired,
            members: old.members,
            removed: old.removed,
            delivered_lapses: old.delivered_lapses,
            session_until: Vec::new(),
            session_since: Vec::new(),
            unknown: Vec::new(),
            forgotten: Vec::new(),
        };
        let without_lapses = |old: SnapshotDataWithoutLapses| SnapshotData {
            machine: old.machine,
            clients: old.clients,
            delivered_batches: old.delivered_batches,
            log_time: old.log_time,
            expired: old.expired,
            members: old.members,
            removed: old.removed,
            delivered_lapses: Vec::new(),
            session_until: Vec::new(),
            session_since: Vec::new(),
            unknown: Vec::new(),
            forgotten: Vec::new(),
        };
        let without_members = |old: SnapshotDataWithoutMembers| SnapshotData {
            machine: old.machine,
            clients: old.clients,
            delivered_batches: old.delivered_batches,
            log_time: old.log_time,
            expired: old.expired,
            members: Vec::new(),
            removed: Vec::new(),
            delivered_lapses: Vec::new(),
            session_until: Vec::new(),
            session_since: Vec::new(),
            unknown: Vec::new(),
            forgotten: Vec::new(),
        };
        let without_time = |old: SnapshotDataWithoutTime| SnapshotData {
            machine: old.machine,
            clients: old.clients,
            delivered_batches: old.delivered_batches,
            log_time: 0,
            expired: Vec::new(),
            members: Vec::new(),
            removed: Vec::new(),
            delivered_lapses: Vec::new(),
            session_until: Vec::new(),
            session_since: Vec::new(),
            unknown: Vec::new(),
            forgotten: Vec::new(),
        };
        postcard::from_bytes::<SnapshotData>(bytes).or_else(|e| {
            postcard::from_bytes::<SnapshotDataWithoutSessions>(bytes)
                .map(without_sessions)
                .or_else(|_| {
                    postcard::from_bytes::<SnapshotDataWithoutLapses>(bytes).map(without_lapses)
                })
                .or_else(|_| {
                    postcard::from_bytes::<SnapshotDataWithoutMembers>(bytes).map(without_members)
                })
                .or_else(|_| {
                    postcard::from_bytes::<SnapshotDataWithoutTime>(bytes).map(without_time)
                })
                .map_err(|_| e.to_string())
        })
    }

    /// The delivered batches it holds, with when each lapses (never, for a snapshot written
    /// before batches lapsed).
    pub(super) fn delivered(&self) -> BTreeMap<BatchId, u64> {
        let lapses = self
            .delivered_lapses
            .iter()
            .copied()
            .chain(std::iter::repeat(u64::MAX));
        self.delivered_batches.iter().copied().zip(lapses).collect()
    }

    /// Leaves out the members that joined through the log and those changes removed: a new
    /// cluster started from the snapshot has its founders only.
    pub(super) fn forget_members(&mut self) {
        self.members.clear();
        self.removed.clear();
    }

    /// The contexts of the members that joined through the log.
    pub(super) fn member_contexts(&self) -> BTreeMap<Addr, Vec<u8>> {
        self.members.iter().cloned().collect()
    }

    /// What a snapshot holds of a replica's tables (the state machine's state lies beside it).
    pub(super) fn new(
        clients: &BTreeMap<u64, Session>,
        forgotten: &BTreeMap<u16, Forgotten>,
        delivered: &BTreeMap<BatchId, u64>,
        log_time: u64,
        members: &Membership,
    ) -> SnapshotData {
        let lapsing: Vec<(BatchId, u64)> = delivered
            .iter()
            .filter(|(_, lapse)| **lapse >= log_time)
            .map(|(id, lapse)| (*id, *lapse))
            .collect();
        let (mut expired, mut unknown) = (Vec::new(), Vec::new());
        let session_until = clients.values().map(|s| s.until).collect();
        let session_since = clients.values().map(|s| s.since).collect();
        let clients = clients
            .iter()
            .map(|(c, s)| match &s.outcome {
                Last::Answered(r) => (*c, s.seq, r.clone()),
                Last::Expired => {
                    expired.push(*c);
                    (*c, s.seq, Vec::new())
                }
                Last::Unknown => {
                    unknown.push(*c);
                    (*c, s.seq, Vec::new())
                }
            })
            .collect();
        SnapshotData {
            machine: Vec::new(),
            clients,
            // A batch that lapsed before the snapshot's log time orders nothing at any later
            // entry: the replicas that start from it need not know it was delivered.
            delivered_batches: lapsing.iter().map(|(id, _)| *id).collect(),
            log_time,
            expired,
            members: members
                .contexts
                .iter()
                .map(|(id, c)| (*id, c.clone()))
                .collect(),
            removed: members.removed.clone(),
            delivered_lapses: lapsing.iter().map(|(_, lapse)| *lapse).collect(),
            session_until,
            session_since,
            unknown,
            forgotten: forgotten
                .iter()
                .map(|(b, f)| (*b, f.until, f.client, f.last, f.since))
                .collect(),
        }
    }

    /// The clients' sessions it holds (a session a snapshot of an earlier build holds lives
    /// for good, since the log's start: what its requests' deadlines were is not known, and
    /// no session ended before it).
    pub(super) fn sessions(&self) -> BTreeMap<u64, Session> {
        let expired: BTreeSet<u64> = self.expired.iter().copied().collect();
        let unknown: BTreeSet<u64> = self.unknown.iter().copied().collect();
        let until = self
            .session_until
            .iter()
            .copied()
            .chain(std::iter::repeat(u64::MAX));
        let since = self
            .session_since
            .iter()
            .copied()
            .chain(std::iter::repeat(0));
        self.clients
            .iter()
            .zip(until.zip(since))
            .map(|((c, seq, r), (until, since))| {
                let outcome = if expired.contains(c) {
                    Last::Expired
                } else if unknown.contains(c) {
                    Last::Unknown
                } else {
                    Last::Answered(r.clone())
                };
                let session = Session {
                    seq: *seq,
                    outcome,
                    until,
                    since,
                };
                (*c, session)
            })
            .collect()
    }

    /// What it knows of forgotten sessions, per bucket of clients.
    pub(super) fn forgotten(&self) -> BTreeMap<u16, Forgotten> {
        self.forgotten
            .iter()
            .map(|&(bucket, until, client, last, since)| {
                let f = Forgotten {
                    until,
                    client,
                    last,
                    since,
                };
                (bucket, f)
            })
            .collect()
    }
}

impl<S: StateMachine> Replica<S> {
    /// Whether a snapshot from a peer and the state that came with it decode (ours and the
    /// machine's), changing nothing: one that fails is refused before anything of it is taken.
    pub(super) fn check_snapshot(&self, snap: &Snapshot, image: &Image) -> Result<(), String> {
        let data = SnapshotData::decode(&snap.data)?;
        if !data.machine.is_empty() {
            return Err("the snapshot holds the state inside it, as earlier builds wrote".into());
        }
        if image.index != snap.get_metadata().index {
            return Err(format!(
                "the state that came with the snapshot of {} is of {}",
                snap.get_metadata().index,
                image.index
            ));
        }
        self.machine.check_snapshot(&image.bytes)
    }

    /// Whether a Raft snapshot message's snapshot, with the state streamed before it, decodes.
    pub(super) fn check_raft_snapshot(&self, snap: &Snapshot) -> Result<(), String> {
        match &self.incoming_image {
            Some(image) => self.check_snapshot(snap, image),
            None => Err("no state came with it (a snapshot comes as a stream)".into()),
        }
    }

    /// Takes the delivered state of a snapshot and its image: the state machine, the clients'
    /// table, the delivered batches. Optimistic deliveries not yet final are revoked.
    fn restore_state(
        &mut self,
        snap: &Snapshot,
        image: &Image,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        let mut data = SnapshotData::decode(&snap.data)
            .map_err(|e| OrderError::Corrupt(format!("snapshot: {e}")))?;
        self.machine
            .restore_shared(&image.bytes)
            .map_err(OrderError::Corrupt)?;
        self.clients.restore(data.sessions(), data.forgotten());
        let contexts = data.member_contexts();
        let removed = std::mem::take(&mut data.removed);
        self.batches.delivered = data.delivered();
        if self.delivery.opt_next > self.delivery.final_next {
            self.revoke(self.delivery.final_next, out);
        }
        // What the snapshot covers is done: delivered, or older than its client's last.
        let clients = &self.clients;
        self.batches
            .retain_in_flight(|client, seq| !clients.decided(client, seq));
        self.batches.forget_covered(index);
        // The log now starts after the snapshot: what lapsed before its log time is needed by
        // no entry (its delivered ids are already left out of the snapshot).
        self.stats.batches_forgotten += self.batches.forget_lapsed(data.log_time);
        self.snapshot_time = data.log_time;
        self.delivery.skip_to(index, data.log_time);
        self.stats.snapshots_installed += 1;
        out.push(Output::Deliver(Delivery::Installed { seq: index }));
        let conf = snap.get_metadata().get_conf_state();
        self.members = Membership::of(conf, &contexts).with_removed(removed);
        out.push(Output::Deliver(Delivery::Membership {
            seq: index,
            membership: self.members.clone(),
        }));
        Ok(())
    }

    /// A snapshot Raft hands over because this replica's log is behind the leader's first
    /// entry: it replaces the log.
    pub(super) fn install(
        &mut self,
        snap: Snapshot,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        // raft-rs takes a snapshot only from a message, which was checked with its state.
        let image = self
            .incoming_image
            .take()
            .filter(|image| image.index == index)
            .ok_or_else(|| {
                OrderError::Corrupt(format!(
                    "raft installs a snapshot of {index} without its state"
                ))
            })?;
        self.restore_state(&snap, &image, out)?;
        self.image = image;
        self.raft.mut_store().install(snap);
        // The log after the snapshot starts anew (raft-rs installs one over entries of another
        // term too): no earlier write holds what comes next.
        self.disk.clamp(index);
        // Everything before is gone, so the log is rewritten rather than appended to: the
        // earlier records are dropped, and a host whose log is never fsynced writes the
        // state (a GiB, say) off this replica's thread, which goes on hearing its peers
        // meanwhile (what it sends after waits for the write).
        self.rewrite_disk(Write::Rewrite, out);
        Ok(())
    }

    /// A replica asks for a snapshot covering position `after`: the latest one here, if it
    /// does, streamed (unless a stream to it is under way already: it asks again while it
    /// waits).
    pub(super) fn on_fetch_state(&mut self, from: Addr, after: u64, out: &mut Vec<Action>) {
        let snap = self.raft.store().latest_snapshot();
        let index = snap.get_metadata().index;
        if index >= after && index == self.image.index && !self.streams.senders.sending_to(from) {
            let mut head = Snapshot::default();
            head.set_metadata(snap.get_metadata().clone());
            let (header, parts) = self.stream_of(head.encode_to_vec(), snap.data.clone());
            let mut msgs = Vec::new();
            self.streams.senders.start(
                self.ticks,
                from,
                StreamKind::State(header),
                parts,
                &mut msgs,
            );
            send_all(msgs, out);
        }
    }

    /// Streams Raft's snapshot message `m`: its snapshot's data in chunks, the message itself
    /// (without the data) in the offer. Raft hears how it went once the stream ends. While a
    /// Raft snapshot is under way to that replica, another is not started: raft-rs sends one
    /// again on a late or repeated rejection, and under steady compaction each would replace
    /// the last and none would ever arrive (the simulation found this). The replica takes the
    /// one under way and catches up from there.
    pub(super) fn stream_raft_snapshot(&mut self, mut m: Message, out: &mut Vec<Action>) {
        let to = m.to;
        if self.streams.senders.sending_raft_to(to) {
            return;
        }
        let index = m.get_snapshot().get_metadata().index;
        if index != self.image.index {
            // raft-rs sends the store's snapshot, whose image this is: never seen.
            out.push(Output::Warn(format!(
                "no snapshot sent to replica {to}: the state held is of {}, the snapshot of \
                 {index}",
                self.image.index
            )));
            self.raft.report_snapshot(to, SnapshotStatus::Failure);
            return;
        }
        let tables = std::mem::take(&mut m.mut_snapshot().data);
        let (header, parts) = self.stream_of(m.encode_to_vec(), tables);
        let mut msgs = Vec::new();
        // What it replaces can only be a state asked for (a Raft stream is never replaced).
        let replaced =
            self.streams
                .senders
                .start(self.ticks, to, StreamKind::Raft(header), parts, &mut msgs);
        send_all(msgs, out);
        if replaced.is_some() {
            self.stats.snapshot_streams_abandoned += 1;
        }
    }

    /// A stream of the state held and `tables` (a snapshot's data), offered with `raft` (the
    /// snapshot, or Raft's message, without its data).
    fn stream_of(&self, raft: Vec<u8>, tables: Vec<u8>) -> (StreamHeader, Parts) {
        let header = StreamHeader {
            raft,
            tables: tables.len() as u64,
        };
        let parts = Parts::new([self.image.bytes.clone(), Bytes::from(tables)]);
        (header, parts)
    }

    /// A replica offers a stream: taken, unless it is larger than this replica accepts.
    pub(super) fn on_stream_offer(
        &mut self,
        from: Addr,
        stream: u64,
        kind: StreamKind,
        total: u64,
        checksum: u32,
        out: &mut Vec<Action>,
    ) {
        let mut msgs = Vec::new();
        let offer = Offer {
            stream,
            kind,
            total,
            checksum,
        };
        let received = self
            .streams
            .receivers
            .on_offer(self.ticks, from, offer, &mut msgs);
        send_all(msgs, out);
        if let Received::Refused(why) = received {
            self.stats.snapshots_refused += 1;
            out.push(Output::Warn(why));
        }
    }

    /// A chunk of a stream: once the stream is whole, its snapshot is taken as if it had
    /// come in one message (a Raft snapshot stepped, a state adopted).
    pub(super) fn on_stream_chunk(
        &mut self,
        from: Addr,
        stream: u64,
        offset: u64,
        data: &[u8],
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let mut msgs = Vec::new();
        let received = self
            .streams
            .receivers
            .on_chunk(self.ticks, from, stream, offset, data, &mut msgs);
        send_all(msgs, out);
        match received {
            Received::Nothing => {}
            Received::Refused(why) | Received::Corrupt(why) => {
                self.stats.snapshots_refused += 1;
                out.push(Output::Warn(why));
            }
            Received::Complete { kind, data } => {
                let (header, is_raft) = match kind {
                    StreamKind::Raft(header) => (header, true),
                    StreamKind::State(header) => (header, false),
                };
                let Some((state, tables)) = split_stream(data, header.tables) else {
                    self.stats.snapshots_refused += 1;
                    out.push(Output::Warn(format!(
                        "a snapshot stream from replica {from} is shorter than the {} bytes \
                         of tables its offer announced: dropped",
                        header.tables
                    )));
                    return Ok(());
                };
                if is_raft {
                    self.on_raft_snapshot(from, &header.raft, tables, state, out);
                } else {
                    self.on_state(from, &header.raft, tables, state, out)?;
                }
            }
        }
        Ok(())
    }

    /// Raft's snapshot message (`header`, without its snapshot's data `tables`) and the state
    /// at its snapshot's position, streamed by the leader: stepped, the state held until
    /// raft-rs hands the snapshot over to install (in this step) or refuses it.
    fn on_raft_snapshot(
        &mut self,
        from: Addr,
        header: &[u8],
        tables: Vec<u8>,
        state: Bytes,
        out: &mut Vec<Action>,
    ) {
        match Message::decode(header) {
            Ok(mut m) if m.msg_type == MessageType::MsgSnapshot as i32 => {
                m.mut_snapshot().data = tables;
                self.incoming_image = Some(Image {
                    index: m.get_snapshot().get_metadata().index,
                    bytes: state,
                });
                let (term, leader) = (self.raft.raft.term, self.raft.raft.leader_id);
                let mut from = from;
                if m.term < term && leader != raft::INVALID_ID && leader != self.cfg.id {
                    // The leader changed while the snapshot travelled, and raft-rs ignores a
                    // message of an earlier term: the whole transfer would be lost (at 1 GiB,
                    // under elections, five in a row were). A snapshot holds only committed
                    // entries, the same whichever leader took it, so it is taken as if the
                    // current leader had sent it; raft-rs answers that leader, which goes on
                    // from the snapshot's position.
                    (m.term, m.from, from) = (term, leader, leader);
                }
                self.on_raft_message(from, m, out);
            }
            Ok(m) => out.push(Output::Warn(format!(
                "a snapshot stream from replica {from} carried a raft message of type {} \
                 instead of a snapshot: dropped",
                m.msg_type
            ))),
            Err(e) => out.push(Output::Warn(format!(
                "a snapshot stream from replica {from} carried an undecodable raft message: {e}"
            ))),
        }
    }

    /// A replica holds `next` bytes of a stream sent from here: more chunks, or the end (Raft
    /// hears that its snapshot arrived).
    pub(super) fn on_stream_ack(
        &mut self,
        from: Addr,
        stream: u64,
        next: u64,
        out: &mut Vec<Action>,
    ) {
        let mut msgs = Vec::new();
        let ended = self
            .streams
            .senders
            .on_ack(self.ticks, from, stream, next, &mut msgs);
        send_all(msgs, out);
        if let Some(ended) = ended {
            self.stream_ended(ended, out);
        }
    }

    /// Time passes for the streams: silent receivers get the rest again or are given up on;
    /// streams whose sender went silent are dropped.
    pub(super) fn tick_streams(&mut self, out: &mut Vec<Action>) {
        let mut msgs = Vec::new();
        let ended = self.streams.senders.tick(self.ticks, &mut msgs);
        self.streams.receivers.tick(self.ticks);
        send_all(msgs, out);
        for e in ended {
            self.stream_ended(e, out);
        }
    }

    fn stream_ended(&mut self, ended: Sent, out: &mut Vec<Action>) {
        match ended {
            Sent::Delivered { to, kind } => {
                self.stats.snapshots_sent += 1;
                if matches!(kind, StreamKind::Raft(_)) {
                    self.raft.report_snapshot(to, SnapshotStatus::Finish);
                }
            }
            Sent::Refused { to, kind, reason } => {
                self.stats.snapshot_streams_abandoned += 1;
                out.push(Output::Warn(format!(
                    "a snapshot stream to replica {to} was refused: {reason}"
                )));
                if matches!(kind, StreamKind::Raft(_)) {
                    self.raft.report_snapshot(to, SnapshotStatus::Failure);
                }
            }
            Sent::Abandoned { to, kind } => {
                self.stats.snapshot_streams_abandoned += 1;
                out.push(Output::Warn(format!(
                    "a snapshot stream to replica {to} was given up on: it stopped answering"
                )));
                if matches!(kind, StreamKind::Raft(_)) {
                    // raft-rs probes the replica again, and sends another snapshot if it
                    // still needs one.
                    self.raft.report_snapshot(to, SnapshotStatus::Failure);
                }
            }
        }
    }

    /// A snapshot another replica sent whole (as earlier builds did): refused, as it holds
    /// no state beside it.
    pub(super) fn on_whole_state(&mut self, from: Addr, out: &mut Vec<Action>) {
        self.stats.snapshots_refused += 1;
        out.push(Output::Warn(format!(
            "snapshot sent whole by replica {from} refused: a state comes as a stream"
        )));
    }

    /// A snapshot (`header`, without its data `tables`) and the state at its position
    /// (`state`) another replica streamed because this one asked: adopted if they decode.
    fn on_state(
        &mut self,
        from: Addr,
        header: &[u8],
        tables: Vec<u8>,
        state: Bytes,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        match Snapshot::decode(header)
            .map_err(|e| e.to_string())
            .and_then(|mut snap| {
                snap.data = tables;
                let image = Image {
                    index: snap.get_metadata().index,
                    bytes: state,
                };
                self.check_snapshot(&snap, &image).map(|()| (snap, image))
            }) {
            Ok((snap, image)) => self.adopt(snap, image, out),
            Err(error) => {
                self.stats.snapshots_refused += 1;
                out.push(Output::Warn(format!(
                    "undecodable snapshot from replica {from} refused: {error}"
                )));
                Ok(())
            }
        }
    }

    /// A snapshot another replica sent because this one waits for a batch nobody keeps any
    /// more. Taken only if it covers the waiting entry and lies within this replica's committed
    /// log, whose entries up to it it then replaces (the log itself stays Raft's).
    fn adopt(
        &mut self,
        snap: Snapshot,
        image: Image,
        out: &mut Vec<Action>,
    ) -> Result<(), OrderError> {
        let index = snap.get_metadata().index;
        let usable = index >= self.delivery.opt_next
            && index <= self.delivery.commit
            && index <= self.raft.store().last()
            && index > self.raft.store().snapshot_index();
        if !usable {
            return Ok(());
        }
        // raft-rs must know of the membership changes the snapshot skips.
        self.apply_changes_in_log(self.delivery.final_next, index, out);
        self.restore_state(&snap, &image, out)?;
        self.image = image;
        self.raft.mut_store().compact(snap, index);
        // The snapshot adopted covers the changes applied above.
        self.snapshot_due = false;
        self.rewrite_disk(Write::Rewrite, out);
        Ok(())
    }

    /// The replicas drop a batch's contents when they compact the log past its entry. A replica
    /// that still needs one by then (it was away, and its log is not behind enough for Raft to
    /// send a snapshot) asks the others for their latest snapshot instead and adopts it.
    pub(super) fn unstick(&mut self, out: &mut Vec<Action>) {
        let Some((id, since)) = self.delivery.missing else {
            return;
        };
        if self.ticks < since + 4 * self.cfg.retry_ticks {
            return;
        }
        self.delivery.missing = Some((id, self.ticks));
        for to in self.others() {
            out.push(Output::Send {
                to,
                msg: OrderMsg::FetchState {
                    after: self.delivery.opt_next,
                },
            });
        }
    }

    /// Takes a snapshot at the last finally delivered entry once `snapshot_every` entries have
    /// been delivered since the last one and they hold an eighth of the state's size (see
    /// [`STATE_PER_LOG_BYTE`]), or one is due: raft-rs wanted to send a replica a snapshot the
    /// latest could not serve (a learner added since it), or a membership change was applied
    /// to a log that still starts at the founding. The replica's tables are taken now; the
    /// state machine's state is encoded now too, unless the machine can pin it and have it
    /// encoded off this thread ([`StateMachine::snapshot_later`]): then the host runs the job
    /// and the snapshot is finished when its bytes come back (one at a time).
    pub(super) fn maybe_snapshot(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        // Wanted while one is being encoded: raft-rs asks again if that one does not serve.
        let wanted = self.raft.store().take_snapshot_wanted();
        if self.encoding.is_some() {
            return Ok(());
        }
        if wanted
            && self.ticks >= self.snapshot_retry_at
            && self.cfg.planted_bug != Some(PlantedBug::NoSnapshotForLearners)
        {
            self.snapshot_due = true;
        }
        let applied = self.delivery.final_next - 1;
        let base = self.raft.store().snapshot_index();
        let due = self.snapshot_due && applied > base;
        let counted = applied >= base + self.cfg.snapshot_every.max(1);
        // Every snapshot encodes and writes the whole state: a large state waits until the log
        // since the last one is worth it, rather than rewriting a GiB for a few entries.
        let worth = self.delivery.since_snapshot_bytes
            >= self.image.bytes.len() as u64 / STATE_PER_LOG_BYTE;
        if !due && (!counted || !worth) {
            return Ok(());
        }
        let Some(term) = self.raft.store().term_of(applied) else {
            return Ok(());
        };
        let data = SnapshotData::new(
            self.clients.sessions(),
            self.clients.forgotten(),
            &self.batches.delivered,
            self.delivery.final_time,
            &self.members,
        );
        let mut snap = Snapshot {
            data: postcard::to_stdvec(&data).map_err(|e| OrderError::Corrupt(e.to_string()))?,
            ..Snapshot::default()
        };
        let meta = snap.mut_metadata();
        meta.index = applied;
        meta.term = term;
        meta.set_conf_state(self.raft.store().conf_state().clone());
        self.snapshot_due = false;
        self.delivery.since_snapshot_bytes = 0;
        match self.machine.snapshot_later() {
            Some(job) => {
                self.encoding = Some(snap);
                out.push(Output::Deliver(Delivery::EncodeSnapshot {
                    seq: applied,
                    job: EncodeJob::new(job),
                }));
            }
            None => {
                let state = self.machine.snapshot();
                self.finish_snapshot(snap, state, out);
            }
        }
        Ok(())
    }

    /// A snapshot could not be taken: counted, and one raft-rs wants waits [`RETRY_FAILED`]
    /// retry periods (the counted one waits for the log to grow by another eighth of the
    /// state).
    fn snapshot_failed(&mut self) {
        self.stats.snapshots_failed += 1;
        self.snapshot_retry_at = self.ticks + RETRY_FAILED * self.cfg.retry_ticks.max(1);
    }

    /// The state asked for at `seq` was encoded: the snapshot is taken, unless the replica
    /// installed a snapshot at or past it since (or never asked: a host's late answer). Empty
    /// bytes say the host could not encode it: the replica asks again once the log grew by
    /// another eighth of the state, or raft-rs wants one after [`RETRY_FAILED`] retry periods.
    pub(super) fn on_snapshot_encoded(&mut self, seq: u64, state: Vec<u8>, out: &mut Vec<Action>) {
        let Some(snap) = self.encoding.take_if(|s| s.get_metadata().index == seq) else {
            return;
        };
        if state.is_empty() {
            self.snapshot_failed();
            out.push(Output::Warn(format!(
                "no snapshot taken at {seq}: the host could not encode its state"
            )));
            return;
        }
        if self.raft.store().snapshot_index() >= seq {
            return;
        }
        let mut snap = snap;
        if self.cfg.planted_bug == Some(PlantedBug::SnapshotWhereEncoded) {
            let applied = self.delivery.final_next - 1;
            if let Some(term) = self.raft.store().term_of(applied) {
                snap.mut_metadata().index = applied;
                snap.mut_metadata().term = term;
            }
        }
        self.finish_snapshot(snap, state, out);
    }

    /// Takes snapshot `snap` (the replica's tables at its position) with the state machine's
    /// state there (`machine`): compacts the log up to the previous snapshot (or, when the
    /// batches since then are larger than [`KEEP_BATCH_BYTES_MIN`] and a quarter of the state,
    /// up to the newest entries whose batches fit that) and rewrites the disk. A state that
    /// does not pass the machine's own check is not taken, and the log is kept whole.
    fn finish_snapshot(&mut self, snap: Snapshot, machine: Vec<u8>, out: &mut Vec<Action>) {
        let index = snap.get_metadata().index;
        if let Err(why) = self.machine.check_snapshot(&machine) {
            // Compacting would leave a log this replica could not restart from: keep the log.
            self.snapshot_failed();
            out.push(Output::Warn(format!(
                "no snapshot taken at {index} (the log is kept whole): the state machine's \
                 snapshot does not pass its own check: {why}"
            )));
            return;
        }
        let base = self.raft.store().snapshot_index();
        let time = SnapshotData::decode(&snap.data).map_or(0, |d| d.log_time);
        self.image = Image {
            index,
            bytes: Bytes::from(machine),
        };
        // The entries since the last snapshot stay (with their batches) until the next one:
        // a replica that is still installing an earlier snapshot, or lagged less than that,
        // catches up from the log rather than needing another snapshot. Only the newest of
        // them whose batches fit a budget, when their batches are large beside the state (a
        // burst of large writes): a replica that needs older ones gets this snapshot instead.
        // The first snapshot keeps none: a replica that joins has no configuration before a
        // snapshot gives it one, so the log must not reach back to its start.
        let budget = (self.image.bytes.len() as u64 / 4).max(KEEP_BATCH_BYTES_MIN);
        let keep_after = if base > 0 {
            self.batches.keep_within(base, index, budget)
        } else {
            index
        };
        self.raft.mut_store().compact(snap, keep_after);
        self.batches.forget_delivered(keep_after);
        // Every entry the log keeps comes after the previous snapshot (or, for the first, after
        // this one): its log time is at least that snapshot's, so a batch that lapsed before it
        // is needed by no entry here, replayed or sent to a peer.
        let floor = if base > 0 { self.snapshot_time } else { time };
        self.stats.batches_forgotten += self.batches.forget_lapsed(floor);
        self.snapshot_time = time;
        self.rewrite_disk(Write::Compact, out);
        self.stats.snapshots_taken += 1;
    }

    /// Rewrites the disk with what the replica holds now: its snapshot, the entries after it,
    /// the hard state, the batches it keeps. `write` is [`Write::Compact`] when the records
    /// hold nothing the log does not (a snapshot taken here: the disk may write it in the
    /// background), [`Write::Rewrite`] when they do (a snapshot adopted from a peer, or
    /// installed).
    fn rewrite_disk(&mut self, write: fn(Vec<Bytes>) -> Write, out: &mut Vec<Action>) {
        let store = self.raft.store();
        let snap = store.latest_snapshot();
        let mut records = vec![Record::Installed(snap.encode_to_vec())];
        let index = snap.get_metadata().index;
        let image = (index > 0 && index == self.image.index).then(|| self.image.bytes.clone());
        if image.is_some() {
            records.push(Record::ImageFollows { index });
        }
        // Entries kept before the snapshot are not written: a restart starts from it.
        let rest: Vec<Vec<u8>> = store
            .entries_from(index + 1)
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
        // Nor are the batches of those entries.
        let batches = &self.batches;
        let before_snapshot = |id: &BatchId| {
            batches.delivered.contains_key(id)
                && batches.in_log.get(id).is_none_or(|at| *at <= index)
        };
        records.extend(
            batches
                .held
                .iter()
                .filter(|(id, _)| !before_snapshot(id))
                .map(|(id, requests)| Record::Batch {
                    id: *id,
                    requests: requests.clone(),
                }),
        );
        if self.lost_log.rejoining() {
            records.push(Record::Rejoining);
        } else if self.cfg.rejoin {
            // The setting may stay on: the log must keep saying that it caught up.
            records.push(Record::Rejoined);
        }
        // Records queued before go first (the rewrite holds their facts too, but a write
        // emitted earlier is never dropped).
        self.flush(out);
        self.disk.emitted(self.raft.store().last());
        let mut payloads: Vec<Bytes> = Vec::with_capacity(records.len() + 1);
        for r in &records {
            payloads.push(r.encode().into());
            if matches!(r, Record::ImageFollows { .. }) {
                // The state, raw, right after its marker.
                payloads.extend(image.clone());
            }
        }
        out.push(Output::Persist(write(payloads)));
    }

    /// Rewrites the log with what the replica holds (removing what replay dropped from it),
    /// before anything else is written.
    pub(super) fn rewrite_log(&mut self, out: &mut Vec<Action>) {
        // Records queued at opening would be appended first, after what replay dropped; the
        // rewrite holds what they say (a replica that rejoins writes so in it).
        self.disk.discard_queued();
        self.rewrite_disk(Write::Rewrite, out);
    }
}

/// Queues a stream's messages.
fn send_all(msgs: Vec<(Addr, OrderMsg)>, out: &mut Vec<Action>) {
    out.extend(msgs.into_iter().map(|(to, msg)| Output::Send { to, msg }));
}

/// A whole stream split into the state and the snapshot's data (its last `tables` bytes), or
/// nothing if it is shorter than that.
fn split_stream(mut data: Vec<u8>, tables: u64) -> Option<(Bytes, Vec<u8>)> {
    let split = (data.len() as u64).checked_sub(tables)?;
    let tables = data.split_off(split as usize);
    Some((Bytes::from(data), tables))
}
