//! Whether a node's protocol tasks are alive. A task that fails (an error from its machine or
//! its disk) or panics reports here: the failure is logged at error level with its cause,
//! counted in the metrics (`atomos_component_failed_total`), answered by the `/health`
//! endpoint, and awaited by the node process, which exits non-zero (crash-stop, so that a
//! supervisor restarts it from its log rather than letting it serve without the component).

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::status::ReplicaStatus;

/// Where the node's replica stands now (set by the order node; see `OrderNode::status`).
pub type ReplicaProbe = Arc<dyn Fn() -> ReplicaStatus + Send + Sync>;

/// A node's health: healthy until the first failure, which it keeps; and whether it is ready
/// to serve (healthy, and ready by the probe of its replica if it has one: see
/// `OrderNode::readiness`). One probe: the one set last.
#[derive(Default)]
pub struct Health {
    failure: Mutex<Option<String>>,
    changed: Notify,
    replica: Mutex<Option<ReplicaProbe>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failure", &*self.failure.lock())
            .finish()
    }
}

impl Health {
    /// A healthy node's.
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    /// `component` failed with `cause`: logged, counted, kept (the first failure wins).
    pub fn fail(&self, component: &str, cause: &str) {
        tracing::error!(
            component,
            cause,
            "a protocol component failed; the node must stop"
        );
        metrics::counter!("atomos_component_failed_total", "component" => component.to_string())
            .increment(1);
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some(format!("{component}: {cause}"));
        }
        drop(failure);
        self.changed.notify_waiters();
        self.changed.notify_one();
    }

    /// The first failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Makes `probe` say where the node's replica stands, and so whether the node is ready
    /// (the order node sets it: ready is a replica that follows a leader and has applied what
    /// it knows committed). Setting it again replaces it.
    pub fn set_replica(&self, probe: ReplicaProbe) {
        *self.replica.lock() = Some(probe);
    }

    /// Where the node's replica stands, if it has one.
    pub fn replica(&self) -> Option<ReplicaStatus> {
        let probe = self.replica.lock().clone();
        probe.map(|status| status())
    }

    /// Whether the node is ready to serve: healthy, and its replica ready if it has one.
    pub fn readiness(&self) -> Result<(), String> {
        if let Some(f) = self.failure() {
            return Err(format!("failed: {f}"));
        }
        match self.replica().and_then(|r| r.not_ready) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Waits for a failure and returns it.
    pub async fn failed(&self) -> String {
        loop {
            let notified = self.changed.notified();
            if let Some(f) = self.failure() {
                return f;
            }
            notified.await;
        }
    }

    /// Runs `task` as `component`: an error it returns, or a panic, is reported as a failure.
    /// The returned handle gives the task's own result.
    pub fn supervise<T, E>(
        self: &Arc<Health>,
        component: String,
        task: impl Future<Output = Result<T, E>> + Send + 'static,
    ) -> tokio::task::JoinHandle<Option<Result<T, E>>>
    where
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let health = self.clone();
        let inner = tokio::spawn(task);
        tokio::spawn(async move {
            match inner.await {
                Ok(Ok(v)) => Some(Ok(v)),
                Ok(Err(e)) => {
                    health.fail(&component, &e.to_string());
                    Some(Err(e))
                }
                Err(join) if join.is_panic() => {
                    health.fail(&component, &format!("panicked: {join}"));
                    None
                }
                Err(_cancelled) => None,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_or_panicking_task_is_reported_once() {
        let health = Health::new();
        assert_eq!(health.failure(), None);
        let ok = health.supervise("fine".into(), async { Ok::<u32, String>(7) });
        assert_eq!(ok.await.unwrap(), Some(Ok(7)));
        assert_eq!(health.failure(), None);
        let waiter = {
            let h = health.clone();
            tokio::spawn(async move { h.failed().await })
        };
        let bad = health.supervise("order".into(), async { Err::<(), _>("disk full") });
        assert_eq!(bad.await.unwrap(), Some(Err("disk full")));
        assert_eq!(waiter.await.unwrap(), "order: disk full");
        let panics = health.supervise("tfa".into(), async {
            if health_check_panics() {
                panic!("boom");
            }
            Ok::<(), String>(())
        });
        assert_eq!(panics.await.unwrap(), None);
        // The first failure is the one kept.
        assert_eq!(health.failure().as_deref(), Some("order: disk full"));
    }

    fn health_check_panics() -> bool {
        true
    }
}
