//! What a long order benchmark samples to show that the cluster's footprint stops growing:
//! the process's resident memory, the write-ahead logs on disk, the replicas' latest snapshot
//! and their bookkeeping (client sessions, delivered batches), over time
//! (`atomos bench order --sample-every S`; `scripts/soak.sh` runs it with short-lived clients).

use serde::{Deserialize, Serialize};

/// One sample of a long run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SoakSample {
    /// Seconds since the measurement began.
    pub at_s: f64,
    /// Requests answered since the measurement began (summed over replicas).
    pub ordered: u64,
    /// Resident memory of this process (every replica runs in it), bytes.
    pub rss_bytes: u64,
    /// The write-ahead logs' sizes on disk, summed over replicas, bytes.
    pub wal_bytes: u64,
    /// The largest latest-snapshot state among the replicas, bytes.
    pub snapshot_bytes: u64,
    /// The most client sessions a replica held.
    pub sessions: u64,
    /// The most delivered batches a replica remembered.
    pub batches: u64,
}

/// This process's resident memory in bytes (Linux: `/proc/self/statm`; 0 elsewhere).
pub fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * 4096
}

/// How one quantity moved after warm-up: its largest value in the second quarter of the
/// samples and in the last half (a flat quantity's last half stays within a tenth of it, or
/// of a small floor for quantities near zero).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Trend {
    /// The largest value in the second quarter.
    pub early: u64,
    /// The largest value in the last half.
    pub late: u64,
    /// Whether `late` stays within 10% of `early` (plus `floor`).
    pub flat: bool,
}

/// The trend of `value` over `samples` (at least 4), or `None` with fewer.
pub fn trend(
    samples: &[SoakSample],
    value: impl Fn(&SoakSample) -> u64,
    floor: u64,
) -> Option<Trend> {
    let n = samples.len();
    if n < 4 {
        return None;
    }
    let early = samples[n / 4..n / 2].iter().map(&value).max()?;
    let late = samples[n / 2..].iter().map(&value).max()?;
    Some(Trend {
        early,
        late,
        flat: late <= early + early / 10 + floor,
    })
}

/// A sampled quantity: its name and unit in reports, how to read it, and its floor.
type Quantity = (&'static str, fn(&SoakSample) -> u64, u64, u64);

/// One line on the samples: each quantity's trend after warm-up.
pub fn summary(samples: &[SoakSample]) -> String {
    let parts: [Quantity; 5] = [
        ("resident memory MiB", |s| s.rss_bytes, 16 << 20, 1 << 20),
        ("logs MiB", |s| s.wal_bytes, 4 << 20, 1 << 20),
        ("snapshot KiB", |s| s.snapshot_bytes, 64 << 10, 1 << 10),
        ("sessions", |s| s.sessions, 64, 1),
        ("batches remembered", |s| s.batches, 1_024, 1),
    ];
    let mut out = Vec::new();
    for (name, value, floor, unit) in parts {
        if let Some(t) = trend(samples, value, floor) {
            out.push(format!(
                "{name} {} then {} ({})",
                t.early / unit,
                t.late / unit,
                if t.flat { "flat" } else { "GROWS" }
            ));
        }
    }
    if out.is_empty() {
        return "fewer than 4 samples".into();
    }
    format!(
        "after warm-up (second quarter, then last half, at most): {}",
        out.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(values: &[u64]) -> Vec<SoakSample> {
        values
            .iter()
            .map(|&v| SoakSample {
                sessions: v,
                ..SoakSample::default()
            })
            .collect()
    }

    #[test]
    fn a_quantity_that_keeps_growing_is_not_flat_and_one_that_levels_off_is() {
        let grows = samples(&[1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000]);
        assert!(!trend(&grows, |s| s.sessions, 64).unwrap().flat);
        let levels = samples(&[100, 900, 1_000, 1_010, 990, 1_020, 1_000, 1_005]);
        assert!(trend(&levels, |s| s.sessions, 64).unwrap().flat);
        assert_eq!(trend(&levels[..3], |s| s.sessions, 64), None);
    }
}
