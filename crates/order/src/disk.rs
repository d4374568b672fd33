//! What a replica persists, and where: a write-ahead log of [`Record`]s.
//!
//! [`FileDisk`] keeps it in a file: each record is `[length u32 BE][crc32 u32 BE][payload]`, the
//! payload postcard-encoded. On opening, records are read until the first that is short or whose
//! checksum does not match; the file is cut back to the last good record with a logged warning,
//! so a torn or corrupt tail is never delivered. [`MemDisk`] keeps records in memory and, in the
//! simulator, loses what was not synced when the node crashes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::types::{BatchId, Request};

/// One durable fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// Raft entries (protobuf-encoded), replacing the log from the first one's index on.
    Entries(Vec<Vec<u8>>),
    /// Raft's hard state.
    HardState {
        /// Current term.
        term: u64,
        /// Vote in that term.
        vote: u64,
        /// Commit index.
        commit: u64,
    },
    /// A snapshot (protobuf), received from the leader or taken here at compaction: it replaces
    /// the whole log before the records that follow it.
    Installed(Vec<u8>),
    /// A batch this replica formed or received.
    Batch {
        /// Its id.
        id: BatchId,
        /// Its requests.
        requests: Vec<Request>,
    },
}

/// Where records go.
pub trait Disk {
    /// Appends a record (durable after the next [`Disk::sync`], as the policy says).
    fn append(&mut self, record: &Record) -> io::Result<()>;
    /// Makes appended records durable, as the fsync policy says.
    fn sync(&mut self) -> io::Result<()>;
    /// Replaces every record with `records` (after a compaction), durably.
    fn rewrite(&mut self, records: &[Record]) -> io::Result<()>;
    /// Every durable record, in order.
    fn load(&mut self) -> io::Result<Vec<Record>>;
}

impl<D: Disk + ?Sized> Disk for Box<D> {
    fn append(&mut self, record: &Record) -> io::Result<()> {
        (**self).append(record)
    }
    fn sync(&mut self) -> io::Result<()> {
        (**self).sync()
    }
    fn rewrite(&mut self, records: &[Record]) -> io::Result<()> {
        (**self).rewrite(records)
    }
    fn load(&mut self) -> io::Result<Vec<Record>> {
        (**self).load()
    }
}

/// When [`FileDisk`] calls fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// At every sync: nothing acknowledged is lost when the machine loses power.
    EveryBatch,
    /// At a sync at least this long after the previous fsync.
    Every(Duration),
    /// Never (the operating system writes back when it likes): for in-memory clusters and
    /// benchmarks.
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

/// Records in memory. Synced records survive [`MemDisk::crash`]; the others are lost.
#[derive(Clone, Debug, Default)]
pub struct MemDisk {
    durable: Vec<Record>,
    unsynced: Vec<Record>,
}

impl MemDisk {
    /// An empty disk.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// The machine crashed: what was not synced is gone.
    pub fn crash(&mut self) {
        self.unsynced.clear();
    }

    /// Records held (durable and not), for tests.
    pub fn len(&self) -> usize {
        self.durable.len() + self.unsynced.len()
    }

    /// Whether nothing was ever written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Disk for MemDisk {
    fn append(&mut self, record: &Record) -> io::Result<()> {
        self.unsynced.push(record.clone());
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        self.durable.append(&mut self.unsynced);
        Ok(())
    }

    fn rewrite(&mut self, records: &[Record]) -> io::Result<()> {
        self.unsynced.clear();
        self.durable = records.to_vec();
        Ok(())
    }

    fn load(&mut self) -> io::Result<Vec<Record>> {
        Ok(self.durable.clone())
    }
}

/// Records in a file, checksummed.
pub struct FileDisk {
    path: PathBuf,
    file: File,
    policy: FsyncPolicy,
    last_fsync: Instant,
    pending: Vec<u8>,
}

const HEADER: usize = 8;

impl FileDisk {
    /// Opens (or creates) the log at `path`.
    pub fn open(path: &Path, policy: FsyncPolicy) -> io::Result<FileDisk> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)?;
        Ok(FileDisk {
            path: path.to_path_buf(),
            file,
            policy,
            last_fsync: Instant::now(),
            pending: Vec::new(),
        })
    }

    fn frame(record: &Record, out: &mut Vec<u8>) -> io::Result<()> {
        let payload = postcard::to_stdvec(record)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_be_bytes());
        out.extend_from_slice(&payload);
        Ok(())
    }
}

/// Splits a log file's bytes into records; returns them and how many bytes were good.
pub fn parse_log(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while bytes.len() - at >= HEADER {
        let len =
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize;
        let crc = u32::from_be_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        match postcard::from_bytes::<Record>(payload) {
            Ok(r) => records.push(r),
            Err(_) => break,
        }
        at += HEADER + len;
    }
    (records, at)
}

impl Disk for FileDisk {
    fn append(&mut self, record: &Record) -> io::Result<()> {
        FileDisk::frame(record, &mut self.pending)
    }

    fn sync(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.file.write_all(&self.pending)?;
            self.pending.clear();
        }
        let due = match self.policy {
            FsyncPolicy::EveryBatch => true,
            FsyncPolicy::Every(d) => self.last_fsync.elapsed() >= d,
            FsyncPolicy::Never => false,
        };
        if due {
            self.file.sync_data()?;
            self.last_fsync = Instant::now();
        }
        Ok(())
    }

    fn rewrite(&mut self, records: &[Record]) -> io::Result<()> {
        let mut bytes = Vec::new();
        for r in records {
            FileDisk::frame(r, &mut bytes)?;
        }
        let tmp = self.path.with_extension("rewrite");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            if self.policy != FsyncPolicy::Never {
                f.sync_all()?;
            }
        }
        fs::rename(&tmp, &self.path)?;
        self.pending.clear();
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)?;
        Ok(())
    }

    fn load(&mut self) -> io::Result<Vec<Record>> {
        let mut bytes = Vec::new();
        File::open(&self.path)?.read_to_end(&mut bytes)?;
        let (records, good) = parse_log(&bytes);
        if good < bytes.len() {
            tracing::warn!(
                path = %self.path.display(),
                kept_bytes = good,
                cut_bytes = bytes.len() - good,
                records = records.len(),
                "write-ahead log has a torn or corrupt tail; cutting it back to the last good record"
            );
            let f = OpenOptions::new().write(true).open(&self.path)?;
            f.set_len(good as u64)?;
            f.sync_all()?;
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u64) -> Record {
        Record::Batch {
            id: BatchId { origin: 1, n },
            requests: vec![Request {
                client: 9,
                seq: n,
                payload: vec![n as u8; 10],
            }],
        }
    }

    #[test]
    fn a_corrupt_or_torn_tail_is_cut_back() {
        let dir = std::env::temp_dir().join(format!("atomos-wal-{}", std::process::id()));
        let path = dir.join("wal");
        let _ = fs::remove_file(&path);
        let mut d = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        for n in 1..=3 {
            d.append(&batch(n)).unwrap();
        }
        d.sync().unwrap();
        assert_eq!(d.load().unwrap(), vec![batch(1), batch(2), batch(3)]);

        // Flip a byte in the last record's payload: records 1 and 2 survive.
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let mut d = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        assert_eq!(d.load().unwrap(), vec![batch(1), batch(2)]);
        // The file was cut: appending continues cleanly after record 2.
        d.append(&batch(4)).unwrap();
        d.sync().unwrap();
        assert_eq!(d.load().unwrap(), vec![batch(1), batch(2), batch(4)]);

        // A torn write (half a record) is cut too.
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0, 0, 0, 50, 1, 2]);
        fs::write(&path, &bytes).unwrap();
        let mut d = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        assert_eq!(d.load().unwrap().len(), 3);
        d.rewrite(&[batch(7)]).unwrap();
        assert_eq!(d.load().unwrap(), vec![batch(7)]);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn mem_disk_loses_only_unsynced_records() {
        let mut d = MemDisk::new();
        d.append(&batch(1)).unwrap();
        d.sync().unwrap();
        d.append(&batch(2)).unwrap();
        d.crash();
        assert_eq!(d.load().unwrap(), vec![batch(1)]);
    }
}
