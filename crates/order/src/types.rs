//! What the order layer carries: requests, batches, messages, and what it delivers.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

use crate::membership::{ChangeRefused, Membership};

/// A node's address: its id in the cluster's transport (never 0; replicas use it as their Raft
/// id too).
pub type Addr = atomos_seam::NodeId;

/// A client's request. A client numbers its requests 1, 2, 3, ... and has one outstanding at a
/// time; `(client, seq)` identifies a request, and the order layer delivers each at most once
/// however often it is re-sent. A request ordered after one of its client's with the same or a
/// higher number is never delivered: the same verdict on every replica, whatever order a
/// client's numbers arrive in.
///
/// A request ordered at a position where the log's time (see [`Delivery::Final`]) is past its
/// `deadline_ms` expires: it never runs, and its client is told so ([`OrderMsg::Expired`]).
/// A client gives every copy of a request the same deadline; the log's time never goes back,
/// so once one replica's final log time is past a request's deadline and the request has not
/// run, no copy of it can. (A copy sent with another deadline is decided on its own: the first
/// copy ordered decides the number, and a client told that one copy expired has learnt of that
/// copy only.)
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Request {
    /// The client.
    pub client: u64,
    /// The client's sequence number, from 1.
    pub seq: u64,
    /// What the replicated state machine is asked to do. (Encoded as bytes, in one piece:
    /// the same encoding as a sequence of bytes, written and read far faster.)
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    /// The last log time (milliseconds since the Unix epoch, by the members' clocks) at which
    /// the request may still be ordered; [`NO_DEADLINE`] for none.
    pub deadline_ms: u64,
}

/// A request's deadline when it has none: it never expires.
pub const NO_DEADLINE: u64 = u64::MAX;

/// A request as logs written before requests had deadlines hold it (read as one without a
/// deadline).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestWithoutDeadline {
    /// The client.
    pub client: u64,
    /// The client's sequence number.
    pub seq: u64,
    /// The payload.
    pub payload: Vec<u8>,
}

impl From<RequestWithoutDeadline> for Request {
    fn from(r: RequestWithoutDeadline) -> Request {
        Request {
            client: r.client,
            seq: r.seq,
            payload: r.payload,
            deadline_ms: NO_DEADLINE,
        }
    }
}

/// A batch of requests, named by the replica that formed it and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct BatchId {
    /// The replica that formed the batch.
    pub origin: Addr,
    /// Its number at that replica, from 1.
    pub n: u64,
}

/// Messages between replicas, and between clients and replicas.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum OrderMsg {
    /// A Raft message (protobuf-encoded, as raft-rs defines it).
    Raft(Vec<u8>),
    /// A batch disseminated by its origin (or sent to a replica that asked for it).
    Batch {
        /// Its id.
        id: BatchId,
        /// Its requests.
        requests: Vec<Request>,
    },
    /// The sender persisted batch `id`.
    BatchAck {
        /// The batch.
        id: BatchId,
    },
    /// The sender needs batch `id` to deliver an entry.
    FetchBatch {
        /// The batch.
        id: BatchId,
    },
    /// The sender waits for entry `after` and nobody keeps its batch: send your latest snapshot
    /// if it reaches that far.
    FetchState {
        /// The entry waited for.
        after: u64,
    },
    /// A snapshot (protobuf) sent whole, as earlier builds answered [`OrderMsg::FetchState`]:
    /// refused (a state comes as a stream, its snapshot's state beside it).
    State {
        /// The snapshot.
        snapshot: Vec<u8>,
    },
    /// A client's request.
    Request(Request),
    /// The sender's log ends at `last`, before what the leader's heartbeat committed: it lost
    /// its log (a wiped disk, or writes lost in a crash). A leader that believes the sender
    /// holds more starts over with it from `last` (see `lost_log`).
    Behind {
        /// The sender's last log index.
        last: u64,
    },
    /// The answer to a client's request, sent once it is finally delivered.
    Reply {
        /// The client.
        client: u64,
        /// The request's number.
        seq: u64,
        /// What the state machine answered.
        response: Vec<u8>,
    },
    /// The client's request never runs: it was not ordered before its deadline. Sent once the
    /// entry where it expired is final, or at once to a copy that arrives later.
    Expired {
        /// The client.
        client: u64,
        /// The request's number.
        seq: u64,
    },
    /// The sender streams a snapshot of `total` bytes to the receiver (see
    /// [`OrderMsg::StreamChunk`]); streams from one sender are numbered upwards, a newer one
    /// replacing an older.
    StreamOffer {
        /// The stream's number at its sender.
        stream: u64,
        /// What the snapshot is for.
        kind: StreamKind,
        /// Its size in bytes.
        total: u64,
        /// The CRC-32 of its bytes.
        checksum: u32,
    },
    /// Bytes `offset..offset + data.len()` of a stream.
    StreamChunk {
        /// The stream.
        stream: u64,
        /// Where `data` starts.
        offset: u64,
        /// The bytes.
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The receiver holds the first `next` bytes of the stream (all of them, checked, when
    /// `next` is its size; none when 0, and the sender starts over).
    StreamAck {
        /// The stream.
        stream: u64,
        /// Bytes held, in order.
        next: u64,
    },
    /// The receiver will not take the stream (it is larger than it accepts), saying why.
    StreamRefused {
        /// The stream.
        stream: u64,
        /// Why.
        reason: String,
    },
    /// The sender has finally delivered every entry through `through` (sent to the leader
    /// now and then, which lets a membership change wait until replicas hold what it needs).
    Delivered {
        /// The last position delivered.
        through: u64,
    },
    /// The client's request cannot run any more (its deadline is past the log's time), and
    /// whether it ran is no longer known: its client's session ended (see
    /// `replica::clients`) and it may have run in it. Sent instead of
    /// [`OrderMsg::Expired`] where that cannot be told.
    Unknown {
        /// The client.
        client: u64,
        /// The request's number.
        seq: u64,
    },
}

/// Every kind of message here was spoken by wire version 17, the oldest a build still speaks
/// (0: every version spoken has it). A variant added later says the version that introduced it
/// (the match is exhaustive so that adding one asks the question).
impl atomos_seam::WireMessage for OrderMsg {
    fn since(&self) -> u16 {
        match self {
            OrderMsg::Raft { .. }
            | OrderMsg::Batch { .. }
            | OrderMsg::BatchAck { .. }
            | OrderMsg::FetchBatch { .. }
            | OrderMsg::FetchState { .. }
            | OrderMsg::State { .. }
            | OrderMsg::Request { .. }
            | OrderMsg::Behind { .. }
            | OrderMsg::Reply { .. }
            | OrderMsg::Expired { .. }
            | OrderMsg::StreamOffer { .. }
            | OrderMsg::StreamChunk { .. }
            | OrderMsg::StreamAck { .. }
            | OrderMsg::StreamRefused { .. }
            | OrderMsg::Delivered { .. }
            | OrderMsg::Unknown { .. } => 0,
        }
    }
}

/// What a streamed snapshot is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum StreamKind {
    /// Raft's snapshot message: it is stepped once the stream is whole.
    Raft(StreamHeader),
    /// A snapshot answering [`OrderMsg::FetchState`]: adopted once the stream is whole.
    State(StreamHeader),
}

/// What a stream's offer says of the snapshot it carries. The snapshot's data (the replica's
/// tables at its position) travels in the stream, after the state machine's state, rather than
/// in the header, so that the offer fits one frame whatever the tables' size.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct StreamHeader {
    /// Raft's message ([`StreamKind::Raft`]) or snapshot ([`StreamKind::State`]), protobuf,
    /// with the snapshot's data left empty.
    #[serde(with = "serde_bytes")]
    pub raft: Vec<u8>,
    /// The snapshot's data: the stream's last `tables` bytes.
    pub tables: u64,
}

impl OrderMsg {
    /// The client this message answers, if it is an answer to a client ([`OrderMsg::Reply`]
    /// [`OrderMsg::Expired`] or [`OrderMsg::Unknown`]): what routes it to the client rather
    /// than to a replica.
    pub fn answered_client(&self) -> Option<u64> {
        match self {
            OrderMsg::Reply { client, .. }
            | OrderMsg::Expired { client, .. }
            | OrderMsg::Unknown { client, .. } => Some(*client),
            _ => None,
        }
    }
}

/// What a replica hands to the layers above, besides messages to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Entry `seq` is proposed by the leader and its batches are here: `requests` (duplicates
    /// of earlier requests removed) will be finally delivered at `seq` unless revoked.
    Opt {
        /// The entry's position in the total order.
        seq: u64,
        /// Its requests.
        requests: Vec<Request>,
    },
    /// Entry `seq`, optimistically delivered before, is committed: its order is final, and the
    /// replicated state machine has applied it.
    Final {
        /// The entry.
        seq: u64,
        /// The log's time at the entry: the latest of the times its proposers stamped on it and
        /// on every entry before it (milliseconds since the Unix epoch by the proposers'
        /// clocks; 0 before any stamp). The same on every replica; it never goes back.
        time_ms: u64,
    },
    /// A leader change replaced the entries from `from` on: every optimistic delivery at or
    /// above `from` is void.
    Revoke {
        /// The first revoked entry.
        from: u64,
    },
    /// The replica's state was replaced by a snapshot taken at `seq` (it was too far behind):
    /// entries up to `seq` are final without being delivered one by one.
    Installed {
        /// The snapshot's position.
        seq: u64,
    },
    /// The membership in force from entry `seq` on (a change applied there, or the one a
    /// snapshot installed at `seq` holds). The same at every position on every replica.
    Membership {
        /// The position.
        seq: u64,
        /// The configuration.
        membership: Membership,
    },
    /// What became of the membership change a host asked for with `ticket`: proposed at a
    /// position, or refused.
    MemberChange {
        /// The host's number for the change.
        ticket: u64,
        /// Where it was proposed, or why not.
        result: Result<u64, ChangeRefused>,
    },
    /// The state machine's state at position `seq`, for the replica's next snapshot: the host
    /// runs the job (off the replica's thread: the state is pinned, the replica goes on) and
    /// hands the bytes back with [`crate::Command::SnapshotEncoded`]. A host that never does
    /// leaves the replica without new snapshots (its log is not compacted).
    EncodeSnapshot {
        /// The position.
        seq: u64,
        /// What encodes it.
        job: EncodeJob,
    },
    /// Applying entry `seq`, the state machine found something an operator must hear of (for
    /// the replicated store: its state differs from another replica's at the same position).
    Alarm {
        /// The entry.
        seq: u64,
        /// What it found.
        text: String,
    },
}

/// What a replica asks its driver to do: send, persist (before what follows), deliver.
pub type Action = atomos_seam::Output<OrderMsg, Delivery>;

/// A state machine's snapshot to encode off its thread (see [`StateMachine::snapshot_later`]).
pub type SnapshotJob = Box<dyn FnOnce() -> Vec<u8> + Send>;

/// A [`SnapshotJob`] handed to a host in a [`Delivery::EncodeSnapshot`]: whoever takes it
/// first runs it (copies of the delivery share it). Deliveries compare equal when they share
/// the job.
#[derive(Clone)]
pub struct EncodeJob(Arc<Mutex<Option<SnapshotJob>>>);

impl EncodeJob {
    /// The job, to hand to a host.
    pub fn new(job: SnapshotJob) -> EncodeJob {
        EncodeJob(Arc::new(Mutex::new(Some(job))))
    }

    /// The job, unless taken before.
    pub fn take(&self) -> Option<SnapshotJob> {
        self.0.lock().map_or(None, |mut job| job.take())
    }
}

impl std::fmt::Debug for EncodeJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncodeJob")
    }
}

impl PartialEq for EncodeJob {
    fn eq(&self, other: &EncodeJob) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for EncodeJob {}

/// A replicated state machine: applies finally delivered requests in order, and can be saved
/// into and restored from a snapshot. Must be deterministic.
pub trait StateMachine {
    /// Applies one request and returns the answer for its client.
    fn apply(&mut self, request: &Request) -> Vec<u8>;
    /// Applies request `index` of finally delivered entry `seq` (the one its optimistic
    /// delivery named so, unless that was revoked): what [`StateMachine::apply`] does, for a
    /// machine that matches final deliveries with optimistic ones. Default: `apply`.
    fn apply_final(&mut self, seq: u64, index: u32, request: &Request) -> Vec<u8> {
        let _ = (seq, index);
        self.apply(request)
    }
    /// Entry `seq` was delivered optimistically with these requests: the ones it applies, in
    /// this order, if it becomes final. A machine may work on them ahead (speculatively), but
    /// must not change what [`StateMachine::apply`] answers or what a snapshot holds before
    /// the final delivery. Default: nothing.
    fn optimistic(&mut self, seq: u64, requests: &[Request]) {
        let _ = (seq, requests);
    }
    /// Optimistic deliveries from entry `from` on were revoked (they may come again,
    /// different). Default: nothing.
    fn revoked(&mut self, from: u64) {
        let _ = from;
    }
    /// What the machine found while applying that an operator must hear of, taken (the
    /// replica hands each on as a [`Delivery::Alarm`]). Default: nothing.
    fn take_alarms(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// The machine's own counters, by name (monotonic over the machine's life), for
    /// operators and benchmarks. Default: none.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// The whole state, encoded.
    fn snapshot(&self) -> Vec<u8>;
    /// The whole state as it is now, to be encoded by the job (on another thread, while the
    /// machine goes on applying): the job returns what [`StateMachine::snapshot`] would have
    /// returned now. Default: `None`, and the replica encodes the state in its step.
    fn snapshot_later(&self) -> Option<SnapshotJob> {
        None
    }
    /// Replaces the state with a snapshot's. On an error the state is unchanged.
    fn restore(&mut self, data: &[u8]) -> Result<(), String>;
    /// [`StateMachine::restore`] from bytes the machine may keep slices of instead of copying
    /// them (the replica keeps the same bytes as its latest snapshot's state, so a state held
    /// as slices of them is in memory once). Default: `restore`.
    fn restore_shared(&mut self, data: &atomos_seam::Bytes) -> Result<(), String> {
        self.restore(data)
    }
    /// Whether `restore(data)` would succeed, changing nothing: a snapshot from a peer is
    /// checked with it before it is taken, and refused if it fails.
    fn check_snapshot(&self, data: &[u8]) -> Result<(), String>;
}
