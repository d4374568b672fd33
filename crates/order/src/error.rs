//! Why a replica cannot go on.

/// Why a replica cannot go on (it must be stopped, and restarted from its disk if that holds
/// a usable log).
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
