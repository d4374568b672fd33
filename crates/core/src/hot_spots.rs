//! Conflict monitoring (OSS's monitoring facility): how often each object was the reason a
//! transaction aborted, under every protocol, so that a programmer finds the hot spots of an
//! application. Counted on abort paths only (a conflict costs a re-run anyway).

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::engine::Engine;
use crate::key::Key;

/// The most objects counted at once: past it, the half with the fewest conflicts is dropped
/// (hot spots stay; a scan over many objects does not grow the table without bound).
const MAX_KEYS: usize = 4_096;

/// Conflicts per object.
#[derive(Debug, Default)]
pub(crate) struct HotSpots {
    counts: Mutex<FxHashMap<Key, u64>>,
}

impl HotSpots {
    pub(crate) fn note(&self, key: Key) {
        let mut counts = self.counts.lock();
        *counts.entry(key).or_default() += 1;
        if counts.len() > MAX_KEYS {
            let mut values: Vec<u64> = counts.values().copied().collect();
            let (_, median, _) = values.select_nth_unstable(MAX_KEYS / 2);
            let median = *median;
            counts.retain(|_, c| *c > median);
        }
    }

    fn top(&self, n: usize) -> Vec<(Key, u64)> {
        let mut all: Vec<(Key, u64)> = self
            .counts
            .lock()
            .iter()
            .map(|(k, c)| (k.clone(), *c))
            .collect();
        all.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }
}

impl Engine {
    /// Counts a conflict on `key` (the engine counts the ones it detects; a protocol that
    /// learns of others, such as a remote refusal naming a key, tells it here).
    pub fn note_conflict(&self, key: &Key) {
        self.hot_spots.note(key.clone());
    }

    /// The `n` objects that caused the most conflicts since the engine started, most first,
    /// with their counts. Objects are named when the engine keeps keys (replicated engines,
    /// or [`EngineConfig::monitor_conflicts`](crate::EngineConfig::monitor_conflicts)).
    pub fn hot_spots(&self, n: usize) -> Vec<(Key, u64)> {
        self.hot_spots.top(n)
    }

    /// Counts the conflict of an attempt: on `culprit` if known, else on the objects it read
    /// that changed since.
    pub(crate) fn note_conflict_of(
        &self,
        culprit: Option<*const crate::cell::Cell>,
        reads: &[crate::tx::ReadEntry],
    ) {
        let cells: Vec<*const crate::cell::Cell> = match culprit {
            Some(c) => vec![c],
            None => reads
                .iter()
                .filter(|r| !r.is_current())
                .map(|r| r.cell)
                .take(2)
                .collect(),
        };
        for cell in cells {
            if let Some(key) = self.store.name_of(cell) {
                self.hot_spots.note(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hottest_keys_come_first_and_the_table_stays_bounded() {
        let h = HotSpots::default();
        for _ in 0..5 {
            h.note(Key::from("hot"));
        }
        h.note(Key::from("warm"));
        h.note(Key::from("warm"));
        for i in 0..(MAX_KEYS as u64 + 10) {
            h.note(Key::with_index("cold/", i));
        }
        let top = h.top(2);
        assert_eq!(top, vec![(Key::from("hot"), 5), (Key::from("warm"), 2)]);
        assert!(h.counts.lock().len() <= MAX_KEYS);
    }
}
