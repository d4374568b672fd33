//! `oss` in a running node: the deterministic [`OssNode`] on the node's protocol host
//! (`crate::host`: stepped under a lock by whichever thread brings an input), fed by the node's
//! connections and a 10 ms timer, with its write-ahead log on a disk thread; the engine commits
//! update transactions through it (a [`Certifier`] whose verdict is the node's answer).

use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_core::{Certification, Certifier, CertifyError, LockOutcome, Verdict};
use atomos_protocols::oss::{AbortReason, OssCounters, OssDelivery, OssMsg, OssNode, OssRequest};

use crate::host::{Host, Hosted};
use crate::wire::NodeMsg;

/// How often the protocol's timer runs: its time unit.
pub(crate) const TICK: Duration = Duration::from_millis(10);

impl Hosted for OssNode {
    const NAME: &'static str = "oss";
    const TICK: Duration = TICK;
    const DISK_QUEUE: usize = 4096;
    type Answer = OssDelivery;

    fn answer(d: OssDelivery) -> (u64, OssDelivery) {
        let tx = match &d {
            OssDelivery::Committed { tx, .. } | OssDelivery::Aborted { tx, .. } => *tx,
        };
        (tx, d)
    }

    fn to_wire(msg: OssMsg) -> NodeMsg {
        NodeMsg::Oss(msg)
    }

    fn from_wire(msg: NodeMsg) -> Result<OssMsg, NodeMsg> {
        match msg {
            NodeMsg::Oss(msg) => Ok(msg),
            other => Err(other),
        }
    }
}

/// An OSS node driven by the runtime.
pub struct OssDriver {
    host: Arc<Host<OssNode>>,
    /// How long a commit waits for its answer before its outcome is unknown.
    limit: Duration,
}

impl OssDriver {
    /// The driver of the OSS node `host` runs; commits wait up to `limit` for their answer.
    pub(crate) fn new(host: Arc<Host<OssNode>>, limit: Duration) -> OssDriver {
        OssDriver { host, limit }
    }

    /// The node's counters.
    pub fn counters(&self) -> OssCounters {
        self.host.with(OssNode::counters)
    }

    /// Domain `d`'s epoch and watermarks here: (epoch, held, stable, applied).
    pub fn watermarks(&self, d: u32) -> Option<(u64, u64, u64, u64)> {
        self.host.with(|n| n.watermarks(d))
    }

    /// Hands `request` (made with the caller number given to `make`) to the node and waits
    /// for its answer, or `None` after the limit.
    fn call(&self, make: impl FnOnce(u64) -> OssRequest) -> Option<OssDelivery> {
        // No polling: a commit takes about a millisecond, and polling that long took the CPU
        // the protocol needs (bank over TCP, 3 nodes x 4 threads: 5.0-5.1k against 4.1-4.7k
        // tx/s with a 500 us window).
        self.host
            .call(make, Instant::now() + self.limit, Duration::ZERO)
    }
}

/// The engine's way to commit under `oss`.
pub(crate) struct OssCertifier(pub(crate) Arc<OssDriver>);

impl Certifier for OssCertifier {
    fn certify(&self, c: Certification) -> Result<Verdict, CertifyError> {
        let answer = self.0.call(|tx| OssRequest::Commit {
            tx,
            reads: c.reads,
            writes: c.writes,
        });
        match answer {
            Some(OssDelivery::Committed { version, .. }) => Ok(Verdict::Committed { version }),
            Some(OssDelivery::Aborted {
                reason: AbortReason::CrossDomain,
                ..
            }) => Err(CertifyError::Refused(
                "it touches keys of more than one consistency domain".into(),
            )),
            Some(OssDelivery::Aborted {
                reason: AbortReason::Unknown,
                ..
            }) => Err(CertifyError::unknown(
                "an image of its domain passed it, and whether it committed is not known",
            )),
            Some(OssDelivery::Aborted { .. }) => Ok(Verdict::Conflict),
            None => Err(CertifyError::unknown(format!(
                "no answer within {} ms",
                self.0.limit.as_millis()
            ))),
        }
    }

    fn barrier(&self) -> Result<u64, CertifyError> {
        match self.0.call(|tx| OssRequest::Barrier { tx }) {
            Some(OssDelivery::Committed { version, .. }) => Ok(version),
            _ => Err(CertifyError::unknown(
                "the barrier was not answered in time",
            )),
        }
    }

    fn abstract_lock(&self, _owner: u64, name: &str) -> Result<LockOutcome, CertifyError> {
        Err(CertifyError::Refused(format!(
            "abstract lock {name:?}: open nesting's abstract locks are not available under oss"
        )))
    }

    fn release_abstract(&self, _owner: u64, _names: Vec<String>) {}
}
