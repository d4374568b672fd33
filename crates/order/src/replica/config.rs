//! A replica's vocabulary: its settings, its local requests, its counters.

use crate::membership::MemberChange;
use crate::types::{Addr, OrderMsg};

/// Settings of a replica.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This replica's address (also its Raft id; not 0).
    pub id: Addr,
    /// The replicas that founded the cluster, this one included (the same list on each of
    /// them); empty for a replica that joins an existing cluster, which learns the
    /// configuration from the leader's snapshot. Once the log holds a snapshot, the
    /// configuration comes from the log alone (membership changes are applied from it).
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
    /// A snapshot is taken (and the log compacted) once this many entries were finally
    /// delivered since the last one and they hold an eighth of the state's size.
    pub snapshot_every: u64,
    /// Append messages in flight per follower (pipelining).
    pub max_inflight: usize,
    /// At most this many entries are delivered optimistically, and this many finally, in one
    /// step (at least one each): a replica catching up on a long log (after a snapshot or a
    /// restart) goes on at its next input instead of going silent for its peers while it
    /// applies the whole backlog. The order node's task steps it again at once while
    /// [`crate::Replica::has_backlog`] says so (after reading its inbox); a host that does not
    /// look goes on at the replica's next input.
    pub deliveries_per_step: usize,
    /// Seeds the jitter added to ticks, which keeps elections from splitting forever, and the
    /// numbering of this start's batches: give each start of a replica a seed of its own.
    pub seed: u64,
    /// Snapshots travel to other replicas in chunks of at most this many bytes (keep it well
    /// under the transport's frame limit: a quarter of it leaves room for the envelope).
    pub snapshot_chunk_bytes: usize,
    /// The largest snapshot this replica accepts from another, in bytes (what it holds in
    /// memory while the snapshot arrives).
    pub snapshot_max_bytes: u64,
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
    /// Take a snapshot stream's chunks in the order they arrive, whatever their offset, and
    /// skip the checksum.
    UncheckedStream,
    /// Deliver (and apply) committed entries before this replica's own write of them is
    /// durable: a leader's readers then see entries that its crash can take back.
    ApplyBeforeDurable,
    /// Decide whether a request expired by this replica's own clock instead of the log's
    /// time: replicas whose clocks differ then run different requests.
    ExpireByOwnClock,
    /// Count batch acknowledgements against the founding replicas instead of the
    /// configuration in the log: once members are replaced, a batch is ordered that too few
    /// of the current voters hold, or none is ordered at all.
    FoundingQuorum,
    /// Take a snapshot whose state was encoded off the replica's step at the position the
    /// replica reached when the bytes came back, not at the one the state was pinned at: the
    /// entries between are then missing from a state restored from it.
    SnapshotWhereEncoded,
    /// Never take a snapshot because raft-rs wanted one the latest could not serve: a learner
    /// added after a leader's latest snapshot waits for the next one counted by
    /// `snapshot_every`.
    NoSnapshotForLearners,
    /// Decide whether an entry's batch was delivered before by the ids remembered alone,
    /// ignoring when the batch lapsed, while lapsed batches are still forgotten: a batch
    /// ordered again after it was forgotten everywhere is then waited for forever.
    LapseIgnored,
    /// End a client's session 100 ms (of log time) before its latest deadline, on every
    /// replica alike: a copy of a request that arrives then is taken for new and runs again.
    SessionEndsEarly,
}

impl ReplicaConfig {
    /// Defaults for replica `id` of `replicas`: batches of up to 256 requests sealed at the next
    /// tick, election after 10 ticks, heartbeat every 2, retries every 10 ticks, a snapshot every
    /// 10,000 entries, 256 appends in flight, 256 entries delivered per step each way,
    /// snapshots sent in chunks of 1 MiB and accepted up
    /// to 64 GiB.
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
            deliveries_per_step: 256,
            snapshot_chunk_bytes: 1 << 20,
            snapshot_max_bytes: 64 << 30,
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
    /// Propose `change` of the membership (the leader only). The replica answers with a
    /// [`crate::Delivery::MemberChange`] carrying `ticket` (the host's number for it): the
    /// position it was proposed at, or why not. It has taken effect when a
    /// [`crate::Delivery::Membership`] at that position or later shows it (a leader change can
    /// drop a proposal: ask again).
    ChangeMembership {
        /// The host's number for this change.
        ticket: u64,
        /// The change.
        change: MemberChange,
    },
    /// Take a snapshot at the position finally delivered now, however short the log since
    /// the last one (a backup wants one): [`Replica::snapshot_copy`](crate::Replica::snapshot_copy)
    /// returns it once it is taken (its state may be encoded off the step).
    SnapshotNow,
    /// The state the replica asked for with [`crate::Delivery::EncodeSnapshot`] at `seq`,
    /// encoded: the replica takes its snapshot there (unless a later one was installed since).
    /// Empty bytes: the host could not encode it (the replica asks again later).
    SnapshotEncoded {
        /// The position.
        seq: u64,
        /// The state machine's state there.
        state: Vec<u8>,
    },
}

/// What a replica reacts to: messages, ticks (one each), [`Command`]s and persistence
/// confirmations.
pub type Input = atomos_seam::Input<OrderMsg, Command>;

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
    /// Snapshots from peers refused because their state does not decode, they were larger
    /// than `snapshot_max_bytes`, or their checksum did not match.
    pub snapshots_refused: u64,
    /// Snapshots streamed to other replicas to the end.
    pub snapshots_sent: u64,
    /// Snapshot streams that did not arrive: the receiver went silent or refused it, or a
    /// Raft snapshot replaced a state it had asked for.
    pub snapshot_streams_abandoned: u64,
    /// Raft messages from peers refused as malformed (see `raft_guard`).
    pub raft_refused: u64,
    /// Votes withheld while this replica, rejoining after losing its log, caught up.
    pub votes_withheld: u64,
    /// Peers this leader started over with because their log was shorter than acknowledged.
    pub peers_restarted: u64,
    /// Membership changes applied from the log.
    pub membership_changes: u64,
    /// Proposals forwarded to this leader that it dropped: every batch they would order is in
    /// its log already, or delivered.
    pub proposals_dropped: u64,
    /// Messages dropped because their sender is no member: state (snapshots, streams) from a
    /// replica this one neither counts as a member nor follows, and proposals forwarded by a
    /// replica that is no member (a removed replica that still runs, say).
    pub from_non_members: u64,
    /// Entries whose batch had lapsed (every deadline in it before the entry's log time): they
    /// ordered nothing.
    pub batches_lapsed: u64,
    /// Delivered batch ids and batch contents forgotten once they lapsed.
    pub batches_forgotten: u64,
    /// Client sessions forgotten once the log's time passed their latest deadline.
    pub sessions_forgotten: u64,
}

impl OrderStats {
    /// Every counter by name (nodes publish each as `atomos_order_replica_NAME_total`).
    pub fn counters(&self) -> [(&'static str, u64); 19] {
        [
            ("opt_delivered", self.opt_delivered),
            ("final_delivered", self.final_delivered),
            ("revoked", self.revoked),
            ("requests_delivered", self.requests_delivered),
            ("snapshots_installed", self.snapshots_installed),
            ("snapshots_taken", self.snapshots_taken),
            ("snapshots_failed", self.snapshots_failed),
            ("snapshots_refused", self.snapshots_refused),
            ("snapshots_sent", self.snapshots_sent),
            (
                "snapshot_streams_abandoned",
                self.snapshot_streams_abandoned,
            ),
            ("raft_refused", self.raft_refused),
            ("votes_withheld", self.votes_withheld),
            ("peers_restarted", self.peers_restarted),
            ("membership_changes", self.membership_changes),
            ("proposals_dropped", self.proposals_dropped),
            ("from_non_members", self.from_non_members),
            ("batches_lapsed", self.batches_lapsed),
            ("batches_forgotten", self.batches_forgotten),
            ("sessions_forgotten", self.sessions_forgotten),
        ]
    }
}
