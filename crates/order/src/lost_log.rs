//! A replica whose log is shorter than the cluster believes: its disk was wiped (it starts with
//! an empty log after the cluster had a history) or lost writes.
//!
//! Raft assumes a replica never loses what it persisted. Two things go wrong when it does, and
//! this module is how a replica copes with both:
//! - The leader's progress for it still says it holds the entries it acknowledged: heartbeats
//!   commit beyond its log (the raft guard drops them) and the leader takes its rejections as
//!   stale. The replica tells the leader ([`crate::OrderMsg::Behind`]), which starts over with
//!   it from where its log really ends (probing back, or sending a snapshot).
//! - Its acknowledgements counted towards commits it no longer holds: if it voted now, a
//!   candidate lacking a committed entry could win with it. A replica that started with an
//!   empty log grants no vote to a candidate with a non-empty log (the cluster has a history)
//!   until it has committed as far as a leader had when it first heard from one. In a new
//!   cluster every log is empty at the first election, so that election is unaffected.

/// What a replica knows of its own log's losses.
#[derive(Debug)]
pub(crate) struct LostLog {
    /// Started with an empty log and has not caught up yet.
    rejoining: bool,
    /// The highest commit index a leader announced while rejoining.
    target: u64,
    /// The tick it last told a leader its log is behind.
    reported_at: Option<u64>,
}

impl LostLog {
    /// The state of a replica that opened with `empty_log`.
    pub(crate) fn new(empty_log: bool) -> LostLog {
        LostLog {
            rejoining: empty_log,
            target: 0,
            reported_at: None,
        }
    }

    /// Whether a vote request from a candidate whose log ends at `candidate_index` must be
    /// dropped.
    pub(crate) fn refuses_vote(&self, candidate_index: u64) -> bool {
        self.rejoining && candidate_index > 0
    }

    /// A leader announced `commit` (in a heartbeat, an append or a snapshot).
    pub(crate) fn leader_committed(&mut self, commit: u64) {
        if self.rejoining {
            self.target = self.target.max(commit);
        }
    }

    /// The replica has committed through `committed`: rejoining ends once that reaches what a
    /// leader had committed. True when it just ended.
    pub(crate) fn caught_up(&mut self, committed: u64) -> bool {
        if self.rejoining && self.target > 0 && committed >= self.target {
            self.rejoining = false;
            return true;
        }
        false
    }

    /// Whether to tell the leader now that this log ends before what it committed (at most
    /// once every `every` ticks).
    pub(crate) fn report_behind(&mut self, now: u64, every: u64) -> bool {
        if self.reported_at.is_some_and(|t| now < t + every.max(1)) {
            return false;
        }
        self.reported_at = Some(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_started_empty_votes_again_once_caught_up() {
        let mut l = LostLog::new(true);
        // A new cluster's first election: every candidate's log is empty.
        assert!(!l.refuses_vote(0));
        assert!(l.refuses_vote(5));
        assert!(!l.caught_up(3), "no leader heard from yet");
        l.leader_committed(10);
        assert!(!l.caught_up(9));
        assert!(l.caught_up(10));
        assert!(!l.refuses_vote(5));
        let mut kept = LostLog::new(false);
        assert!(!kept.refuses_vote(5));
        assert!(!kept.caught_up(0));
    }

    #[test]
    fn reports_are_spaced() {
        let mut l = LostLog::new(false);
        assert!(l.report_behind(3, 10));
        assert!(!l.report_behind(12, 10));
        assert!(l.report_behind(13, 10));
    }
}
