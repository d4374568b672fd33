//! What a Raft entry carries here: the id of the batch it orders (its data) and its proposer's
//! clock reading (its context); and where a start of a replica numbers its batches from.

use raft::eraftpb::{Entry, EntryType};

use atomos_seam::stable::{mix64, GOLDEN};

use crate::types::BatchId;

/// Where a start of a replica numbers its batches from: 2^32 times a number from 1 to 2^32 - 1
/// drawn from `seed`, so two starts with different seeds collide with probability 2^-32.
pub(super) fn fresh_batch_base(seed: u64) -> u64 {
    // Mixed: nearby seeds give unrelated bases.
    let z = mix64(seed.wrapping_add(GOLDEN));
    ((z & 0xFFFF_FFFF).max(1)) << 32
}

/// An entry's data: the batch it orders.
pub(super) fn encode_batch(id: BatchId) -> Vec<u8> {
    postcard::to_stdvec(&id).unwrap_or_default()
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
    postcard::from_bytes(&e.data).ok()
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
            data: encode_batch(id),
            context: encode_stamp(1_700_000_000_123),
            ..Entry::default()
        };
        assert_eq!(entry_batch(&e), Some(id));
        assert_eq!(entry_stamp(&e), 1_700_000_000_123);
        assert_eq!(entry_batch(&Entry::default()), None);
        assert_eq!(entry_stamp(&Entry::default()), 0);
    }

    #[test]
    fn batch_bases_of_two_starts_differ_and_leave_room_below_them() {
        let (a, b) = (fresh_batch_base(1), fresh_batch_base(2));
        assert_ne!(a, b);
        assert!(a >= 1 << 32 && a.trailing_zeros() >= 32);
    }
}
