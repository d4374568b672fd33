//! `certify` on a running node: the engine's certifier sends each update transaction's
//! certification through the node's order-layer replica, whose state machine is the replicated
//! store (`atomos_protocols::replicated`), and waits for the verdict.

use std::time::Duration;

use atomos_core::{Certification, Certifier, CertifyError, Verdict};
use atomos_protocols::replicated::{Answer, Entry};

use crate::ordering::Submitter;

/// How long a commit waits for its verdict by default before it is reported as
/// [`TxError::OutcomeUnknown`](atomos_core::TxError::OutcomeUnknown).
pub const DEFAULT_COMMIT_LIMIT: Duration = Duration::from_secs(10);

/// Certifies through the local order replica. Requests from all of the node's threads share
/// the replica's batches.
pub(crate) struct CertifySink {
    submitter: Submitter,
    limit: Duration,
}

impl CertifySink {
    pub(crate) fn new(submitter: Submitter, limit: Duration) -> CertifySink {
        CertifySink { submitter, limit }
    }

    /// Orders `entry` and returns the store's answer.
    fn order(&self, entry: Entry) -> Result<Answer, CertifyError> {
        let bytes = self
            .submitter
            .submit_wait(entry.encode(), self.limit)
            .map_err(|e| CertifyError::OutcomeUnknown(format!("it was sent to be ordered: {e}")))?;
        Answer::decode(&bytes).map_err(|e| {
            CertifyError::OutcomeUnknown(format!("the replica's answer does not decode: {e}"))
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
            other => Err(CertifyError::OutcomeUnknown(format!(
                "the replica answered a certification with {other:?}"
            ))),
        }
    }

    fn barrier(&self) -> Result<u64, CertifyError> {
        Ok(self.order(Entry::Barrier)?.position())
    }
}
