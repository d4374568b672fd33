//! Node clocks (thesis 5.1): Lamport-style, moved up by every message and advanced by every
//! write commit. The forwarding rule of figure 5.1 that uses them is in the node's read path.

/// A node's clock: incremented by each write transaction it commits, and moved up to any larger
/// clock piggybacked on a message it receives (a Lamport-style clock).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeClock(u64);

impl NodeClock {
    /// A clock at `value`.
    pub fn new(value: u64) -> NodeClock {
        NodeClock(value)
    }

    /// The current value (what messages carry, and what a new transaction starts at).
    pub fn now(&self) -> u64 {
        self.0
    }

    /// A message carried `remote`: move up to it if it is larger. Returns the new value.
    pub fn observe(&mut self, remote: u64) -> u64 {
        self.0 = self.0.max(remote);
        self.0
    }

    /// A write transaction commits here: the clock advances, and the new value is the version of
    /// everything it writes. (Clocks from messages are bounded by [`MAX_CLOCK`], so this never
    /// comes near wrapping.)
    pub fn advance_for_commit(&mut self) -> u64 {
        self.0 = self.0.saturating_add(1);
        self.0
    }
}

/// The largest clock a message may carry: far beyond what commits reach (one per commit), far
/// below where adding would wrap. A message claiming more is dropped.
pub const MAX_CLOCK: u64 = 1 << 62;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_move_up_only_and_advance_on_commit() {
        let mut c = NodeClock::new(5);
        assert_eq!(c.observe(3), 5);
        assert_eq!(c.observe(9), 9);
        assert_eq!(c.advance_for_commit(), 10);
        assert_eq!(c.now(), 10);
    }
}
