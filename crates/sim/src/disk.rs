//! A simulated disk that fails like real ones: writes are durable only once synced, a crash
//! loses the rest and may leave the first of them torn, and a record in the middle of the log
//! can be damaged. A compaction lands after the writes that follow it (at the next sync after
//! its own), as the file disk's background compaction may, and a crash before it lands loses
//! it: the log is then the one the other writes made. Records are framed and checksummed exactly as the file disk does it
//! ([`atomos_seam::wal`]), so a restarting machine meets the same errors it would meet in
//! production.

use std::collections::VecDeque;

use atomos_seam::{wal, Bytes, Write};

use crate::rng::SimRng;

/// One node's disk.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    /// What reached the platter.
    durable: Vec<u8>,
    /// Writes issued since the node started and not durable yet, with their numbers.
    pending: VecDeque<(u64, Write)>,
    /// Writes issued since the node started.
    issued: u64,
    /// A compaction synced but not landed yet, and the appends synced since (it lands with
    /// them after it).
    landing: Option<(Vec<Bytes>, Vec<Vec<Bytes>>)>,
}

/// `records` framed for a log that already holds `existing` bytes: a new log starts with the
/// file header.
fn framed(existing: usize, records: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::new();
    if existing == 0 {
        wal::file_header(&mut out);
    }
    for r in records {
        wal::frame(wal::FORMAT, r, &mut out);
    }
    out
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// The disk is lost (replaced by an empty one, as when an operator wipes a data
    /// directory): the node restarts with no log at all.
    pub fn wipe(&mut self) {
        self.durable.clear();
        self.pending.clear();
        self.landing = None;
    }

    /// The compaction under way replaces the log, with the appends made since after it.
    fn land(&mut self) {
        if let Some((compaction, since)) = self.landing.take() {
            self.durable = framed(0, &compaction);
            for records in since {
                let bytes = framed(self.durable.len(), &records);
                self.durable.extend(bytes);
            }
        }
    }

    /// The node issued a write; returns its number (from 1 since the node started).
    pub fn issue(&mut self, write: Write) -> u64 {
        self.issued += 1;
        self.pending.push_back((self.issued, write));
        self.issued
    }

    /// Writes up to number `through` reach the platter, in order (a rewrite replaces the log
    /// atomically, as a rename does).
    pub fn sync(&mut self, through: u64) {
        // A compaction synced before lands now, after the appends synced with it.
        self.land();
        while self.pending.front().is_some_and(|(n, _)| *n <= through) {
            let Some((_, write)) = self.pending.pop_front() else {
                break;
            };
            match write {
                Write::Append(records) => {
                    let bytes = framed(self.durable.len(), &records);
                    self.durable.extend(bytes);
                    if let Some((_, since)) = &mut self.landing {
                        since.push(records);
                    }
                }
                Write::Rewrite(records) => {
                    self.landing = None;
                    self.durable = framed(0, &records)
                }
                Write::Compact(records) => {
                    self.land();
                    self.landing = Some((records, Vec::new()));
                }
            }
        }
    }

    /// The node crashed: unsynced writes are lost, but the first one, if it appends, may leave
    /// a torn record behind when `rng` says so: a prefix of its bytes, or as many zeros (a file
    /// extended whose data never landed). Returns whether it did.
    pub fn crash(&mut self, torn: f64, rng: &mut SimRng) -> bool {
        let mut tore = false;
        if let Some((_, Write::Append(records))) = self.pending.front() {
            let bytes = framed(self.durable.len(), records);
            if bytes.len() > 1 && rng.chance(torn) {
                let keep = 1 + rng.below(bytes.len() as u64 - 1) as usize;
                if rng.chance(0.5) {
                    // Part of the write landed.
                    self.durable.extend_from_slice(&bytes[..keep]);
                } else {
                    // The file grew but the data never landed: zeros.
                    self.durable.resize(self.durable.len() + keep, 0);
                }
                tore = true;
            }
        }
        self.pending.clear();
        self.issued = 0;
        // A compaction not landed yet is lost.
        self.landing = None;
        tore
    }

    /// Damages one byte (of the header or the payload) of a durable record that is not the
    /// last: a last record damaged looks torn, and no log format can tell them apart. Returns
    /// false if there is no such record.
    pub fn corrupt(&mut self, rng: &mut SimRng) -> bool {
        let Ok(parsed) = wal::parse(&self.durable) else {
            return false; // damaged already
        };
        if parsed.records.len() < 2 {
            return false;
        }
        let victim = rng.below(parsed.records.len() as u64 - 1) as usize;
        let start = parsed.starts[victim];
        let len = wal::HEADER + parsed.records[victim].len();
        let at = start + rng.below(len as u64) as usize;
        self.durable[at] ^= 0x5a;
        true
    }

    /// What a restarting node reads: the durable records, with a torn final record cut from the
    /// disk, or where a damaged record sits before the tail (the node must refuse to start).
    pub fn load(&mut self) -> Result<Vec<Vec<u8>>, wal::Corrupt> {
        let parsed = wal::parse(&self.durable)?;
        self.durable.truncate(parsed.good_len);
        Ok(parsed.records)
    }

    /// The durable records as they stand (for checks after a run); stops at damage.
    pub fn records(&self) -> Vec<Vec<u8>> {
        match wal::parse(&self.durable) {
            Ok(p) => p.records,
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(d: &mut SimDisk, r: &[u8]) -> u64 {
        d.issue(Write::Append(vec![Bytes::copy_from_slice(r)]))
    }

    #[test]
    fn only_synced_writes_survive_a_crash() {
        let mut rng = SimRng::new(1);
        let mut d = SimDisk::new();
        let one = append(&mut d, b"one");
        append(&mut d, b"two");
        d.sync(one);
        d.crash(0.0, &mut rng);
        assert_eq!(d.load().unwrap(), vec![b"one".to_vec()]);
        // Numbering starts again with the next incarnation.
        assert_eq!(append(&mut d, b"three"), 1);
    }

    #[test]
    fn a_torn_write_is_cut_and_a_damaged_middle_is_refused() {
        let mut rng = SimRng::new(2);
        let mut d = SimDisk::new();
        let n = append(&mut d, b"one");
        d.sync(n);
        append(&mut d, b"two two two");
        assert!(d.crash(1.0, &mut rng));
        assert_eq!(d.load().unwrap(), vec![b"one".to_vec()]);
        for r in [b"a".as_slice(), b"bb", b"ccc"] {
            let n = append(&mut d, r);
            d.sync(n);
        }
        assert!(d.corrupt(&mut rng));
        assert!(d.load().is_err());
    }

    #[test]
    fn a_rewrite_replaces_the_log_when_synced() {
        let mut d = SimDisk::new();
        append(&mut d, b"one");
        let n = d.issue(Write::Rewrite(vec![Bytes::from_static(b"seven")]));
        d.sync(n);
        assert_eq!(d.records(), vec![b"seven".to_vec()]);
    }

    #[test]
    fn a_compaction_lands_after_the_appends_that_follow_it_or_is_lost() {
        let mut rng = SimRng::new(3);
        let mut d = SimDisk::new();
        append(&mut d, b"one");
        d.issue(Write::Compact(vec![Bytes::from_static(b"all")]));
        let n = append(&mut d, b"two");
        d.sync(n);
        // Synced, not landed: the log is the one the appends made.
        assert_eq!(d.records(), vec![b"one".to_vec(), b"two".to_vec()]);
        let mut crashed = d.clone();
        crashed.crash(0.0, &mut rng);
        assert_eq!(
            crashed.load().unwrap(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
        let n = append(&mut d, b"three");
        d.sync(n);
        assert_eq!(
            d.records(),
            vec![b"all".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
    }
}
