//! The seam's ordering rule between disk and network, as every driver keeps it: an output that
//! follows a disk write is carried out only once that write is durable.

use std::collections::VecDeque;

/// Holds back outputs emitted after disk writes that are not durable yet, and lets them go, in
/// the order they were emitted, as the writes become durable.
#[derive(Debug)]
pub struct Gate<T> {
    /// Writes emitted so far (the latest one's number).
    emitted: u64,
    /// Writes durable so far.
    durable: u64,
    /// Outputs waiting, each with the number of the write it must follow.
    held: VecDeque<(u64, T)>,
}

impl<T> Gate<T> {
    /// A gate with nothing written and nothing held.
    pub fn new() -> Gate<T> {
        Gate {
            emitted: 0,
            durable: 0,
            held: VecDeque::new(),
        }
    }

    /// A write was emitted; returns its number (from 1).
    pub fn write(&mut self) -> u64 {
        self.emitted += 1;
        self.emitted
    }

    /// An output was emitted: it comes back if it may be carried out now, or waits in the gate.
    pub fn pass(&mut self, output: T) -> Option<T> {
        if self.durable >= self.emitted {
            Some(output)
        } else {
            self.held.push_back((self.emitted, output));
            None
        }
    }

    /// Writes up to number `through` are durable: the outputs that waited only for them, in
    /// emission order.
    pub fn durable(&mut self, through: u64) -> Vec<T> {
        self.durable = self.durable.max(through);
        let mut free = Vec::new();
        while self.held.front().is_some_and(|(w, _)| *w <= self.durable) {
            if let Some((_, output)) = self.held.pop_front() {
                free.push(output);
            }
        }
        free
    }

    /// Outputs waiting.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

impl<T> Default for Gate<T> {
    fn default() -> Gate<T> {
        Gate::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_wait_for_the_writes_before_them_in_order() {
        let mut g = Gate::new();
        assert_eq!(g.pass("a"), Some("a"));
        let first = g.write();
        assert_eq!(g.pass("b"), None);
        let second = g.write();
        assert_eq!(g.pass("c"), None);
        assert_eq!(g.held(), 2);
        assert_eq!(g.durable(first), vec!["b"]);
        // Nothing overtakes what still waits, even if it came later.
        assert_eq!(g.durable(first), Vec::<&str>::new());
        assert_eq!(g.durable(second), vec!["c"]);
        assert_eq!(g.pass("d"), Some("d"));
    }
}
