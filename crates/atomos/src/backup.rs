//! Backups: one member's snapshot of a live `certify` or `active` cluster at one log position,
//! in a file that says what it holds and checks itself, and the data directories of a new
//! cluster seeded from one.
//!
//! A file is `ATOMOSBK`, the header's length (4 bytes, little-endian), the header (postcard:
//! the format, the protocol, the position, its term and log time, when and where it was taken,
//! the lengths of what follows and their CRC-32), the header's CRC-32 (4 bytes), then the
//! replica's tables and the state machine's state at that position. A member serves one as
//! [`NodeMsg::BackupBegin`](crate::wire::NodeMsg) and chunks of it by offset.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use atomos_order::SnapshotCopy;
use atomos_seam::Bytes;
use serde::{Deserialize, Serialize};

/// What a backup file starts with.
pub const BACKUP_MAGIC: [u8; 8] = *b"ATOMOSBK";

/// The backup format this build writes (and the newest it reads).
pub const BACKUP_FORMAT: u16 = 1;

/// The protocols whose clusters are backed up (a backup's header names one).
pub const PROTOCOLS: [&str; 2] = ["certify", "active"];

/// What a backup holds, as its header says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupHeader {
    /// The file's format ([`BACKUP_FORMAT`] when this build wrote it).
    pub format: u16,
    /// The protocol of the cluster it was taken from (`certify` or `active`).
    pub protocol: String,
    /// The log position it covers: every entry through it, none after.
    pub index: u64,
    /// The Raft term of that entry.
    pub term: u64,
    /// The log's time there (milliseconds since the Unix epoch).
    pub log_time: u64,
    /// When it was taken, by the serving member's clock (milliseconds since the Unix epoch).
    pub taken_ms: u64,
    /// The member that served it.
    pub source: u64,
    /// The length of the replica's tables...
    pub tables_len: u64,
    /// ...and of the state machine's state that follow the header.
    pub state_len: u64,
    /// The CRC-32 of the tables and the state, in that order.
    pub checksum: u32,
}

/// Why a backup could not be read, written or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The file is not a backup, or it is damaged (truncated, a checksum that does not match,
    /// a part that does not decode).
    #[error("{path}: {reason}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is a backup of a format this build does not read.
    #[error("{path}: backup format {found}; this build reads formats 1 to {BACKUP_FORMAT}")]
    Format {
        /// The file.
        path: PathBuf,
        /// Its format.
        found: u16,
    },
    /// A restore was asked for that cannot be made (why, in words).
    #[error("{0}")]
    Refused(String),
}

/// A backup: its header, the replica's tables and the state machine's state.
#[derive(Clone, Debug)]
pub struct Backup {
    /// What it holds.
    pub header: BackupHeader,
    head: Vec<u8>,
    tables: Vec<u8>,
    state: Bytes,
}

impl Backup {
    /// A backup of `copy`, a snapshot of a `protocol` cluster served by member `source` at
    /// `taken_ms`.
    pub fn of(protocol: &str, source: u64, taken_ms: u64, copy: SnapshotCopy) -> Backup {
        let mut crc = crc32fast::Hasher::new();
        crc.update(&copy.tables);
        crc.update(&copy.state);
        let header = BackupHeader {
            format: BACKUP_FORMAT,
            protocol: protocol.to_string(),
            index: copy.index,
            term: copy.term,
            log_time: copy.log_time,
            taken_ms,
            source,
            tables_len: copy.tables.len() as u64,
            state_len: copy.state.len() as u64,
            checksum: crc.finalize(),
        };
        Backup {
            head: encode_head(&header),
            header,
            tables: copy.tables,
            state: copy.state,
        }
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.head.len() as u64 + self.tables.len() as u64 + self.state.len() as u64
    }

    /// Whether the file is empty (never: it holds at least its header).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Up to `len` bytes of the file from `offset` (fewer at its end, none past it).
    pub fn chunk(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len.min(self.len().saturating_sub(offset) as usize));
        // The next byte wanted, and where the part at hand starts, in the file.
        let (mut at, mut start) = (offset, 0u64);
        for part in [&self.head[..], &self.tables[..], &self.state[..]] {
            let end = start + part.len() as u64;
            if out.len() < len && (start..end).contains(&at) {
                let from = (at - start) as usize;
                let take = (part.len() - from).min(len - out.len());
                out.extend_from_slice(&part[from..from + take]);
                at += take as u64;
            }
            start = end;
        }
        out
    }

    /// The snapshot it holds.
    pub fn snapshot(&self) -> SnapshotCopy {
        SnapshotCopy {
            index: self.header.index,
            term: self.header.term,
            log_time: self.header.log_time,
            tables: self.tables.clone(),
            state: self.state.clone(),
        }
    }

    /// Reads and checks the backup at `path`: its header, both checksums, the replica's
    /// tables and the store's state (each must decode).
    pub fn read(path: &Path) -> Result<Backup, BackupError> {
        let damaged = |reason: String| BackupError::Damaged {
            path: path.to_path_buf(),
            reason,
        };
        let io = |source| BackupError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = fs::File::open(path).map_err(io)?;
        let mut magic = [0u8; 12];
        file.read_exact(&mut magic)
            .map_err(|_| damaged("too short to be a backup".into()))?;
        if magic[..8] != BACKUP_MAGIC {
            return Err(damaged(
                "not an atomos backup (no ATOMOSBK at its start)".into(),
            ));
        }
        let head_len = u32::from_le_bytes([magic[8], magic[9], magic[10], magic[11]]) as usize;
        if head_len > 1 << 20 {
            return Err(damaged(format!("a header of {head_len} bytes")));
        }
        let mut head = vec![0u8; head_len + 4];
        file.read_exact(&mut head)
            .map_err(|_| damaged("the header is cut short".into()))?;
        let (bytes, crc) = head.split_at(head_len);
        if crc32fast::hash(bytes).to_le_bytes() != crc {
            return Err(damaged("the header's checksum does not match".into()));
        }
        // The format comes first, so that a later format is named even if the rest differs.
        let format = postcard::take_from_bytes::<u16>(bytes)
            .map_err(|e| damaged(format!("the header: {e}")))?
            .0;
        if format == 0 || format > BACKUP_FORMAT {
            return Err(BackupError::Format {
                path: path.to_path_buf(),
                found: format,
            });
        }
        let header: BackupHeader =
            postcard::from_bytes(bytes).map_err(|e| damaged(format!("the header: {e}")))?;
        if !PROTOCOLS.contains(&header.protocol.as_str()) {
            return Err(damaged(format!(
                "the header names protocol {:?}; backups are of {}",
                header.protocol,
                PROTOCOLS.join(" and ")
            )));
        }
        if header.index == 0 {
            return Err(damaged("the header names log position 0".into()));
        }
        let mut rest = Vec::new();
        file.read_to_end(&mut rest).map_err(io)?;
        let expected = header.tables_len.saturating_add(header.state_len);
        if rest.len() as u64 != expected {
            return Err(damaged(format!(
                "{} bytes follow the header, which says {expected}",
                rest.len()
            )));
        }
        if crc32fast::hash(&rest) != header.checksum {
            return Err(damaged("the contents' checksum does not match".into()));
        }
        let state = Bytes::from(rest.split_off(header.tables_len as usize));
        let backup = Backup {
            head: encode_head(&header),
            header,
            tables: rest,
            state,
        };
        let copy = backup.snapshot();
        copy.check().map_err(|e| damaged(e.to_string()))?;
        atomos_protocols::replicated::check_state(&copy.state)
            .map_err(|e| damaged(format!("the store's state: {e}")))?;
        Ok(backup)
    }

    /// Writes the backup to `path` (through a file beside it, fsynced and renamed over it,
    /// so that `path` never holds part of one).
    pub fn write(&self, path: &Path) -> Result<(), BackupError> {
        let io = |source| BackupError::Io {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension("partial");
        let mut file = fs::File::create(&tmp).map_err(io)?;
        for part in [&self.head[..], &self.tables[..], &self.state[..]] {
            file.write_all(part).map_err(io)?;
        }
        file.sync_all().map_err(io)?;
        fs::rename(&tmp, path).map_err(io)?;
        Ok(())
    }

    /// Seeds `dir` as the data directory of a member of a new cluster of `members` (ids; every
    /// member's directory is seeded alike): its write-ahead log starts at the backup's
    /// position, with its state, under the new members. `dir` must hold no log of the
    /// backup's protocol yet. Returns the log's path.
    pub fn restore(&self, dir: &Path, members: &[u64]) -> Result<PathBuf, BackupError> {
        if !PROTOCOLS.contains(&self.header.protocol.as_str()) {
            return Err(BackupError::Refused(format!(
                "a backup of protocol {:?} is not restored",
                self.header.protocol
            )));
        }
        let path = dir.join(format!("{}.wal", self.header.protocol));
        if path.exists() {
            return Err(BackupError::Refused(format!(
                "{} exists: a backup is restored into a new data directory only",
                path.display()
            )));
        }
        let records = self
            .snapshot()
            .seed_records(members)
            .map_err(|e| BackupError::Refused(e.to_string()))?;
        let io = |source| BackupError::Io {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(dir).map_err(io)?;
        let records: Vec<Bytes> = records.iter().map(|r| Bytes::from(r.encode())).collect();
        crate::disk::write_log_file(&path, &records, true).map_err(io)?;
        Ok(path)
    }
}

/// The bytes before the tables: magic, the header's length, the header, its CRC-32.
fn encode_head(header: &BackupHeader) -> Vec<u8> {
    // Encoding plain data into a vector does not fail.
    let bytes = postcard::to_stdvec(header).unwrap_or_default();
    let mut head = Vec::with_capacity(16 + bytes.len());
    head.extend_from_slice(&BACKUP_MAGIC);
    head.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    head.extend_from_slice(&bytes);
    head.extend_from_slice(&crc32fast::hash(&bytes).to_le_bytes());
    head
}
