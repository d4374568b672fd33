//! `certify` (and `active`) on a running node: the engine's certifier sends each update
//! transaction's certification through the node's order-layer replica, whose state machine is
//! the replicated store (`atomos_protocols::replicated`), and waits for the verdict; under
//! `active` the node's update procedures are ordered the same way and their outcome awaited.

use std::time::Duration;

use atomos_core::{Certification, Certifier, CertifyError, LockOutcome, Outcome, TxError, Verdict};
use atomos_protocols::replicated::{Answer, Entry, LockOwner};
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
    /// `atomos_replica_alarms_total` on every replica (`None`: never).
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

/// Certifies through the local order replica. Requests from all of the node's threads share
/// the replica's batches.
pub(crate) struct CertifySink {
    submitter: Submitter,
    limit: Duration,
    /// This node's id and its run: with them the engine's family ids are unique in the
    /// cluster.
    node: u64,
    run: u64,
}

impl CertifySink {
    /// The sink of node `node` in its run `run` (different at each start).
    pub(crate) fn new(submitter: Submitter, limit: Duration, node: u64, run: u64) -> CertifySink {
        CertifySink {
            submitter,
            limit,
            node,
            run,
        }
    }

    /// The cluster-wide identity of this node's transaction family `family`.
    fn owner(&self, family: u64) -> LockOwner {
        LockOwner {
            node: self.node,
            run: self.run,
            family,
        }
    }

    /// Orders `entry` and returns the store's answer. An entry not ordered within the limit
    /// never runs (it is refused); one whose fate is not known then carries the ticket to
    /// ask [`outcome`] about.
    fn order(&self, entry: Entry) -> Result<Answer, CertifyError> {
        let bytes = self
            .submitter
            .submit_wait(entry.encode(), self.limit)
            .map_err(|e| match e {
                SubmitError::Expired(_) => CertifyError::Refused(e.to_string()),
                SubmitError::TimedOut { ticket, .. } => CertifyError::OutcomeUnknown {
                    reason: format!("it was sent to be ordered: {e}"),
                    ticket: Some(ticket.0),
                },
                SubmitError::Stopped => {
                    CertifyError::unknown(format!("it was sent to be ordered: {e}"))
                }
            })?;
        Answer::decode(&bytes).map_err(|e| {
            CertifyError::unknown(format!("the replica's answer does not decode: {e}"))
        })
    }
}

impl Certifier for CertifySink {
    fn certify(&self, c: Certification) -> Result<Verdict, CertifyError> {
        let entry = Entry::Certify {
            reads: c.reads,
            writes: c.writes,
        };
        match self.order(entry)? {
            Answer::Committed { version } => Ok(Verdict::Committed { version }),
            Answer::Conflict { .. } => Ok(Verdict::Conflict),
            other => Err(CertifyError::unknown(format!(
                "the replica answered a certification with {other:?}"
            ))),
        }
    }

    fn barrier(&self) -> Result<u64, CertifyError> {
        Ok(self.order(Entry::Barrier)?.position())
    }

    fn abstract_lock(&self, owner: u64, name: &str) -> Result<LockOutcome, CertifyError> {
        let entry = Entry::LockFor {
            owner: self.owner(owner),
            name: name.to_string(),
        };
        match self.order(entry)? {
            Answer::Locked { taken: true, .. } => Ok(LockOutcome::Taken),
            Answer::Locked { taken: false, .. } => Ok(LockOutcome::AlreadyHeld),
            Answer::LockHeld { .. } => Ok(LockOutcome::HeldByAnother),
            other => Err(CertifyError::unknown(format!(
                "the replica answered a lock request with {other:?}"
            ))),
        }
    }

    fn release_abstract(&self, owner: u64, names: Vec<String>) {
        let entry = Entry::UnlockFor {
            owner: self.owner(owner),
            names,
        };
        if let Err(e) = self.order(entry) {
            // Held until this node's next start releases its earlier runs' locks.
            warn!(error = %e, "abstract locks not released");
        }
    }
}

impl crate::node::Invoker for CertifySink {
    fn invoke(&self, procedure: &str, arguments: Vec<u8>) -> Result<(u64, Outcome), TxError> {
        let entry = Entry::Invoke {
            procedure: procedure.to_string(),
            arguments,
        };
        match self.order(entry) {
            Ok(Answer::Invoked { position, outcome }) => Ok((position, outcome)),
            Ok(other) => Err(TxError::OutcomeUnknown {
                reason: format!("the replica answered an invocation with {other:?}"),
                ticket: None,
            }),
            Err(CertifyError::OutcomeUnknown { reason, ticket }) => {
                Err(TxError::OutcomeUnknown { reason, ticket })
            }
            Err(CertifyError::Refused(reason)) => Err(TxError::Refused { reason }),
        }
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
        RequestOutcome::Applied(bytes) => match Answer::decode(&bytes) {
            Ok(Answer::Conflict { .. }) => CommitOutcome::NotCommitted {
                reason: "it conflicted with a transaction ordered before it".into(),
            },
            Ok(Answer::Invoked {
                outcome: Outcome::Failed(reason),
                ..
            }) => CommitOutcome::NotCommitted { reason },
            Ok(Answer::Refused { reason, .. }) => CommitOutcome::NotCommitted { reason },
            _ => CommitOutcome::Committed,
        },
        RequestOutcome::Expired => CommitOutcome::NotCommitted {
            reason: "it was not ordered before its deadline (the commit limit)".into(),
        },
        RequestOutcome::Pending => CommitOutcome::Pending,
        RequestOutcome::Unknown => CommitOutcome::Unknown,
    }
}

/// Orders this node's periodic entries until the node stops: a garbage collection every
/// `collect_every`, a digest every `digest_every` carrying the digest this node's replica
/// answered for the previous one (every replica compares it with its own).
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
    while !stop.is_cancelled() {
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
            let entry = match i {
                0 => Entry::Collect,
                _ => Entry::Digest { reported },
            };
            match submitter.submit_wait(entry.encode(), every) {
                Ok(bytes) => {
                    if let Ok(Answer::Digested { position, digest }) = Answer::decode(&bytes) {
                        reported = Some((node, position, digest));
                    }
                }
                Err(crate::ordering::SubmitError::Stopped) => return,
                Err(
                    crate::ordering::SubmitError::TimedOut { .. }
                    | crate::ordering::SubmitError::Expired(_),
                ) => {}
            }
        }
    }
}
