//! Backups as a member serves them: a barrier ordered through the node's replica (so that
//! everything acknowledged anywhere before the request is in it), a snapshot taken where the
//! replica delivered it, and the backup kept for the client to fetch by chunks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_protocols::replicated::{Answer, Entry};
use parking_lot::Mutex;

use crate::backup::Backup;
use crate::ordering::{Snapshotter, Submitter};
use crate::wire::{BackupOffer, Refusal};

/// How long a backup nobody fetched from is kept.
const KEPT_IDLE: Duration = Duration::from_secs(120);

/// How many backups a member keeps at once (each holds a reference to a snapshot's state).
const KEPT_MAX: usize = 2;

/// The most bytes a member sends in one chunk.
pub(crate) const CHUNK_MAX: u32 = 256 << 10;

/// What a member takes backups through: its replica's submissions (for the barrier) and
/// snapshots.
#[derive(Clone)]
pub(crate) struct BackupSource {
    pub(crate) submitter: Submitter,
    pub(crate) snapshotter: Snapshotter,
}

/// The backups a member keeps for clients to fetch, by number.
#[derive(Default)]
pub(crate) struct KeptBackups {
    kept: Mutex<Kept>,
    /// A backup is being taken (one at a time: each orders a barrier and a snapshot of the
    /// whole state).
    taking: std::sync::atomic::AtomicBool,
}

/// The last number given, and each backup kept with when it was last fetched from.
#[derive(Default)]
struct Kept {
    last: u64,
    by_id: BTreeMap<u64, (Arc<Backup>, Instant)>,
}

impl Kept {
    /// Drops the backups nobody fetched from for [`KEPT_IDLE`].
    fn drop_idle(&mut self, now: Instant) {
        self.by_id
            .retain(|_, (_, used)| now.duration_since(*used) < KEPT_IDLE);
    }
}

impl KeptBackups {
    /// Keeps `backup` (dropping those idle too long, and the oldest beyond [`KEPT_MAX`]) and
    /// returns its number.
    fn keep(&self, backup: Backup) -> u64 {
        let mut kept = self.kept.lock();
        kept.last += 1;
        let id = kept.last;
        let now = Instant::now();
        kept.drop_idle(now);
        while kept.by_id.len() >= KEPT_MAX {
            kept.by_id.pop_first();
        }
        kept.by_id.insert(id, (Arc::new(backup), now));
        id
    }

    /// Up to `len` bytes of backup `id` from `offset` (at most [`CHUNK_MAX`]).
    pub(crate) fn chunk(&self, id: u64, offset: u64, len: u32) -> Result<Vec<u8>, Refusal> {
        let backup = {
            let mut kept = self.kept.lock();
            kept.drop_idle(Instant::now());
            let Some((backup, used)) = kept.by_id.get_mut(&id) else {
                return Err(Refusal::Refused(format!(
                    "no backup {id} is kept here (it was dropped after {KEPT_IDLE:?} unused, \
                     or this member restarted): begin again"
                )));
            };
            *used = Instant::now();
            backup.clone()
        };
        if offset > backup.len() {
            return Err(Refusal::Refused(format!(
                "offset {offset} is past the backup's {} bytes",
                backup.len()
            )));
        }
        Ok(backup.chunk(offset, len.min(CHUNK_MAX) as usize))
    }

    /// Takes a backup through `source` for a `protocol` cluster on member `me`, waiting up to
    /// `limit` for the barrier and for the snapshot, and keeps it.
    pub(crate) async fn take(
        &self,
        source: BackupSource,
        protocol: String,
        me: u64,
        limit: Duration,
    ) -> Result<BackupOffer, Refusal> {
        use std::sync::atomic::Ordering;
        if self.taking.swap(true, Ordering::AcqRel) {
            return Err(Refusal::Busy(
                "this member is taking another backup: try again shortly".into(),
            ));
        }
        let taken = self.take_one(source, protocol, me, limit).await;
        self.taking.store(false, Ordering::Release);
        taken
    }

    async fn take_one(
        &self,
        source: BackupSource,
        protocol: String,
        me: u64,
        limit: Duration,
    ) -> Result<BackupOffer, Refusal> {
        let submitter = source.submitter.clone();
        let mark =
            tokio::task::spawn_blocking(move || submitter.submit_wait(Entry::Mark.encode(), limit))
                .await
                .map_err(|e| Refusal::Refused(format!("the barrier's thread failed: {e}")))?
                .map_err(|e| Refusal::Refused(format!("the barrier was not ordered: {e}")))?;
        // The order log's position the barrier was delivered at (on whichever replica
        // answered: every replica orders it there).
        let position = match Answer::decode(&mark) {
            Ok(Answer::Marked { seq, .. }) if seq > 0 => seq,
            Ok(other) => {
                return Err(Refusal::Refused(format!(
                    "the barrier was answered with {other:?}"
                )))
            }
            Err(e) => return Err(Refusal::Refused(format!("the barrier's answer: {e}"))),
        };
        let copy = tokio::time::timeout(limit, source.snapshotter.covering(position))
            .await
            .map_err(|_| {
                Refusal::Unknown(format!(
                    "no snapshot covering position {position} within {limit:?}"
                ))
            })?
            .ok_or_else(|| Refusal::Refused("the order replica stopped".into()))?;
        let taken_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let backup = Backup::of(&protocol, me, taken_ms, copy);
        let (header, total) = (backup.header.clone(), backup.len());
        let id = self.keep(backup);
        Ok(BackupOffer { id, header, total })
    }
}
