//! The simulator's random generator: SplitMix64, fixed here so a seed means the same run in
//! every build.

use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};

/// A seeded generator (SplitMix64). Not for anything that needs unpredictability.
#[derive(Clone, Debug)]
pub struct SimRng(SplitMix64);

impl SimRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(SplitMix64::seed_from_u64(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A value in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        p > 0.0 && unit < p
    }
}
