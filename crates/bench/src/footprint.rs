//! Memory footprint: resident memory of a node holding many small objects.

use std::time::Instant;

use atomos::{Key, Node, TRef, TxError};
use serde::Serialize;

/// What the footprint run measured.
#[derive(Clone, Debug, Serialize)]
pub struct FootprintReport {
    /// Objects created.
    pub objects: usize,
    /// Size of each value in bytes.
    pub value_bytes: usize,
    /// Resident memory before creating them, in MiB.
    pub rss_before_mb: f64,
    /// Resident memory after, in MiB.
    pub rss_after_mb: f64,
    /// Growth per object in bytes.
    pub bytes_per_object: f64,
    /// Seconds spent creating them.
    pub create_s: f64,
    /// Whether every object read back with its value.
    pub invariant_ok: bool,
}

/// Resident set size of this process in bytes (Linux `/proc/self/statm`), if known.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Creates `objects` objects holding a 16-byte value each, in transactions of 1,000, and
/// measures resident memory before and after.
pub fn run(objects: usize) -> Result<FootprintReport, TxError> {
    let node = Node::local();
    let before = resident_bytes().unwrap_or(0);
    let start = Instant::now();
    for chunk_start in (0..objects).step_by(1000) {
        let end = (chunk_start + 1000).min(objects);
        node.atomically(|tx| {
            for i in chunk_start..end {
                let r: TRef<[u64; 2]> = TRef::new(Key::from(i as u64));
                tx.create(&r, [i as u64, !(i as u64)])?;
            }
            Ok(())
        })?;
    }
    let create_s = start.elapsed().as_secs_f64();
    let after = resident_bytes().unwrap_or(0);
    let ok = node.atomically_read(|tx| {
        for i in (0..objects).step_by(997) {
            let r: TRef<[u64; 2]> = TRef::new(Key::from(i as u64));
            if *tx.read(&r)? != [i as u64, !(i as u64)] {
                return Ok(false);
            }
        }
        Ok(true)
    })?;
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    Ok(FootprintReport {
        objects,
        value_bytes: 16,
        rss_before_mb: mb(before),
        rss_after_mb: mb(after),
        bytes_per_object: after.saturating_sub(before) as f64 / objects.max(1) as f64,
        create_s,
        invariant_ok: ok,
    })
}
