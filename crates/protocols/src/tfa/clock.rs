//! Node clocks and transaction forwarding (thesis 5.1, figure 5.1).

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
    /// everything it writes.
    pub fn advance_for_commit(&mut self) -> u64 {
        self.0 += 1;
        self.0
    }
}

/// What a transaction must do after reading from a node whose clock was `sender`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// The sender is not ahead: nothing to do.
    Stay,
    /// Every object read is still at a version no newer than the transaction's start: the
    /// transaction moves its timestamp up to this value.
    To(u64),
    /// Something read has a newer version now: the transaction's reads may be inconsistent with
    /// what it reads next, so it must abort (or resume from a checkpoint).
    Abort,
}

/// The forwarding rule: a transaction with timestamp `timestamp` that receives an object from a
/// node at clock `sender` is forwarded to `sender` if every object in its read set still has a
/// current version at most `timestamp` (`current_read_versions` yields those versions).
pub fn forward(
    timestamp: u64,
    sender: u64,
    current_read_versions: impl IntoIterator<Item = u64>,
) -> Forward {
    if sender <= timestamp {
        return Forward::Stay;
    }
    if current_read_versions.into_iter().all(|v| v <= timestamp) {
        Forward::To(sender)
    } else {
        Forward::Abort
    }
}

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

    #[test]
    fn forwarding_follows_figure_5_1() {
        assert_eq!(
            forward(10, 8, [12]),
            Forward::Stay,
            "sender behind: nothing to check"
        );
        assert_eq!(forward(10, 15, [3, 10]), Forward::To(15));
        assert_eq!(forward(10, 15, [3, 11]), Forward::Abort);
        assert_eq!(forward(10, 15, []), Forward::To(15), "nothing read yet");
    }
}
