//! What a Raft entry carries here: the id of the batch it orders (its data) and its proposer's
//! clock reading (its context); and where a start of a replica numbers its batches from.

use raft::eraftpb::{Entry, EntryType};

use atomos_seam::stable::{mix64, GOLDEN};

use crate::types::{BatchId, Request};

/// Where a start of a replica numbers its batches from: 2^32 times a number from 1 to 2^32 - 1
/// drawn from `seed`, so two starts with different seeds collide with probability 2^-32.
pub(super) fn fresh_batch_base(seed: u64) -> u64 {
    // Mixed: nearby seeds give unrelated bases.
    let z = mix64(seed.wrapping_add(GOLDEN));
    ((z & 0xFFFF_FFFF).max(1)) << 32
}

/// An entry's data: the batch it orders, and when the batch lapses (see [`lapses_at`]).
pub(super) fn encode_batch(id: BatchId, lapses_at: u64) -> Vec<u8> {
    postcard::to_stdvec(&(id, lapses_at)).unwrap_or_default()
}

/// When a batch of `requests` lapses: the latest of their deadlines. An entry whose log time
/// is past it orders nothing (every request in it expired there), on every replica alike and
/// without the batch's contents, so a replica may forget the batch once its final log time is
/// past it.
pub(super) fn lapses_at(requests: &[Request]) -> u64 {
    requests.iter().map(|r| r.deadline_ms).max().unwrap_or(0)
}

/// When the batch a normal entry orders lapses (`None`: an entry written before entries said,
/// whose batch never lapses).
pub(super) fn entry_lapse(e: &Entry) -> Option<u64> {
    if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
        return None;
    }
    let (_, rest) = postcard::take_from_bytes::<BatchId>(&e.data).ok()?;
    if rest.is_empty() {
        return None;
    }
    postcard::from_bytes(rest).ok()
}

/// An entry's context: its proposer's clock reading.
pub(super) fn encode_stamp(now_ms: u64) -> Vec<u8> {
    postcard::to_stdvec(&now_ms).unwrap_or_default()
}

/// The clock reading an entry carries (0 for none: a leader's empty entry, a configuration
/// change, whose context is the new member's, or an entry written before entries were
/// stamped).
pub(super) fn entry_stamp(e: &Entry) -> u64 {
    if e.context.is_empty() || e.get_entry_type() != EntryType::EntryNormal {
        return 0;
    }
    postcard::from_bytes(&e.context).unwrap_or(0)
}

/// The batch a normal entry orders (none for an empty or a configuration entry).
pub(super) fn entry_batch(e: &Entry) -> Option<BatchId> {
    if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
        return None;
    }
    postcard::take_from_bytes(&e.data).ok().map(|(id, _)| id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_gives_back_the_batch_and_the_stamp_it_was_proposed_with() {
        let id = BatchId {
            origin: 2,
            n: 7 << 32,
        };
        let e = Entry {
            data: encode_batch(id, 1_700_000_009_000),
            context: encode_stamp(1_700_000_000_123),
            ..Entry::default()
        };
        assert_eq!(entry_batch(&e), Some(id));
        assert_eq!(entry_lapse(&e), Some(1_700_000_009_000));
        assert_eq!(entry_stamp(&e), 1_700_000_000_123);
        assert_eq!(entry_batch(&Entry::default()), None);
        assert_eq!(entry_lapse(&Entry::default()), None);
        assert_eq!(entry_stamp(&Entry::default()), 0);
        // An entry written before entries carried the lapse: its batch, and no lapse.
        let old = Entry {
            data: postcard::to_stdvec(&id).unwrap(),
            ..Entry::default()
        };
        assert_eq!(entry_batch(&old), Some(id));
        assert_eq!(entry_lapse(&old), None);
    }

    #[test]
    fn batch_bases_of_two_starts_differ_and_leave_room_below_them() {
        let (a, b) = (fresh_batch_base(1), fresh_batch_base(2));
        assert_ne!(a, b);
        assert!(a >= 1 << 32 && a.trailing_zeros() >= 32);
    }
}
