//! The thread a log is written and fsynced on, never the async workers that carry heartbeats
//! and connections: writes come through a bounded queue and are grouped under one fsync, and
//! the thread reports how far they are durable, or the error that stopped it.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use atomos_seam::Write;
use tokio::sync::mpsc;

use super::{DiskError, FileDisk, FsyncPolicy};

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
        let path = disk.path().to_path_buf();
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
                path: disk.path().to_path_buf(),
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
                // The machine stopped: make what was written durable, and a compaction under
                // way the log, before going.
                let _ = disk.sync().and_then(|()| disk.finish());
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
                    fsynced: disk.synced(),
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
    use std::fs;
    use std::path::PathBuf;
    use std::time::Duration;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("atomos-disk-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir.join("wal")
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
        rt.block_on(worker.write(Write::Append(vec![atomos_seam::Bytes::from_static(b"one")])))
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
