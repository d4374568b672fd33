//! A node's transaction service (PRESTO): transactions submitted with a priority, run by a pool
//! of worker threads, the most urgent first; a running transaction of lower priority is
//! suspended at its next safe point (a transactional operation, or `tx.yield_now()`) when a
//! more urgent one waits, and resumed later on any worker. See `atomos_sched`.

use std::sync::Arc;

use atomos_core::{Tx, TxError, TxOptions};
pub use atomos_sched::{
    Level, Policy, PolicyError, ServiceConfig, ServiceError, ServiceStats, Ticket, TicketError,
    Timing, DEFAULT_CMAX,
};

use crate::Node;

/// A transaction service on a node. Dropping it lets every submitted transaction end, then
/// stops its workers.
pub struct TxService {
    node: Node,
    service: atomos_sched::TxService,
    base: Arc<TxOptions>,
}

impl TxService {
    /// Starts a service on `node` with `config` (its workers, levels, context pool and
    /// policy). Transactions run with the node's default options, at the contention priority
    /// of their level.
    pub fn start(node: &Node, config: ServiceConfig) -> Result<TxService, ServiceError> {
        Ok(TxService {
            base: Arc::new(node.engine().config().default_options.clone()),
            node: node.clone(),
            service: atomos_sched::TxService::start(config)?,
        })
    }

    /// The node it runs transactions on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Its configuration.
    pub fn config(&self) -> &ServiceConfig {
        self.service.config()
    }

    /// Runs `f` as a transaction at priority `level` (1 lowest) on a worker; the ticket gives
    /// what [`Node::atomically`] would have returned, and when it waited, started and ended.
    /// Refused with a typed error if the level is not one of the service's or the service is
    /// closing.
    pub fn submit<R: Send + 'static>(
        &self,
        level: Level,
        f: impl FnMut(&mut Tx<'_>) -> Result<R, TxError> + Send + 'static,
    ) -> Result<Ticket<Result<R, TxError>>, ServiceError> {
        let node = self.node.clone();
        let base = self.base.clone();
        self.service.submit(level, move || {
            let opts = TxOptions {
                priority: u16::from(level),
                ..(*base).clone()
            };
            node.engine().run(&opts, f)
        })
    }

    /// Runs `f` at priority `level` on a worker, as a suspendable task: `f` may run any
    /// transactions on the node (each of their operations is a safe point). The ticket gives
    /// what `f` returned.
    pub fn spawn<R: Send + 'static>(
        &self,
        level: Level,
        f: impl FnOnce(&Node) -> R + Send + 'static,
    ) -> Result<Ticket<R>, ServiceError> {
        let node = self.node.clone();
        self.service.submit(level, move || f(&node))
    }

    /// Invokes the registered procedure `name` with encoded `arguments` at priority `level`
    /// (the request of a remote client); the ticket gives its encoded result.
    pub fn submit_procedure(
        &self,
        level: Level,
        name: &str,
        arguments: Vec<u8>,
    ) -> Result<Ticket<Result<Vec<u8>, TxError>>, ServiceError> {
        let node = self.node.clone();
        let name = name.to_string();
        self.service
            .submit(level, move || node.invoke_encoded(&name, &arguments))
    }

    /// What the service did so far.
    pub fn stats(&self) -> ServiceStats {
        self.service.stats()
    }

    /// Requests waiting (not started, or preempted).
    pub fn waiting(&self) -> usize {
        self.service.waiting()
    }
}
