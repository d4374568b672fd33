//! `oss` in a running node: the deterministic [`OssNode`] on the driver core's shared host
//! (stepped under a lock by whichever thread brings an input), fed by the node's connections
//! and a 10 ms timer, with its write-ahead log on a disk thread; the engine commits update
//! transactions through it (a [`Certifier`] whose verdict is the node's answer).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_core::{Certification, Certifier, CertifyError, Engine, LockOutcome, Verdict};
use atomos_protocols::oss::{
    AbortReason, OssConfig, OssCounters, OssDelivery, OssMsg, OssNode, OssRequest,
};
use atomos_seam::Input;

use crate::answer::{AnswerSlot, AnswerSlots};
use crate::disk::FsyncPolicy;
use crate::driver::{open_hosted_log, Runner, Shared};
use crate::health::Health;

/// How often the protocol's timer runs: its time unit.
pub(crate) const TICK: Duration = Duration::from_millis(10);

/// Writes the log may queue before steps wait.
const DISK_QUEUE: usize = 4096;

/// Committing threads waiting for their answer, by request number.
type Waiters = AnswerSlots<OssDelivery>;

/// Sends a protocol message to a node.
pub(crate) type SendFn = Box<dyn Fn(u64, OssMsg) + Send + Sync>;

/// An OSS node driven by the runtime.
pub struct OssDriver {
    node: Arc<Shared<OssNode>>,
    waiters: Waiters,
    next: AtomicU64,
    /// How long a commit waits for its answer before its outcome is unknown.
    limit: Duration,
}

/// What an OSS node starts from.
pub(crate) struct OssStart {
    pub(crate) cfg: OssConfig,
    pub(crate) engine: Arc<Engine>,
    /// Its log, and how it is synced (`None`: kept nowhere).
    pub(crate) wal: Option<(PathBuf, FsyncPolicy)>,
    pub(crate) limit: Duration,
}

impl OssDriver {
    /// Opens the node's log (if any), rebuilds the node from it, and starts its disk thread.
    pub(crate) fn start(
        start: OssStart,
        send: SendFn,
        health: Arc<Health>,
    ) -> Result<Arc<OssDriver>, String> {
        let me = start.cfg.id;
        let (log, disk, host) =
            open_hosted_log(format!("oss-disk-{me}"), start.wal.as_ref(), DISK_QUEUE)?;
        let node = OssNode::open(start.cfg, start.engine, &log).map_err(|e| e.to_string())?;
        let waiters: Waiters = Arc::default();
        let answers = waiters.clone();
        let deliver = Box::new(move |d: OssDelivery| {
            let tx = match &d {
                OssDelivery::Committed { tx, .. } | OssDelivery::Aborted { tx, .. } => *tx,
            };
            if let Some(w) = answers.lock().get(&tx) {
                w.put(d);
            }
        });
        let runner = Runner::new(node, disk, TICK);
        let node = Arc::new(Shared::new(
            runner,
            send,
            deliver,
            health,
            format!("oss node {me}"),
        ));
        let _ = host.set(Arc::downgrade(&node));
        let driver = Arc::new(OssDriver {
            node,
            waiters,
            next: AtomicU64::new(1),
            limit: start.limit,
        });
        Ok(driver)
    }

    /// A message from node `from`.
    pub(crate) fn message(&self, from: u64, msg: OssMsg) {
        self.node.step(Input::Message { from, msg });
    }

    /// The timer.
    pub(crate) fn tick(&self) {
        self.node.step(Input::Tick);
    }

    /// The node's counters.
    pub fn counters(&self) -> OssCounters {
        self.node.with(OssNode::counters)
    }

    /// Domain `d`'s epoch and watermarks here: (epoch, held, stable, applied).
    pub fn watermarks(&self, d: u32) -> Option<(u64, u64, u64, u64)> {
        self.node.with(|n| n.watermarks(d))
    }

    /// Hands `request` (made with the caller number given to `make`) to the node and waits
    /// for its answer, or `None` after the limit.
    fn call(&self, make: impl FnOnce(u64) -> OssRequest) -> Option<OssDelivery> {
        let tx = self.next.fetch_add(1, Ordering::Relaxed);
        let waiter = Arc::new(AnswerSlot::default());
        self.waiters.lock().insert(tx, waiter.clone());
        self.node.step(Input::Request(make(tx)));
        let answer = // No polling: a commit takes about a millisecond, and polling that long took the CPU
        // the protocol needs (bank over TCP, 3 nodes x 4 threads: 5.0-5.1k against 4.1-4.7k
        // tx/s with a 500 us window).
        waiter.wait_until(Instant::now() + self.limit, Duration::ZERO);
        self.waiters.lock().remove(&tx);
        answer
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
