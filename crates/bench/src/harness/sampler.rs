//! Which operations of a closed-loop worker are timed for the latency figures.
//!
//! Reading the clock twice costs about 50 ns on a virtual machine, a tenth of a fast
//! transaction's time if every one were timed. A worker times every operation at first. It
//! measures how long operations take over a window after the first [`CALIBRATE_OPS`] (which
//! are slower: caches and allocators warm up), then times one in a power-of-two stride chosen
//! so that timed operations stay at most [`SAMPLE_SPACING`] apart. The stride is fixed from
//! then on, so which operations are timed never depends on how long the timed ones took. A
//! timed operation is recorded as [`Sampler::stride`] operations: each operation of a run weighs
//! the same in the percentiles, whatever its worker's stride and whether it ran before the
//! stride was fixed.

use std::time::{Duration, Instant};

/// Operations a worker runs before it starts measuring, and then measures over, timing each,
/// before it fixes its stride.
const CALIBRATE_OPS: u64 = 4096;
/// The longest a worker lets pass, on average, between two timed operations.
const SAMPLE_SPACING: Duration = Duration::from_micros(5);
/// The widest stride (one operation in this many).
const MAX_STRIDE: u64 = 1024;

/// One worker's choice of operations to time.
pub(crate) struct Sampler {
    /// A power of two: operation `n` is timed when `n` is a multiple of it.
    stride: u64,
    /// When the measuring window opened (`None`: not yet).
    window: Option<Instant>,
    calibrated: bool,
}

impl Sampler {
    /// A sampler that times every operation until it calibrates.
    pub(crate) fn new() -> Sampler {
        Sampler {
            stride: 1,
            window: None,
            calibrated: false,
        }
    }

    /// Whether operation number `op` (counted from 0) is to be timed.
    #[inline]
    pub(crate) fn times(&self, op: u64) -> bool {
        op & (self.stride - 1) == 0
    }

    /// How many operations a timed one stands for: the stride it was taken at.
    #[inline]
    pub(crate) fn stride(&self) -> u64 {
        self.stride
    }

    /// Notes that `ops` operations are done; fixes the stride once enough were.
    #[inline]
    pub(crate) fn done(&mut self, ops: u64) {
        if !self.calibrated && ops.is_multiple_of(CALIBRATE_OPS) {
            self.calibrate(ops);
        }
    }

    #[cold]
    fn calibrate(&mut self, ops: u64) {
        match self.window {
            None if ops == CALIBRATE_OPS => self.window = Some(Instant::now()),
            Some(opened) if ops == 2 * CALIBRATE_OPS => {
                self.calibrated = true;
                self.stride = stride_for(opened.elapsed() / CALIBRATE_OPS as u32);
            }
            _ => {}
        }
    }
}

/// The widest power-of-two stride at which operations taking `per_op` each are timed at most
/// [`SAMPLE_SPACING`] apart (1 for operations that take that long themselves).
fn stride_for(per_op: Duration) -> u64 {
    let fit = SAMPLE_SPACING.as_nanos() / per_op.as_nanos().max(1);
    let fit = u64::try_from(fit).unwrap_or(u64::MAX).clamp(1, MAX_STRIDE);
    // The largest power of two not above `fit`.
    1 << fit.ilog2()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_keep_timed_operations_within_the_spacing() {
        // A 75 ns transaction: 66 fit in 5 us, so one in 64 is timed.
        assert_eq!(stride_for(Duration::from_nanos(75)), 64);
        assert_eq!(stride_for(Duration::from_nanos(2_500)), 2);
        // Operations as long as the spacing, or longer, are all timed.
        assert_eq!(stride_for(SAMPLE_SPACING), 1);
        assert_eq!(stride_for(Duration::from_millis(1)), 1);
        // Implausibly fast ones stop at the widest stride.
        assert_eq!(stride_for(Duration::ZERO), MAX_STRIDE);
    }

    #[test]
    fn every_operation_is_timed_until_calibration() {
        let mut s = Sampler::new();
        for op in 0..2 * CALIBRATE_OPS {
            assert!(s.times(op));
            s.done(op + 1);
        }
        assert!(s.calibrated);
        assert!(s.stride.is_power_of_two() && s.stride <= MAX_STRIDE);
        assert!(s.times(0) && s.times(s.stride));
        assert_eq!(s.times(1), s.stride == 1);
    }
}
