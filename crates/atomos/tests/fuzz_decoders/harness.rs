//! The fuzzing harness: a heap that counts its peak, one test at a time, how many inputs and
//! from which seed, a small generator, and inputs made of raw, mutated or valid bytes.

use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::Unstructured;

/// Counts live heap bytes and the peak since the last reset.
pub(crate) struct Counting;

pub(crate) static LIVE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
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

#[global_allocator]
pub(crate) static ALLOCATOR: Counting = Counting;

/// Most bytes one input may add to the heap at its peak.
pub(crate) const MAX_GROWTH: usize = 64 << 20;

/// Runs `f` and fails if the heap grew by more than `MAX_GROWTH` at any moment. The tests in
/// this file run one at a time (see `serial`), so the count is theirs.
pub(crate) fn bounded<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    let grew = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(grew <= MAX_GROWTH, "{what}: the heap grew by {grew} bytes");
    r
}

/// One test at a time, so the allocation counts are not mixed.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn inputs() -> u64 {
    std::env::var("ATOMOS_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

pub(crate) fn first_seed() -> u64 {
    std::env::var("ATOMOS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A small deterministic generator.
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// `valid` with a few random bytes flipped, inserted or cut.
pub(crate) fn mutate(rng: &mut Rng, mut valid: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(valid.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if at < valid.len() => valid[at] ^= 1 << rng.below(8),
            1 => valid.insert(at, rng.next() as u8),
            2 => valid.truncate(at),
            _ if at < valid.len() => valid[at] = rng.next() as u8,
            _ => {}
        }
    }
    valid
}

/// The input of one round: raw bytes, a mutated valid encoding, or a valid one.
pub(crate) fn input_bytes(
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
