//! An OSS node's settings: its members and domains, the commit protocol, timers, and the bugs
//! it can be built with on purpose.

use atomos_order::ReplicaConfig;

/// Settings of an OSS node.
#[derive(Clone, Debug)]
pub struct OssConfig {
    /// This node.
    pub id: u64,
    /// Every member, this one included.
    pub members: Vec<u64>,
    /// The consistency domains' key prefixes; a key belongs to the domain of the longest
    /// prefix it starts with, and to domain 0 if none (domain 0's prefix is usually "").
    pub domains: Vec<String>,
    /// Keys under this prefix are this node's alone: never replicated, committed locally.
    pub local_prefix: String,
    /// Applied write sets kept per domain for others who missed them.
    pub history_max: usize,
    /// The log is compacted once this many records were written since the last compaction.
    pub compact_after: usize,
    /// Ticks a missing write set is waited for before it is fetched.
    pub gap_after: u64,
    /// Ticks before a commit request without an answer is sent again.
    pub resend_after: u64,
    /// Ticks without progress on a commit before its domain's epoch is suspected.
    pub suspect_after: u64,
    /// The held watermarks are told again every this many ticks (messages may be lost).
    pub held_every: u64,
    /// The control log's order replica (its id and replicas are this node's and the
    /// members'). Its seed also tells this run's transaction ids from other runs': draw it
    /// anew at each start.
    pub replica: ReplicaConfig,
    /// How commits are numbered: by an ultra-peer, or by whoever holds the token.
    pub commit: CommitMode,
    /// A bug planted on purpose, to show the simulation catches it (tests only).
    pub planted_bug: Option<OssBug>,
    /// This node lost its log (a wiped disk): until it holds every write set the others
    /// hold, it reports no mark when an epoch is suspected (what it held before is gone, and a
    /// low mark could let the next epoch start below a committed id). Also set on the control
    /// replica (`replica.rejoin`), which withholds its votes meanwhile.
    pub rejoin: bool,
}

/// How a domain's commits are numbered (OSS III, IV). Epochs, recovery and installing
/// write sets are the same in every mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CommitMode {
    /// Ultra-peer commit: the epoch's named node numbers every node's commits (figure 3).
    #[default]
    UltraPeer,
    /// Peer-to-peer commit with distributed token passing: the token goes to whoever asks,
    /// requests follow the predicted holder and travel inside the token (figure 4).
    DistributedToken,
    /// Peer-to-peer commit with coordinator-based token passing: requests go to the epoch's
    /// named node, which hands the token out; it returns there when nobody waits (figure 5).
    CoordinatorToken,
}

impl CommitMode {
    /// Every mode, by its name in configurations and on the command line.
    pub const NAMES: [(&'static str, CommitMode); 3] = [
        ("ultra-peer", CommitMode::UltraPeer),
        ("distributed-token", CommitMode::DistributedToken),
        ("coordinator-token", CommitMode::CoordinatorToken),
    ];

    /// The mode named `name`.
    pub fn parse(name: &str) -> Option<CommitMode> {
        CommitMode::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, m)| *m)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        CommitMode::NAMES
            .iter()
            .find(|(_, m)| *m == self)
            .map_or("ultra-peer", |(n, _)| n)
    }
}

/// Bugs the simulation must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OssBug {
    /// The sequencer numbers every request without validating its reads.
    SkipValidation,
    /// A write set counts as stable once one node holds it (no majority awaited).
    StableAtOne,
    /// A node takes a token again when the network delivers it twice (no hop check).
    TokenTakenTwice,
    /// A compaction keeps a fenced domain's fences before the write sets it received (a
    /// replay then refuses them).
    FencesFirst,
}

impl OssConfig {
    /// The applied write sets a node keeps per domain unless told otherwise.
    pub const DEFAULT_HISTORY_MAX: usize = 10_000;

    /// Records written between two compactions of the log unless told otherwise.
    pub const DEFAULT_COMPACT_AFTER: usize = 50_000;

    /// Node `id` of `members`: one domain for every key, `local/` keys node-local, 10,000
    /// write sets of history, the log compacted every 50,000 records, fetch after 5 ticks,
    /// re-send after 10, suspect after 40, held watermarks re-told every 5; the control log never compacts and is delivered without a
    /// per-step limit (its entries are few).
    pub fn new(id: u64, members: Vec<u64>) -> OssConfig {
        let mut replica = ReplicaConfig::new(id, members.clone());
        replica.snapshot_every = u64::MAX;
        // Its host steps the control replica only when an input comes (it does not look at
        // `has_backlog`): its few entries are delivered whole.
        replica.deliveries_per_step = usize::MAX;
        OssConfig {
            id,
            members,
            domains: vec![String::new()],
            local_prefix: "local/".into(),
            history_max: Self::DEFAULT_HISTORY_MAX,
            compact_after: Self::DEFAULT_COMPACT_AFTER,
            gap_after: 5,
            resend_after: 10,
            suspect_after: 40,
            held_every: 5,
            replica,
            commit: CommitMode::UltraPeer,
            planted_bug: None,
            rejoin: false,
        }
    }
}
