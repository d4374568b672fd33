//! What an OSS node is asked, what it counts, and why it stops.

use atomos_core::Key;
use atomos_order::OrderError;
use atomos_seam::Output;

use super::msg::{OssDelivery, OssMsg};

/// Why a node cannot go on (it must restart from its disk).
#[derive(Debug, thiserror::Error)]
pub enum OssError {
    /// The control log's replica failed.
    #[error("control log: {0}")]
    Order(#[from] OrderError),
    /// A record of the log does not decode.
    #[error("log record {index} does not decode: {reason}")]
    Record {
        /// Its place in the log.
        index: usize,
        /// The decoder's explanation.
        reason: String,
    },
    /// The configuration cannot work.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The control replica asked for something this node does not do.
    #[error("the control log asked to {0}, which an OSS node does not do")]
    Unsupported(&'static str),
}

/// A request of the application on this node.
#[derive(Clone, Debug, PartialEq)]
pub enum OssRequest {
    /// Commit a transaction: `tx` is the caller's number for it; `reads` the engine versions
    /// it read; `writes` what it wrote.
    Commit {
        /// The caller's number.
        tx: u64,
        /// Each key read, with the engine version read (0: never written).
        reads: Vec<(Key, u64)>,
        /// Each key written once (`None`: deleted).
        writes: Vec<(Key, Option<Vec<u8>>)>,
    },
    /// A commit of nothing through domain 0's sequencer: once it is answered, this node has
    /// installed every commit of that domain acknowledged anywhere before the request.
    Barrier {
        /// The caller's number.
        tx: u64,
    },
}

/// What a node counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OssCounters {
    /// Commits of node-local keys only.
    pub local_commits: u64,
    /// This node's commits that went through a sequencer and committed.
    pub commits: u64,
    /// Its commits that aborted.
    pub aborts: u64,
    /// Write sets this node numbered as a sequencer.
    pub numbered: u64,
    /// Write sets applied here.
    pub applied: u64,
    /// Fetches of missing write sets sent.
    pub fetches: u64,
    /// Suspicions this node ordered.
    pub suspicions: u64,
    /// Epochs started here.
    pub epochs: u64,
    /// Tokens passed to another node.
    pub token_passes: u64,
    /// Images of a domain sent to nodes that lacked write sets this node no longer kept.
    pub images_sent: u64,
    /// Images installed here.
    pub images_installed: u64,
    /// Compactions of the log.
    pub compactions: u64,
}

impl OssCounters {
    /// Each counter with its name (for metrics: `atomos_oss_<name>_total`).
    pub fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("local_commits", self.local_commits),
            ("commits", self.commits),
            ("aborts", self.aborts),
            ("numbered", self.numbered),
            ("applied", self.applied),
            ("fetches", self.fetches),
            ("suspicions", self.suspicions),
            ("epochs", self.epochs),
            ("token_passes", self.token_passes),
            ("images_sent", self.images_sent),
            ("images_installed", self.images_installed),
            ("compactions", self.compactions),
        ]
    }
}

/// What a step appends.
pub type OssOutput = Output<OssMsg, OssDelivery>;
