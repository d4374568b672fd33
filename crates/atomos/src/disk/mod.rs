//! A protocol machine's write-ahead log in a file, and the thread that writes and fsyncs it.
//!
//! [`FileDisk`] keeps records framed and checksummed ([`atomos_seam::wal`]). Opening it reads the
//! records back: a torn final record (a crash in the middle of an append) is cut with a
//! warning; a damaged record before the tail makes opening fail with the file and the offset
//! ([`DiskError::Corrupt`]), because cutting there would forget durable records (for Raft,
//! votes and acknowledged entries). Creating the file and replacing it after a compaction
//! fsync its directory too, so neither is lost with the directory entry.
//!
//! [`DiskWorker`] runs a disk on a thread of its own, never on the async workers that carry
//! heartbeats and connections: writes arrive through a bounded queue (a full queue makes the
//! sender wait: backpressure), are grouped under one fsync when they come together, and the
//! worker reports how far they are durable, or the error that stopped it.

mod file;
mod worker;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use file::write_log_file;
pub use file::{read_log, FileDisk};
pub use worker::{Abandon, DiskEvent, DiskWorker, TryWriteError};

/// When [`FileDisk`] calls fsync, and so when a write counts as durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Before a write is reported durable: nothing acknowledged is lost when the machine loses
    /// power. Writes that arrive together share one fsync.
    EveryBatch,
    /// Writes are reported durable once written to the operating system, and fsynced within
    /// this period (even when no later write comes). A process crash loses nothing; a power
    /// loss forgets up to that much, votes and acknowledged Raft entries included, which can
    /// break Raft's safety (two leaders in a term, a lost committed entry).
    Every(Duration),
    /// Never (the operating system writes back when it likes): safe against process crashes
    /// only, like [`FsyncPolicy::Every`]; for benchmarks and throwaway clusters.
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    /// `batch`, `never` (or `off`), or a period in milliseconds like `10ms`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "batch" => Ok(FsyncPolicy::EveryBatch),
            "never" | "off" => Ok(FsyncPolicy::Never),
            other => other
                .strip_suffix("ms")
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|&n| n > 0)
                .map(|n| FsyncPolicy::Every(Duration::from_millis(n)))
                .ok_or_else(|| format!("{other:?} is not batch, never or a period like 10ms")),
        }
    }
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::EveryBatch => f.write_str("batch"),
            FsyncPolicy::Every(d) => write!(f, "{}ms", d.as_millis()),
            FsyncPolicy::Never => f.write_str("never"),
        }
    }
}

/// Why a log cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// Reading, writing or syncing failed.
    #[error("write-ahead log {path}: {source}")]
    Io {
        /// The log file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A record before the end of the log is damaged.
    #[error(
        "write-ahead log {path}: the record at byte {offset} is damaged and is not the last \
         ({records_before} good records before it); refusing to start, because cutting the log \
         there would forget durable records (restore this replica's data from another one)"
    )]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// Where the damaged record starts.
        offset: usize,
        /// Good records before it.
        records_before: usize,
    },
}
