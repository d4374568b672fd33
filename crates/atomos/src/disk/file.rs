//! The write-ahead log in a file: records framed and checksummed, read back at opening (a torn
//! tail cut, a damaged record before it refused), appended, synced, and replaced whole after a
//! compaction.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use atomos_seam::{wal, Bytes, Write};

use super::{DiskError, FsyncPolicy};

/// A write-ahead log in a file.
pub struct FileDisk {
    path: PathBuf,
    file: File,
    policy: FsyncPolicy,
    /// Written and not yet fsynced since then (under [`FsyncPolicy::Every`]).
    dirty_since: Option<Instant>,
    /// The log's format (`seam::wal`): appends frame records in it.
    format: u32,
    /// A compaction being written beside the log.
    compacting: Option<Box<Compacting>>,
}

impl Drop for FileDisk {
    /// A compaction or rewrite still being written is waited for and its file removed, as a
    /// crash would leave it: the log stays as the appends before a rewrite made it (the appends
    /// kept to follow a rewrite are dropped with it; nothing was told they are durable). A disk
    /// opened on the same log later never meets its thread.
    fn drop(&mut self) {
        if let Some(c) = self.compacting.take() {
            let _ = c.thread.join();
            let _ = fs::remove_file(&c.tmp);
        }
    }
}

/// A compaction, or a rewrite started with [`FileDisk::start_rewrite`], written beside the log
/// by a thread of its own.
struct Compacting {
    /// Writes and fsyncs the new log to `tmp`.
    thread: std::thread::JoinHandle<io::Result<()>>,
    tmp: PathBuf,
    /// The records appended since it began: they follow it in the new file.
    since: Vec<Bytes>,
    /// A rewrite: the appends since wait in `since` only (the log they would follow is being
    /// replaced). A compaction's also go to the log, which stays whole until it lands.
    rewrite: bool,
    /// When it began.
    started: Instant,
}

/// Appends `records`, framed in `format`, to `file`: through a buffer, so that small records
/// go out together and a large one (a snapshot's state) from where it lies, never copied.
fn append_records(file: &mut File, format: u32, records: &[Bytes]) -> io::Result<()> {
    let mut out = io::BufWriter::with_capacity(1 << 16, file);
    for r in records {
        out.write_all(&wal::frame_header(format, r))?;
        out.write_all(r)?;
    }
    out.flush()
}

/// Writes a whole log (this build's file header, then `records`) to a new file at `path`,
/// fsynced if `sync`.
pub(crate) fn write_log_file(path: &Path, records: &[Bytes], sync: bool) -> io::Result<()> {
    let mut file = File::create(path)?;
    let mut header = Vec::new();
    wal::file_header(&mut header);
    file.write_all(&header)?;
    append_records(&mut file, wal::FORMAT, records)?;
    if sync {
        file.sync_all()?;
    }
    Ok(())
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
        // A compaction or rewrite a crash interrupted never replaced the log: its file is
        // left over.
        let _ = fs::remove_file(path.with_extension("compact"));
        let _ = fs::remove_file(path.with_extension("rewrite"));
        let (records, format, good_len) = read(path, true)?;
        let mut disk = FileDisk {
            path: path.to_path_buf(),
            file,
            policy,
            dirty_since: None,
            format,
            compacting: None,
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
    fn check_sizes(&self, records: &[Bytes]) -> Result<(), DiskError> {
        match records.iter().find(|r| r.len() > wal::MAX_RECORD) {
            Some(big) => Err(self.io(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a record of {} bytes is too large for the log", big.len()),
            ))),
            None => Ok(()),
        }
    }

    /// Carries out a write (to the operating system; [`FileDisk::sync`] makes it durable). A
    /// compaction is written beside the log on a thread of its own while later appends go to
    /// the log (and are kept to follow it); it replaces the log at the first write or sync
    /// after it is written, or before the next compaction or rewrite. A rewrite is written
    /// before this returns (see [`FileDisk::start_rewrite`] for one that is not).
    pub fn write(&mut self, write: &Write) -> Result<(), DiskError> {
        match write {
            Write::Append(records) => {
                self.check_sizes(records)?;
                if let Some(c) = &mut self.compacting {
                    c.since.extend(records.iter().cloned());
                    if c.rewrite {
                        return self.land_compaction(false);
                    }
                }
                append_records(&mut self.file, self.format, records).map_err(|e| self.io(e))?;
                self.dirty_since.get_or_insert_with(Instant::now);
                self.land_compaction(false)
            }
            Write::Rewrite(records) => {
                self.land_compaction(true)?;
                self.rewrite(records)
            }
            Write::Compact(records) => self.start_replacing(records, false),
        }
    }

    /// Starts replacing the log by `records` on a thread of its own, as [`Write::Rewrite`]
    /// would, without waiting: appends made meanwhile are kept to follow it, not written,
    /// until it lands (at the first write, [`FileDisk::land_if_written`] or
    /// [`FileDisk::finish`] after it is written). Until then a crash leaves the log as it was
    /// before; [`FileDisk::rewriting`] says when it no longer would. Only for a log never
    /// fsynced ([`FsyncPolicy::Never`]), whose writer holds back what follows the rewrite
    /// until it lands: under any other policy the rewrite is written before this returns, as
    /// [`Write::Rewrite`] is, since a sync would otherwise count the kept appends durable.
    pub fn start_rewrite(&mut self, records: &[Bytes]) -> Result<(), DiskError> {
        if self.policy != FsyncPolicy::Never {
            return self.write(&Write::Rewrite(records.to_vec()));
        }
        self.start_replacing(records, true)
    }

    /// Whether a rewrite started with [`FileDisk::start_rewrite`] has yet to land.
    pub fn rewriting(&self) -> bool {
        self.compacting.as_ref().is_some_and(|c| c.rewrite)
    }

    /// Lands a compaction or rewrite whose file is written, if there is one.
    pub fn land_if_written(&mut self) -> Result<(), DiskError> {
        self.land_compaction(false)
    }

    /// Writes `records` as a new log beside this one on a background thread, once any
    /// compaction or rewrite under way has landed.
    fn start_replacing(&mut self, records: &[Bytes], rewrite: bool) -> Result<(), DiskError> {
        self.land_compaction(true)?;
        self.check_sizes(records)?;
        let tmp = self.path.with_extension("compact");
        let (to, records) = (tmp.clone(), records.to_vec());
        // Written back to the disk there whatever the policy: the rename that lands it would
        // otherwise start writing back the whole file on the caller's thread (ext4 flushes a
        // file renamed over another) and wait behind the disk.
        let write = move || write_log_file(&to, &records, true);
        // A compaction runs at the lower priority of bulk work; the writes after a rewrite
        // wait for it, so it runs at the caller's.
        let thread = if rewrite {
            std::thread::Builder::new()
                .name("wal-rewrite".into())
                .spawn(write)
        } else {
            crate::background::spawn("wal-compaction".into(), write)
        }
        .map_err(|e| self.io(e))?;
        self.compacting = Some(Box::new(Compacting {
            thread,
            tmp,
            since: Vec::new(),
            rewrite,
            started: Instant::now(),
        }));
        Ok(())
    }

    /// Puts a compaction whose file is written (or, with `wait`, any compaction, once written)
    /// in the log's place: the appends made since follow it in the new file, which is fsynced,
    /// renamed over the log and its directory fsynced.
    fn land_compaction(&mut self, wait: bool) -> Result<(), DiskError> {
        if !self
            .compacting
            .as_ref()
            .is_some_and(|c| wait || c.thread.is_finished())
        {
            return Ok(());
        }
        let Some(c) = self.compacting.take() else {
            return Ok(());
        };
        let at_tmp = |source| DiskError::Io {
            path: c.tmp.clone(),
            source,
        };
        c.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the compaction thread panicked")))
            .map_err(at_tmp)?;
        let mut file = OpenOptions::new()
            .append(true)
            .open(&c.tmp)
            .map_err(at_tmp)?;
        append_records(&mut file, wal::FORMAT, &c.since).map_err(at_tmp)?;
        if self.policy != FsyncPolicy::Never {
            file.sync_data().map_err(at_tmp)?;
        }
        self.replace_with(&c.tmp)?;
        tracing::info!(
            path = %self.path.display(),
            ms = c.started.elapsed().as_millis() as u64,
            appends_meanwhile = c.since.len(),
            "write-ahead log {}",
            if c.rewrite { "rewritten" } else { "compacted" }
        );
        Ok(())
    }

    /// Replaces the log: the new one is written beside it, fsynced, renamed over it, and the
    /// directory fsynced, so a crash leaves either the old log or the new one.
    fn rewrite(&mut self, records: &[Bytes]) -> Result<(), DiskError> {
        self.check_sizes(records)?;
        let tmp = self.path.with_extension("rewrite");
        write_log_file(&tmp, records, self.policy != FsyncPolicy::Never).map_err(|source| {
            DiskError::Io {
                path: tmp.clone(),
                source,
            }
        })?;
        self.replace_with(&tmp)
    }

    /// Renames the complete (and, unless fsyncs are off, fsynced) log file `tmp` over the log.
    /// The replaced log is closed on a background thread: closing the last handle of a file
    /// renamed over frees its blocks (and, where the disk is mounted with `discard`, discards
    /// them), which for a large log takes seconds.
    fn replace_with(&mut self, tmp: &Path) -> Result<(), DiskError> {
        fs::rename(tmp, &self.path).map_err(|e| self.io(e))?;
        if self.policy != FsyncPolicy::Never {
            sync_dir(parent_dir(&self.path)).map_err(|e| self.io(e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.io(e))?;
        close_later(std::mem::replace(&mut self.file, file));
        self.dirty_since = None;
        self.format = wal::FORMAT;
        Ok(())
    }

    /// Waits for a compaction under way and puts it in the log's place (a node that stops).
    pub fn finish(&mut self) -> Result<(), DiskError> {
        self.land_compaction(true)
    }

    /// Fsyncs what was written, if anything (timed: `atomos_wal_fsync_seconds`, labelled
    /// with the log's file name).
    pub fn sync(&mut self) -> Result<(), DiskError> {
        if self.dirty_since.is_some() {
            let started = Instant::now();
            self.file.sync_data().map_err(|e| self.io(e))?;
            let log = self
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            metrics::histogram!("atomos_wal_fsync_seconds", "log" => log)
                .record(started.elapsed().as_secs_f64());
            self.dirty_since = None;
        }
        self.land_compaction(false)
    }

    /// When an fsync is due under [`FsyncPolicy::Every`] (`None`: nothing waits for one).
    pub fn sync_due(&self) -> Option<Instant> {
        match self.policy {
            FsyncPolicy::Every(period) => self.dirty_since.map(|t| t + period),
            FsyncPolicy::EveryBatch | FsyncPolicy::Never => None,
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether everything written has been fsynced.
    pub fn synced(&self) -> bool {
        self.dirty_since.is_none()
    }

    /// The fsync policy.
    pub fn policy(&self) -> FsyncPolicy {
        self.policy
    }
}

/// Closes `file` on a background thread (here if no thread can be started).
fn close_later(file: File) {
    let _ = crate::background::spawn("wal-close".into(), move || drop(file));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("atomos-disk-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir.join("wal")
    }

    fn append(d: &mut FileDisk, records: &[&[u8]]) {
        d.write(&Write::Append(
            records.iter().map(|r| Bytes::copy_from_slice(r)).collect(),
        ))
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
        d.write(&Write::Rewrite(vec![Bytes::from_static(b"four")]))
            .unwrap();
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
        d.write(&Write::Rewrite(vec![Bytes::from_static(b"seven")]))
            .unwrap();
        append(&mut d, &[b"eight"]);
        let (_, records) = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        assert_eq!(records, vec![b"seven".to_vec(), b"eight".to_vec()]);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    /// A compaction is written in the background: until it lands the log is the one the
    /// appends made (what a crash then leaves), and once landed it is the compaction followed
    /// by every append made meanwhile.
    #[test]
    fn a_compaction_lands_with_the_appends_made_while_it_was_written() {
        let path = temp("compact");
        let (mut d, _) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        append(&mut d, &[b"one"]);
        d.write(&Write::Compact(vec![Bytes::from_static(b"all")]))
            .unwrap();
        append(&mut d, &[b"two"]);
        d.sync().unwrap();
        let meanwhile = read_log(&path, false).unwrap();
        let old = vec![b"one".to_vec(), b"two".to_vec()];
        let new = vec![b"all".to_vec(), b"two".to_vec()];
        assert!(meanwhile == old || meanwhile == new, "{meanwhile:?}");
        append(&mut d, &[b"three"]);
        d.finish().unwrap();
        let records = read_log(&path, false).unwrap();
        assert_eq!(
            records,
            vec![b"all".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
        // A second compaction waits for the first; a rewrite lands the one under way first.
        d.write(&Write::Compact(vec![Bytes::from_static(b"again")]))
            .unwrap();
        d.write(&Write::Compact(vec![Bytes::from_static(b"twice")]))
            .unwrap();
        append(&mut d, &[b"four"]);
        d.write(&Write::Rewrite(vec![Bytes::from_static(b"whole")]))
            .unwrap();
        append(&mut d, &[b"five"]);
        let records = read_log(&path, false).unwrap();
        assert_eq!(records, vec![b"whole".to_vec(), b"five".to_vec()]);
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    /// A rewrite started in the background leaves the log as it was until it lands (the
    /// appends made meanwhile are not written to the log it replaces), and then the log is the
    /// rewrite followed by those appends.
    #[test]
    fn a_rewrite_started_in_the_background_lands_with_the_appends_made_meanwhile() {
        let path = temp("background-rewrite");
        let (mut d, _) = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        append(&mut d, &[b"one", b"two"]);
        d.start_rewrite(&[Bytes::from_static(b"whole")]).unwrap();
        assert!(d.rewriting());
        let old = vec![b"one".to_vec(), b"two".to_vec()];
        assert_eq!(read_log(&path, false).unwrap(), old);
        d.write(&Write::Append(vec![Bytes::from_static(b"three")]))
            .unwrap();
        let meanwhile = read_log(&path, false).unwrap();
        let new = vec![b"whole".to_vec(), b"three".to_vec()];
        assert!(meanwhile == old || meanwhile == new, "{meanwhile:?}");
        assert_eq!(d.rewriting(), meanwhile == old);
        d.finish().unwrap();
        assert!(!d.rewriting());
        assert_eq!(read_log(&path, false).unwrap(), new);
        append(&mut d, &[b"four"]);
        let (_, records) = FileDisk::open(&path, FsyncPolicy::Never).unwrap();
        assert_eq!(records.last().unwrap(), b"four");
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }

    /// Under a policy that fsyncs, a rewrite asked to start in the background is written at
    /// once: a sync must never count appends that are only kept in memory as durable.
    #[test]
    fn a_rewrite_under_a_policy_that_fsyncs_is_written_at_once() {
        let path = temp("fsynced-rewrite");
        let (mut d, _) = FileDisk::open(&path, FsyncPolicy::EveryBatch).unwrap();
        append(&mut d, &[b"one"]);
        d.start_rewrite(&[Bytes::from_static(b"whole")]).unwrap();
        assert!(!d.rewriting());
        append(&mut d, &[b"two"]);
        assert_eq!(
            read_log(&path, false).unwrap(),
            vec![b"whole".to_vec(), b"two".to_vec()]
        );
        let _ = fs::remove_dir_all(path.parent().unwrap());
    }
}
