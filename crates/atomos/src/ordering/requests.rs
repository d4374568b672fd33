//! The vocabulary of submissions to an order node: why one has no answer, the ticket to ask
//! about it later, what became of it, where its answer goes, and the outcomes kept for callers
//! that stopped waiting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use atomos_net::transport::NodeId;
use atomos_order::{ChangeRefused, MemberChange, OrderMsg};
use tokio::sync::oneshot;

use crate::answer::{AnswerSlot, Replier};
use crate::disk::DiskEvent;

/// Why a submitted request has no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The node stopped before the request was answered (it may still run).
    #[error("the order node stopped")]
    Stopped,
    /// The request was not ordered before its deadline: it never runs.
    #[error("not ordered within {0:?}: it never runs")]
    Expired(Duration),
    /// The request's deadline passed without an answer reaching this node, and the cluster
    /// no longer knows whether it ran (it forgot the session of the client that sent it).
    #[error("no answer within {0:?}, and the cluster no longer knows whether it ran")]
    Forgotten(Duration),
    /// Neither answer nor expiry came in time (the cluster has had no majority since): the
    /// request may still run if a majority returns before its deadline passes in the log.
    /// Ask [`Submitter::outcome`](super::Submitter::outcome) with the ticket.
    #[error("no outcome within {limit:?} (ask for ticket {ticket} later)")]
    TimedOut {
        /// How long the caller waited.
        limit: Duration,
        /// What to ask [`Submitter::outcome`](super::Submitter::outcome) about.
        ticket: Ticket,
    },
}

/// A request whose caller stopped waiting before its outcome was known, to ask
/// [`Submitter::outcome`](super::Submitter::outcome) about. Numbered per node start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub u64);

impl std::fmt::Display for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What became of a request its caller stopped waiting for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// It ran; the state machine's answer.
    Applied(Vec<u8>),
    /// It was not ordered before its deadline: it never runs.
    Expired,
    /// Its deadline passed, and the cluster no longer knows whether it ran.
    Forgotten,
    /// Not decided yet: the cluster has had no majority since it was sent. It is decided
    /// once a majority returns (by its deadline, if that has passed by then).
    Pending,
    /// This node does not know the ticket (it stopped since, or the ticket is older than the
    /// [`WATCHED_MAX`] it keeps).
    Unknown,
}

/// How many requests whose callers stopped waiting a node keeps the outcome of (the latest).
pub const WATCHED_MAX: usize = 65_536;

/// How long [`Submitter::submit_wait`](super::Submitter::submit_wait) waits past a request's deadline to hear that it
/// expired (a re-sent copy is answered so by any replica whose log's time passed it).
pub const EXPIRY_GRACE: Duration = Duration::from_secs(1);

/// The answer a submission's waiter gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// It ran: the state machine's answer.
    Applied(Vec<u8>),
    /// It expired unordered.
    Expired,
    /// Its deadline passed, and the cluster forgot whether it ran.
    Forgotten,
}

/// Where a request's answer goes.
pub(super) enum Reply {
    /// An async caller.
    Async(oneshot::Sender<Answer>),
    /// A thread (or fiber) waiting in [`Submitter::submit_wait`](super::Submitter::submit_wait).
    Blocking(Replier<Answer>),
}

impl Reply {
    pub(super) fn send(self, answer: Answer) {
        match self {
            Reply::Async(tx) => {
                let _ = tx.send(answer);
            }
            Reply::Blocking(reply) => reply.send(answer),
        }
    }
}

/// What the replica's task takes in.
pub(super) enum Event {
    Net {
        from: NodeId,
        msg: OrderMsg,
    },
    Submit {
        payload: Vec<u8>,
        deadline_ms: u64,
        reply: Reply,
    },
    Disk(DiskEvent),
    /// A membership change to propose, and who waits for the leader's answer.
    ChangeMembership {
        change: MemberChange,
        reply: oneshot::Sender<Result<u64, ChangeRefused>>,
    },
    /// The state the replica asked to have encoded at `seq`, encoded off its task.
    SnapshotEncoded {
        seq: u64,
        state: Vec<u8>,
    },
    /// A snapshot covering position `after` or later is wanted, with its state (a backup).
    Snapshot {
        after: u64,
        reply: oneshot::Sender<atomos_order::SnapshotCopy>,
    },
}

/// The log's time for a request that may be ordered for `limit` from now: milliseconds since
/// the Unix epoch by this node's clock (which the log's time follows; see
/// `atomos_order::Request::deadline_ms`).
pub fn deadline_after(limit: Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (now.as_millis() as u64).saturating_add(limit.as_millis().min(u64::MAX as u128) as u64)
}

/// The requests whose callers stopped waiting, by ticket: each one's answer slot (which its
/// local client still fills) until its outcome is taken from it. At most [`WATCHED_MAX`]; the
/// oldest tickets go first.
#[derive(Default)]
pub(super) struct Watched(BTreeMap<u64, Watch>);

enum Watch {
    Waiting(Arc<AnswerSlot<Option<Answer>>>),
    Known(RequestOutcome),
}

impl Watched {
    pub(super) fn watch(&mut self, ticket: u64, slot: Arc<AnswerSlot<Option<Answer>>>) {
        self.0.insert(ticket, Watch::Waiting(slot));
        while self.0.len() > WATCHED_MAX {
            self.0.pop_first();
        }
    }

    pub(super) fn outcome(&mut self, ticket: u64) -> RequestOutcome {
        let Some(watch) = self.0.get_mut(&ticket) else {
            return RequestOutcome::Unknown;
        };
        if let Watch::Waiting(slot) = watch {
            let known = match slot.take() {
                None => return RequestOutcome::Pending,
                Some(Some(Answer::Applied(response))) => RequestOutcome::Applied(response),
                Some(Some(Answer::Expired)) => RequestOutcome::Expired,
                Some(Some(Answer::Forgotten)) => RequestOutcome::Forgotten,
                // The node stopped with the request unanswered.
                Some(None) => RequestOutcome::Unknown,
            };
            *watch = Watch::Known(known);
        }
        match watch {
            Watch::Known(outcome) => outcome.clone(),
            Watch::Waiting(_) => RequestOutcome::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_request_is_pending_until_its_slot_fills_and_old_tickets_are_forgotten() {
        let mut watched = Watched::default();
        let slot = Arc::new(AnswerSlot::default());
        watched.watch(1, slot.clone());
        assert_eq!(watched.outcome(1), RequestOutcome::Pending);
        slot.put(Some(Answer::Applied(vec![7])));
        // Taken once, told every time after.
        assert_eq!(watched.outcome(1), RequestOutcome::Applied(vec![7]));
        assert_eq!(watched.outcome(1), RequestOutcome::Applied(vec![7]));
        let expired = Arc::new(AnswerSlot::default());
        expired.put(Some(Answer::Expired));
        watched.watch(2, expired);
        assert_eq!(watched.outcome(2), RequestOutcome::Expired);
        let stopped = Arc::new(AnswerSlot::default());
        stopped.put(None);
        watched.watch(3, stopped);
        assert_eq!(watched.outcome(3), RequestOutcome::Unknown);
        assert_eq!(watched.outcome(99), RequestOutcome::Unknown);
        for t in 4..4 + WATCHED_MAX as u64 {
            watched.watch(t, Arc::new(AnswerSlot::default()));
        }
        assert_eq!(watched.0.len(), WATCHED_MAX);
        assert_eq!(
            watched.outcome(1),
            RequestOutcome::Unknown,
            "the oldest go first"
        );
        assert_eq!(
            watched.outcome(4 + WATCHED_MAX as u64 - 1),
            RequestOutcome::Pending
        );
    }
}
