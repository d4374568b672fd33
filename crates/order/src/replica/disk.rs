//! What of a replica's log is on its disk: the records queued for the next write, the writes
//! emitted and not yet confirmed, and the last log index known durable. A replica applies
//! nothing past that index, so what its readers see is on a majority's disks.

use std::collections::VecDeque;

use atomos_seam::{Bytes, Write};

use crate::record::Record;

/// One replica's account of its disk writes.
#[derive(Debug)]
pub(super) struct Disk {
    /// Records queued since the last write was emitted.
    unflushed: Vec<Bytes>,
    /// Writes emitted so far (numbered from 1, as `Input::Persisted` counts them).
    writes: u64,
    /// Emitted writes not known durable yet, each with the last log index it makes durable.
    unsynced: VecDeque<(u64, u64)>,
    /// The last log index durable on this disk (the commit index counts this replica as
    /// holding what it has only queued for writing; this does not).
    durable_index: u64,
}

impl Disk {
    /// A disk whose log is durable through `durable_index` (what it held at start), with
    /// `queued` waiting for the first write.
    pub(super) fn new(durable_index: u64, queued: Vec<Record>) -> Disk {
        Disk {
            unflushed: queued.iter().map(|r| r.encode().into()).collect(),
            writes: 0,
            unsynced: VecDeque::new(),
            durable_index,
        }
    }

    /// The last log index durable on this disk.
    pub(super) fn durable_index(&self) -> u64 {
        self.durable_index
    }

    /// Queues a record for the next write.
    pub(super) fn queue(&mut self, record: &Record) {
        self.unflushed.push(record.encode().into());
    }

    /// Drops the records queued for the next write (a rewrite that holds what they say
    /// replaces them).
    pub(super) fn discard_queued(&mut self) {
        self.unflushed.clear();
    }

    /// The queued records as one append, if any; `last` is the log's last index, which the
    /// write makes durable (every entry in the log was queued in it or in an earlier write).
    pub(super) fn flush(&mut self, last: u64) -> Option<Write> {
        if self.unflushed.is_empty() {
            return None;
        }
        let write = Write::Append(std::mem::take(&mut self.unflushed));
        self.emitted(last);
        Some(write)
    }

    /// A write was emitted (numbered next) that makes the log durable through `last`.
    pub(super) fn emitted(&mut self, last: u64) {
        self.writes += 1;
        self.unsynced.push_back((self.writes, last));
    }

    /// The log after `index` was replaced: no write made so far holds its entries.
    pub(super) fn clamp(&mut self, index: u64) {
        self.durable_index = self.durable_index.min(index);
        for (_, last) in &mut self.unsynced {
            *last = (*last).min(index);
        }
    }

    /// The writes up to number `through` are durable.
    pub(super) fn persisted(&mut self, through: u64) {
        while let Some(&(write, last)) = self.unsynced.front() {
            if write > through {
                break;
            }
            self.unsynced.pop_front();
            self.durable_index = self.durable_index.max(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_is_durable_once_the_write_that_holds_it_is_confirmed_and_not_after_a_cut() {
        let mut disk = Disk::new(3, vec![Record::Rejoining]);
        assert!(
            matches!(disk.flush(5), Some(Write::Append(r)) if r == vec![Bytes::from(Record::Rejoining.encode())])
        );
        assert_eq!(disk.flush(5), None, "nothing queued: no write");
        disk.queue(&Record::Rejoined);
        assert!(disk.flush(9).is_some());
        assert_eq!(disk.durable_index(), 3);
        disk.persisted(1);
        assert_eq!(disk.durable_index(), 5);
        // The log from 7 on is replaced before write 2 is confirmed: it holds only up to 6.
        disk.clamp(6);
        disk.persisted(2);
        assert_eq!(disk.durable_index(), 6);
        // A confirmation never takes the index back.
        disk.emitted(4);
        disk.persisted(3);
        assert_eq!(disk.durable_index(), 6);
    }
}
