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
//!   candidate lacking a committed entry could win with it (with another replica that simply
//!   missed the entry, both logs empty), and so could it as a candidate. A replica started
//!   with `ReplicaConfig::rejoin` neither votes nor campaigns until it has heard an append from
//!   a leader (which carries the leader's whole
//!   commit index; a heartbeat's is capped by what the leader believes this replica holds, and
//!   a snapshot may be older) and has committed as far as that index, or until it leads (a
//!   leader's log holds every committed entry). Only an operator can tell a wiped replica from
//!   a new one, whose empty log looks the same: a new cluster must be able to elect its first
//!   leader from empty logs, and a wiped replica must not help to.
//!
//! A wiped replica also forgot its vote of the current term: raft-rs's leader lease
//! (check-quorum) makes it ignore candidates while a leader is alive, which leaves only a very
//! narrow window for a second vote in a term it had voted in.

/// What a replica knows of its own log's losses.
#[derive(Debug)]
pub(crate) struct LostLog {
    /// Started with an empty log and has not caught up yet.
    rejoining: bool,
    /// The highest commit index a leader's append announced while rejoining (`None`: no
    /// append heard yet).
    target: Option<u64>,
    /// The tick it last told a leader its log is behind.
    reported_at: Option<u64>,
}

impl LostLog {
    /// The state of a replica that was told it rejoins (`rejoin`) or not.
    pub(crate) fn new(rejoin: bool) -> LostLog {
        LostLog {
            rejoining: rejoin,
            target: None,
            reported_at: None,
        }
    }

    /// Whether it still rejoins (its log must say so across restarts).
    pub(crate) fn rejoining(&self) -> bool {
        self.rejoining
    }

    /// Whether a vote request must be dropped.
    pub(crate) fn refuses_vote(&self) -> bool {
        self.rejoining
    }

    /// A leader's append announced its commit index `commit`.
    pub(crate) fn leader_appended(&mut self, commit: u64) {
        if self.rejoining {
            self.target = Some(self.target.map_or(commit, |t| t.max(commit)));
        }
    }

    /// The replica has committed through `committed` (and `leads`, or not): rejoining ends
    /// once that reaches what a leader's append announced, or once it leads. True when it just
    /// ended.
    pub(crate) fn caught_up(&mut self, committed: u64, leads: bool) -> bool {
        if self.rejoining && (leads || self.target.is_some_and(|t| committed >= t)) {
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
        assert!(l.refuses_vote());
        assert!(!l.caught_up(3, false), "no leader's append heard yet");
        l.leader_appended(10);
        assert!(!l.caught_up(9, false));
        assert!(l.caught_up(10, false));
        assert!(!l.refuses_vote());
        let mut kept = LostLog::new(false);
        assert!(!kept.refuses_vote());
        assert!(!kept.caught_up(0, false));
    }

    #[test]
    fn leading_ends_rejoining() {
        let mut leader = LostLog::new(true);
        assert!(!leader.caught_up(1, false));
        assert!(leader.caught_up(1, true));
    }

    #[test]
    fn reports_are_spaced() {
        let mut l = LostLog::new(false);
        assert!(l.report_behind(3, 10));
        assert!(!l.report_behind(12, 10));
        assert!(l.report_behind(13, 10));
    }
}
