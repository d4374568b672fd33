//! The fuzzing harness every machine's decoder fuzzing uses: a heap that counts its peak (an
//! input must not make a decode or a step allocate without bound), one test at a time, how many
//! inputs and from which seed (`ATOMOS_FUZZ_INPUTS`, `ATOMOS_FUZZ_SEED`), a small generator, and
//! inputs made of raw, mutated or valid bytes (valid ones built by `arbitrary`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::Unstructured;
use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};

/// A heap that counts its live bytes and their peak since the last [`bounded`]. A fuzzing test
/// binary installs it: `#[global_allocator] static HEAP: CountingHeap = CountingHeap;`.
pub struct CountingHeap;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for CountingHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

/// Most bytes one input may add to the heap at its peak.
pub const MAX_GROWTH: usize = 64 << 20;

/// Runs `f` and fails if the heap grew by more than [`MAX_GROWTH`] at any moment. Fuzzing tests
/// run one at a time (see [`serial`]), so the count is theirs. Panics if the binary did not
/// install [`CountingHeap`] (nothing would be counted).
pub fn bounded<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Ordering::Relaxed);
    assert!(
        base > 0,
        "the test binary must install atomos_sim::fuzz::CountingHeap as its global allocator"
    );
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    let grew = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(grew <= MAX_GROWTH, "{what}: the heap grew by {grew} bytes");
    r
}

/// One test at a time, so the allocation counts are not mixed.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Inputs per target: `ATOMOS_FUZZ_INPUTS`, else 20,000.
pub fn inputs() -> u64 {
    std::env::var("ATOMOS_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

/// The first input's seed: `ATOMOS_FUZZ_SEED`, else 0.
pub fn first_seed() -> u64 {
    std::env::var("ATOMOS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A small deterministic generator: one seed, one sequence.
pub struct Rng(SplitMix64);

impl Rng {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }
    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// `valid` with a few random bytes flipped, inserted or cut.
pub fn mutate(rng: &mut Rng, mut valid: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(valid.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if at < valid.len() => valid[at] ^= 1 << rng.below(8),
            1 => valid.insert(at, rng.next_u64() as u8),
            2 => valid.truncate(at),
            _ if at < valid.len() => valid[at] = rng.next_u64() as u8,
            _ => {}
        }
    }
    valid
}

/// The input of one round: raw bytes, a mutated valid encoding, or a valid one.
pub fn input_bytes(
    rng: &mut Rng,
    valid: impl FnOnce(&mut Unstructured) -> Option<Vec<u8>>,
) -> Vec<u8> {
    let len = rng.below(600) as usize;
    let raw = rng.bytes(len);
    let mut u = Unstructured::new(&raw);
    match rng.below(3) {
        0 => raw.clone(),
        1 => valid(&mut u).map_or(raw.clone(), |v| mutate(rng, v)),
        _ => valid(&mut u).unwrap_or(raw.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_gives_one_input_and_mutations_stay_near_the_valid_bytes() {
        let make = |seed| input_bytes(&mut Rng::new(seed), |u| u.arbitrary::<Vec<u8>>().ok());
        assert_eq!(make(3), make(3));
        assert_ne!(
            (0..8).map(make).collect::<Vec<_>>(),
            (8..16).map(make).collect::<Vec<_>>()
        );
        let valid = vec![7u8; 100];
        let mut rng = Rng::new(1);
        for _ in 0..100 {
            let m = mutate(&mut rng, valid.clone());
            // At most four edits: one inserted byte each, or a cut.
            assert!(m.len() <= valid.len() + 4);
        }
    }

    #[test]
    fn counting_without_the_counting_heap_installed_is_refused() {
        // This test binary keeps the system allocator: nothing would be counted.
        let refused = std::panic::catch_unwind(|| bounded("x", || vec![0u8; 10]));
        assert!(refused.is_err());
    }
}
