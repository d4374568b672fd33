//! `certify` (and `active`) on a running node: the engine's certifier sends each update
//! transaction's certification through the node's order-layer replica, whose state machine is
//! the replicated store (`atomos_protocols::replicated`), and waits for the verdict; under
//! `active` the node's update procedures are ordered the same way and their outcome awaited.

use std::time::Duration;

use atomos_core::{CertifyError, Outcome, TxError};
use atomos_protocols::replicated::client::{self, Orderer, StoreClient};
use tracing::warn;

use crate::ordering::{RequestOutcome, SubmitError, Submitter, Ticket};

/// How long a commit waits for its verdict by default before it is reported as
/// [`TxError::OutcomeUnknown`](atomos_core::TxError::OutcomeUnknown).
pub const DEFAULT_COMMIT_LIMIT: Duration = Duration::from_secs(10);

/// How `certify` runs on a node.
#[derive(Clone, Copy, Debug)]
pub struct CertifyOptions {
    /// How long a commit waits for its verdict before it fails with
    /// [`TxError::OutcomeUnknown`](atomos_core::TxError::OutcomeUnknown).
    pub commit_limit: Duration,
    /// How often this node orders a garbage collection (`None`: only when asked, with
    /// [`NodeRuntime::collect`](crate::NodeRuntime::collect)).
    pub collect_every: Option<Duration>,
    /// How often this node orders a digest: every replica computes one of its store at that
    /// position and compares the digest this node's replica computed at its previous one
    /// with its own; a difference is logged as an error and counted in
    /// `atomos_replica_alarms_total` on every replica (`None`: never). A digest costs every
    /// replica a pass over its store: the next one waits at least [`DIGEST_COST_FACTOR`] times
    /// as long as this node's last one took (ordered, applied and answered; at most ten
    /// periods), so that a large store is not hashed every few seconds.
    pub digest_every: Option<Duration>,
}

impl Default for CertifyOptions {
    /// Commits wait up to [`DEFAULT_COMMIT_LIMIT`]; a collection and a digest every 5
    /// seconds.
    fn default() -> Self {
        CertifyOptions {
            commit_limit: DEFAULT_COMMIT_LIMIT,
            collect_every: Some(Duration::from_secs(5)),
            digest_every: Some(Duration::from_secs(5)),
        }
    }
}

/// Orders the replicated store's entries through this node's order replica, each waiting up
/// to `limit`: what the store's [`StoreClient`] (the node's certifier and invoker) orders
/// through. Requests from all of the node's threads share the replica's batches.
pub(crate) struct SubmitOrderer {
    submitter: Submitter,
    limit: Duration,
}

impl SubmitOrderer {
    /// Orders through `submitter`, waiting up to `limit` for each answer.
    pub(crate) fn new(submitter: Submitter, limit: Duration) -> SubmitOrderer {
        SubmitOrderer { submitter, limit }
    }
}

impl Orderer for SubmitOrderer {
    /// An entry not ordered within the limit never runs (it is refused); one whose fate is not
    /// known then carries the ticket to ask [`outcome`] about.
    fn order(&self, entry: Vec<u8>) -> Result<Vec<u8>, CertifyError> {
        self.submitter
            .submit_wait(entry, self.limit)
            .map_err(|e| match e {
                SubmitError::Expired(_) => CertifyError::Refused(e.to_string()),
                SubmitError::TimedOut { ticket, .. } => CertifyError::OutcomeUnknown {
                    reason: format!("it was sent to be ordered: {e}"),
                    ticket: Some(ticket.0),
                },
                SubmitError::Stopped | SubmitError::Forgotten(_) => {
                    CertifyError::unknown(format!("it was sent to be ordered: {e}"))
                }
            })
    }

    fn report(&self, text: String) {
        warn!("{text}");
    }
}

/// The node's certifier and invoker under `certify` and `active`.
pub(crate) type CertifySink = StoreClient<SubmitOrderer>;

impl crate::node::Invoker for CertifySink {
    fn invoke(&self, procedure: &str, arguments: Vec<u8>) -> Result<(u64, Outcome), TxError> {
        StoreClient::invoke(self, procedure, arguments)
    }
}

/// What became of a commit or an update invocation whose caller heard
/// [`TxError::OutcomeUnknown`](atomos_core::TxError::OutcomeUnknown) with a ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// It ran: the transaction committed (or the procedure returned).
    Committed,
    /// It did not commit and never will: a conflict, the procedure failed, or it was not
    /// ordered before its deadline (the commit limit).
    NotCommitted {
        /// Why.
        reason: String,
    },
    /// Not decided yet: the cluster has had no majority since. It is decided once a
    /// majority returns (refused, if its deadline has passed in the log by then).
    Pending,
    /// This node cannot tell: the ticket is not one of its (or too old, or the node
    /// restarted since).
    Unknown,
}

/// What became of the entry `ticket` names on this node (see [`CommitOutcome`]).
pub(crate) fn outcome(submitter: &Submitter, ticket: u64) -> CommitOutcome {
    match submitter.outcome(Ticket(ticket)) {
        RequestOutcome::Applied(bytes) => match client::took_effect(&bytes) {
            Some(Ok(())) => CommitOutcome::Committed,
            Some(Err(reason)) => CommitOutcome::NotCommitted { reason },
            // It ran; how cannot be told.
            None => CommitOutcome::Unknown,
        },
        RequestOutcome::Expired => CommitOutcome::NotCommitted {
            reason: "it was not ordered before its deadline (the commit limit)".into(),
        },
        RequestOutcome::Pending => CommitOutcome::Pending,
        RequestOutcome::Unknown | RequestOutcome::Forgotten => CommitOutcome::Unknown,
    }
}

/// A node's next digest waits at least this many times as long as its last one took: digests
/// then take at most about 2% of an applier's time per node that orders them (a 1 GiB store
/// took 80 ms to hash on an idle core, 200 to 400 ms beside a cluster's load on two cores).
pub const DIGEST_COST_FACTOR: u32 = 50;

/// Orders this node's periodic entries until the node stops: a garbage collection every
/// `collect_every`, a digest every `digest_every` (or [`DIGEST_COST_FACTOR`] times as long as
/// the last one took, if longer, up to ten periods) carrying the digest this node's replica answered for the
/// previous one (every replica compares it with its own).
pub(crate) fn housekeeping(
    submitter: &Submitter,
    stop: &tokio_util::sync::CancellationToken,
    node: u64,
    options: CertifyOptions,
) {
    let periods = [options.collect_every, options.digest_every];
    let Some(tick) = periods.iter().flatten().min().copied() else {
        return;
    };
    let start = std::time::Instant::now();
    let mut due = periods.map(|p| p.map(|p| start + p));
    let mut reported = None;
    while !stop.is_cancelled() && !submitter.stopped() {
        std::thread::sleep(tick.min(Duration::from_millis(200)));
        let now = std::time::Instant::now();
        for (i, at) in due.iter_mut().enumerate() {
            let (Some(when), Some(every)) = (*at, periods[i]) else {
                continue;
            };
            if now < when {
                continue;
            }
            *at = Some(now + every);
            // Each waits at most its period; not ordered in time, the next period tries again.
            let orderer = SubmitOrderer::new(submitter.clone(), every);
            if i == 0 {
                let _ = client::collect(&orderer);
            } else {
                let asked = std::time::Instant::now();
                if let Ok((position, digest)) = client::digest(&orderer, reported) {
                    reported = Some((node, position, digest));
                    // At most ten periods: one slow digest (an election) does not stop them.
                    let cost = (asked.elapsed() * DIGEST_COST_FACTOR).min(every * 10);
                    *at = Some(asked + every.max(cost));
                }
            }
        }
    }
}
