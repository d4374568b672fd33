//! Word count, OSS's MapReduce example (section VI-B): every worker counts the words of its
//! part of a text into a tree of counters of its own (a root with the worker's total, a leaf
//! per word), one line per transaction; at the end a master merges every worker's tree and
//! the merge is checked against a plain count of the same lines. Workers share nothing, so
//! conflicts are rare, but every commit goes through the protocol.

use std::sync::atomic::{AtomicU64, Ordering};

use atomos::{Key, Node, TRef, TxError};
use rand::rngs::SmallRng;
use rand::Rng;
use std::sync::Mutex;

use super::{Check, Workload, WorkloadParams};

/// Words per line (one transaction).
const LINE: usize = 12;

/// The word-count workload. Invariant: the merged trees equal a plain count of the lines
/// whose transactions committed.
pub struct WordCount {
    /// Distinct words in the text (`--objects`).
    vocabulary: usize,
    workers: usize,
    /// Per worker, a plain count of the words of its committed lines, by word.
    plain: Vec<Mutex<Vec<u64>>>,
    lines: AtomicU64,
}

/// Worker `w`'s counter of word `word`.
fn leaf(w: usize, word: usize) -> TRef<u64> {
    TRef::new(Key::with_index(&format!("wc/{w}/"), word as u64))
}

/// Worker `w`'s total of words counted.
fn root(w: usize) -> TRef<u64> {
    TRef::new(Key::from(format!("wc/{w}/total").as_str()))
}

impl WordCount {
    /// A text of `p.objects` distinct words, counted by `p.threads` workers.
    pub fn new(p: &WorkloadParams) -> WordCount {
        let workers = p.threads.max(1);
        let vocabulary = p.objects.max(2);
        WordCount {
            vocabulary,
            workers,
            plain: (0..workers)
                .map(|_| Mutex::new(vec![0; vocabulary]))
                .collect(),
            lines: AtomicU64::new(0),
        }
    }

    /// The next line of a worker's part of the text: words drawn with a skew toward the
    /// first ones (as in natural text: a few words are most of it).
    fn line(&self, rng: &mut SmallRng) -> [usize; LINE] {
        let mut words = [0; LINE];
        for w in &mut words {
            // The smaller of two uniform draws: word i has probability ~ 2 (V - i) / V^2.
            let a = rng.random_range(0..self.vocabulary);
            let b = rng.random_range(0..self.vocabulary);
            *w = a.min(b);
        }
        words
    }
}

impl Workload for WordCount {
    fn setup(&self, node: &Node) -> Result<(), TxError> {
        for w in 0..self.workers {
            node.atomically(|tx| tx.create(&root(w), 0))?;
            let words: Vec<usize> = (0..self.vocabulary).collect();
            for chunk in words.chunks(512) {
                node.atomically(|tx| {
                    for &word in chunk {
                        tx.create(&leaf(w, word), 0)?;
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    fn profiles(&self) -> &'static [&'static str] {
        &["count-line"]
    }

    fn op(&self, node: &Node, thread: usize, rng: &mut SmallRng) -> Result<usize, TxError> {
        let w = thread % self.workers;
        let words = self.line(rng);
        node.atomically(|tx| {
            for &word in &words {
                tx.modify(&leaf(w, word), |c| *c += 1)?;
            }
            tx.modify(&root(w), |c| *c += LINE as u64)
        })?;
        let mut plain = self.plain[w].lock().unwrap_or_else(|e| e.into_inner());
        for &word in &words {
            plain[word] += 1;
        }
        self.lines.fetch_add(1, Ordering::Relaxed);
        Ok(0)
    }

    fn check(&self, node: &Node) -> Result<Check, TxError> {
        // The master's merge: every worker's tree, read as one snapshot.
        let (merged, total) = node.atomically_read(|tx| {
            let mut merged = vec![0u64; self.vocabulary];
            let mut total = 0;
            for w in 0..self.workers {
                for (word, m) in merged.iter_mut().enumerate() {
                    *m += *tx.read(&leaf(w, word))?;
                }
                total += *tx.read(&root(w))?;
            }
            Ok((merged, total))
        })?;
        let mut plain = vec![0u64; self.vocabulary];
        for p in &self.plain {
            for (sum, c) in plain
                .iter_mut()
                .zip(p.lock().unwrap_or_else(|e| e.into_inner()).iter())
            {
                *sum += c;
            }
        }
        let lines = self.lines.load(Ordering::Relaxed);
        let words: u64 = plain.iter().sum();
        let ok = merged == plain && total == words;
        Ok(Check {
            ok,
            detail: format!(
                "{lines} lines, {words} words counted; the merged trees {} the plain count",
                if ok { "equal" } else { "DIFFER FROM" }
            ),
        })
    }
}
