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

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_seam::{wal, Write};
use tokio::sync::mpsc;

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

/// A write-ahead log in a file.
pub struct FileDisk {
    path: PathBuf,
    file: File,
    policy: FsyncPolicy,
    /// Written and not yet fsynced since then (under [`FsyncPolicy::Every`]).
    dirty_since: Option<Instant>,
    /// The log's format (`seam::wal`): appends frame records in it.
    format: u32,
}

impl FileDisk {
    /// Opens (or creates) the log at `path` and reads its records: a torn final record is cut
    /// (with a warning), a damaged one before it is [`DiskError::Corrupt`].
    pub fn open(path: &Path, policy: FsyncPolicy) -> Result<(FileDisk, Vec<Vec<u8>>), DiskError> {
        let io = |source| DiskError::Io {
            path: path.to_path_buf(),
            source,
        };
        let dir = parent_dir(path);
        if !dir.exists() {
            fs::create_dir_all(dir).map_err(io)?;
            // The new directory's own entry must survive too.
            sync_dir(parent_dir(dir)).map_err(io)?;
        }
        let existed = path.exists();
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        if !existed {
            sync_dir(dir).map_err(io)?;
        }
        let (records, format, good_len) = read(path, true)?;
        let mut disk = FileDisk {
            path: path.to_path_buf(),
            file,
            policy,
            dirty_since: None,
            format,
        };
        if good_len == 0 {
            // A new (or emptied) log starts with the file header of this build's format.
            let mut header = Vec::new();
            wal::file_header(&mut header);
            disk.file.write_all(&header).map_err(io)?;
            disk.format = wal::FORMAT;
            if policy != FsyncPolicy::Never {
                disk.file.sync_data().map_err(io)?;
            }
        }
        Ok((disk, records))
    }

    fn io(&self, source: io::Error) -> DiskError {
        DiskError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Refuses records the framing cannot hold.
    fn check_sizes(&self, records: &[Vec<u8>]) -> Result<(), DiskError> {
        match records.iter().find(|r| r.len() > wal::MAX_RECORD) {
            Some(big) => Err(self.io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a record of {} bytes is too large for the log", big.len()),
            ))),
            None => Ok(()),
        }
    }

    /// Carries out a write (to the operating system; [`FileDisk::sync`] makes it durable).
    pub fn write(&mut self, write: &Write) -> Result<(), DiskError> {
        match write {
            Write::Append(records) => {
                self.check_sizes(records)?;
                let mut bytes = Vec::new();
                for r in records {
                    wal::frame(self.format, r, &mut bytes);
                }
                self.file.write_all(&bytes).map_err(|e| self.io(e))?;
                self.dirty_since.get_or_insert_with(Instant::now);
                Ok(())
            }
            Write::Rewrite(records) => self.rewrite(records),
        }
    }

    /// Replaces the log: the new one is written beside it, fsynced, renamed over it, and the
    /// directory fsynced, so a crash leaves either the old log or the new one.
    fn rewrite(&mut self, records: &[Vec<u8>]) -> Result<(), DiskError> {
        self.check_sizes(records)?;
        let mut bytes = Vec::new();
        wal::file_header(&mut bytes);
        for r in records {
            wal::frame(wal::FORMAT, r, &mut bytes);
        }
        let tmp = self.path.with_extension("rewrite");
        let at_tmp = |source| DiskError::Io {
            path: tmp.clone(),
            source,
        };
        {
            let mut f = File::create(&tmp).map_err(at_tmp)?;
            f.write_all(&bytes).map_err(at_tmp)?;
            if self.policy != FsyncPolicy::Never {
                f.sync_all().map_err(at_tmp)?;
            }
        }
        fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        if self.policy != FsyncPolicy::Never {
            sync_dir(parent_dir(&self.path)).map_err(|e| self.io(e))?;
        }
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.io(e))?;
        self.dirty_since = None;
        self.format = wal::FORMAT;
        Ok(())
    }

    /// Fsyncs what was written, if anything.
    pub fn sync(&mut self) -> Result<(), DiskError> {
        if self.dirty_since.is_some() {
            self.file.sync_data().map_err(|e| self.io(e))?;
            self.dirty_since = None;
        }
        Ok(())
    }

    /// When an fsync is due under [`FsyncPolicy::Every`] (`None`: nothing waits for one).
    pub fn sync_due(&self) -> Option<Instant> {
        match self.policy {
            FsyncPolicy::Every(period) => self.dirty_since.map(|t| t + period),
            FsyncPolicy::EveryBatch | FsyncPolicy::Never => None,
        }
    }

    /// The fsync policy.
    pub fn policy(&self) -> FsyncPolicy {
        self.policy
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Fsyncs a directory, making the creation, removal or renaming of its entries durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads the records of the log at `path` (an absent file holds none). With `repair`, a torn
/// final record is cut from the file (with a warning); without, it is only left out (for tools
/// that inspect a stopped node's log). A damaged record before the tail is an error either way.
pub fn read_log(path: &Path, repair: bool) -> Result<Vec<Vec<u8>>, DiskError> {
    read(path, repair).map(|(records, _, _)| records)
}

/// [`read_log`], with the log's format and the length of its good part.
fn read(path: &Path, repair: bool) -> Result<(Vec<Vec<u8>>, u32, usize), DiskError> {
    let io = |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes).map_err(io)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), wal::FORMAT, 0)),
        Err(e) => return Err(io(e)),
    };
    let parsed = wal::parse(&bytes).map_err(|c| DiskError::Corrupt {
        path: path.to_path_buf(),
        offset: c.offset,
        records_before: c.records_before,
    })?;
    if parsed.torn(bytes.len()) && repair {
        tracing::warn!(
            path = %path.display(),
            kept_bytes = parsed.good_len,
            cut_bytes = bytes.len() - parsed.good_len,
            records = parsed.records.len(),
            "write-ahead log ends in a torn record (a crash during an append); cutting it"
        );
        let f = OpenOptions::new().write(true).open(path).map_err(io)?;
        f.set_len(parsed.good_len as u64).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    Ok((parsed.records, parsed.format, parsed.good_len))
}

/// What a [`DiskWorker`] reports.
#[derive(Debug)]
pub enum DiskEvent {
    /// Every write up to the `through`-th (from 1) is durable as the policy defines it.
    Durable {
        /// The number of the latest durable write.
        through: u64,
        /// Whether everything written so far was fsynced, too.
        fsynced: bool,
    },
    /// The disk failed; the worker stopped and nothing after the last `Durable` is durable.
    Failed(DiskError),
}

/// A disk on a thread of its own. [`DiskWorker::close`] lets it finish the writes queued and
/// waits for it; [`Abandon::abandon`] (from [`DiskWorker::abandoner`]) makes it stop at the
/// next write without carrying out the rest (as if the process had died); dropping it closes
/// the queue without waiting.
pub struct DiskWorker {
    tx: mpsc::Sender<Write>,
    abandoned: Arc<AtomicBool>,
    /// Why the worker stopped, if it failed.
    failure: Arc<parking_lot::Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DiskWorker {
    /// Starts a thread that carries out writes on `disk` in order and calls `report` as they
    /// become durable (or once with the failure that stopped it, a panic included). At most
    /// `capacity` writes wait in the queue.
    pub fn spawn(
        name: String,
        disk: FileDisk,
        capacity: usize,
        report: impl Fn(DiskEvent) + Send + 'static,
    ) -> io::Result<DiskWorker> {
        let (tx, mut rx) = mpsc::channel(capacity.max(1));
        let abandoned = Arc::new(AtomicBool::new(false));
        let stop = abandoned.clone();
        let failure: Arc<parking_lot::Mutex<Option<String>>> = Arc::default();
        let cause = failure.clone();
        let path = disk.path.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // The cause is kept before the queue closes, so a writer that finds it closed can
            // say why.
            let note = move |e: DiskEvent| {
                if let DiskEvent::Failed(err) = &e {
                    cause.lock().get_or_insert_with(|| err.to_string());
                }
                report(e)
            };
            let run = std::panic::AssertUnwindSafe(|| write_loop(disk, &mut rx, &stop, &note));
            if std::panic::catch_unwind(run).is_err() {
                note(DiskEvent::Failed(DiskError::Io {
                    path,
                    source: io::Error::other("the disk thread panicked"),
                }));
            }
            drop(rx);
        })?;
        Ok(DiskWorker {
            tx,
            abandoned,
            failure,
            thread: Some(thread),
        })
    }

    /// Queues a write, waiting while the queue is full. Fails only if the worker stopped (it
    /// failed, or was abandoned), with why.
    pub async fn write(&self, write: Write) -> Result<(), String> {
        self.tx.send(write).await.map_err(|_| self.why_stopped())
    }

    /// Queues a write if the queue has room.
    pub fn try_write(&self, write: Write) -> Result<(), TryWriteError> {
        self.tx.try_send(write).map_err(|e| match e {
            mpsc::error::TrySendError::Full(w) => TryWriteError::Full(w),
            mpsc::error::TrySendError::Closed(_) => TryWriteError::Stopped(self.why_stopped()),
        })
    }

    fn why_stopped(&self) -> String {
        self.failure
            .lock()
            .clone()
            .unwrap_or_else(|| "the write-ahead log's writer stopped".to_string())
    }

    /// A handle that stops the worker at its next write, dropping the writes still queued (as
    /// if the process had died), from anywhere.
    pub fn abandoner(&self) -> Abandon {
        Abandon(self.abandoned.clone())
    }

    /// Closes the queue and waits (off the async workers) until the thread has carried out
    /// what was queued and ended.
    pub async fn close(mut self) {
        let (tx, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Why [`DiskWorker::try_write`] did not queue a write.
#[derive(Debug)]
pub enum TryWriteError {
    /// The queue is full: here is the write back.
    Full(Write),
    /// The worker stopped: why.
    Stopped(String),
}

/// Stops a [`DiskWorker`] at its next write ([`DiskWorker::abandoner`]).
#[derive(Clone, Debug)]
pub struct Abandon(Arc<AtomicBool>);

impl Abandon {
    /// The worker carries out no further write.
    pub fn abandon(&self) {
        self.0.store(true, Ordering::Release);
    }
}

fn write_loop(
    mut disk: FileDisk,
    rx: &mut mpsc::Receiver<Write>,
    abandoned: &AtomicBool,
    report: &dyn Fn(DiskEvent),
) {
    // A small runtime of this thread's own waits for writes or for a timed fsync.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(source) => {
            report(DiskEvent::Failed(DiskError::Io {
                path: disk.path.clone(),
                source,
            }));
            return;
        }
    };
    let mut written = 0u64;
    loop {
        let next = rt.block_on(async {
            match disk.sync_due() {
                Some(due) => tokio::time::timeout_at(due.into(), rx.recv()).await,
                None => Ok(rx.recv().await),
            }
        });
        if abandoned.load(Ordering::Acquire) {
            return;
        }
        let first = match next {
            Ok(Some(w)) => w,
            Ok(None) => {
                // The machine stopped: make what was written durable before going.
                let _ = disk.sync();
                return;
            }
            Err(_timed_out) => {
                match disk.sync() {
                    Ok(()) => report(DiskEvent::Durable {
                        through: written,
                        fsynced: true,
                    }),
                    Err(e) => {
                        report(DiskEvent::Failed(e));
                        return;
                    }
                }
                continue;
            }
        };
        // Everything already queued goes under the same fsync (group commit).
        let mut batch = vec![first];
        while batch.len() < 1024 {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let result =
            batch
                .iter()
                .try_for_each(|w| disk.write(w))
                .and_then(|()| match disk.policy() {
                    FsyncPolicy::EveryBatch => disk.sync(),
                    FsyncPolicy::Every(_) => match disk.sync_due() {
                        Some(due) if Instant::now() >= due => disk.sync(),
                        _ => Ok(()),
                    },
                    FsyncPolicy::Never => Ok(()),
                });
        match result {
            Ok(()) => {
                written += batch.len() as u64;
                report(DiskEvent::Durable {
                    through: written,
                    fsynced: disk.dirty_since.is_none(),
                });
            }
            Err(e) => {
                report(DiskEvent::Failed(e));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("atomos-disk-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir.join("wal")
    }

    fn append(d: &mut FileDisk, records: &[&[u8]]) {
        d.write(&Write::Append(records.iter().map(|r| r.to_vec()).collect()))
            .unwrap();
        d.sync().unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_and_appending_goes_on_after_it() {
        let path = temp("torn");
        let (mut d, none) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        assert!(none.is_empty());
        append(&mut d, &[b"one", b"two"]);
        drop(d);
        let mut bytes = fs::read(&path).unwrap();
        bytes.extend_from_slice(&[0, 0, 0, 50, 1, 2]); // half a record
        fs::write(&path, &bytes).unwrap();
        let (mut d, records) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        assert_eq!(records, vec![b"one".to_vec(), b"two".to_vec()]);
        append(&mut d, &[b"three"]);
        let (_, records) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        assert_eq!(records.len(), 3);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_damaged_record_in_the_middle_refuses_to_open_and_names_the_offset() {
        let path = temp("corrupt");
        let (mut d, _) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        append(&mut d, &[b"one", b"two", b"three"]);
        drop(d);
        let mut bytes = fs::read(&path).unwrap();
        bytes[wal::FILE_HEADER + wal::HEADER + 3 + wal::HEADER] ^= 0xff; // inside "two"
        fs::write(&path, &bytes).unwrap();
        let before = fs::read(&path).unwrap();
        match FileDisk::open(&path, FsyncPolicy::EveryBatch) {
            Err(DiskError::Corrupt {
                offset,
                records_before,
                ..
            }) => {
                assert_eq!(
                    (offset, records_before),
                    (wal::FILE_HEADER + wal::HEADER + 3, 1)
                );
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a corrupt log opened"),
        }
        assert_eq!(fs::read(&path).unwrap(), before, "the log was changed");
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    /// A log written before format 1 opens, takes appends in its own format, and is written
    /// in format 1 by its next rewrite.
    #[test]
    fn a_log_of_format_0_is_read_appended_to_and_rewritten_in_format_1() {
        let path = temp("format0");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut old = Vec::new();
        for r in [&b"one"[..], b"two"] {
            wal::frame(0, r, &mut old);
        }
        fs::write(&path, &old).unwrap();
        let (mut d, records) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        assert_eq!(records, vec![b"one".to_vec(), b"two".to_vec()]);
        append(&mut d, &[b"three"]);
        let bytes = fs::read(&path).unwrap();
        assert!(
            !bytes.starts_with(&wal::MAGIC),
            "an old log changed format mid-file"
        );
        assert_eq!(wal::parse(&bytes).unwrap().records.len(), 3);
        d.write(&Write::Rewrite(vec![b"four".to_vec()])).unwrap();
        append(&mut d, &[b"five"]);
        let bytes = fs::read(&path).unwrap();
        assert!(bytes.starts_with(&wal::MAGIC));
        let parsed = wal::parse(&bytes).unwrap();
        assert_eq!(parsed.format, wal::FORMAT);
        assert_eq!(parsed.records, vec![b"four".to_vec(), b"five".to_vec()]);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_rewrite_replaces_the_log() {
        let path = temp("rewrite");
        let (mut d, _) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        append(&mut d, &[b"one", b"two"]);
        d.write(&Write::Rewrite(vec![b"seven".to_vec()])).unwrap();
        append(&mut d, &[b"eight"]);
        let (_, records) = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        assert_eq!(records, vec![b"seven".to_vec(), b"eight".to_vec()]);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_periodic_fsync_comes_even_when_no_later_write_does() {
        let path = temp("periodic");
        let (d, _) = FileDisk::open(&path, FsyncPolicy::Every(Duration::from_millis(20))).unwrap();
        let (events_tx, events) = std::sync::mpsc::channel();
        let worker = DiskWorker::spawn("test-disk".into(), d, 4, move |e| {
            let _ = events_tx.send(e);
        })
        .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(worker.write(Write::Append(vec![b"one".to_vec()])))
            .unwrap();
        let next = || match events.recv_timeout(Duration::from_secs(5)) {
            Ok(DiskEvent::Durable { through, fsynced }) => (through, fsynced),
            Ok(DiskEvent::Failed(e)) => panic!("{e}"),
            Err(e) => panic!("no report: {e}"),
        };
        // Written, durable as the policy defines it, not yet fsynced...
        assert_eq!(next(), (1, false));
        // ... and fsynced by the worker's timer, with no other write coming.
        assert_eq!(next(), (1, true));
        rt.block_on(worker.close());
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }
}
