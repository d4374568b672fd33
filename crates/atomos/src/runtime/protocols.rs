//! Starting each protocol on a running node: the order layer's replica (with the register
//! demo's state machine, or the replicated store for certify and active), TFA and oss on the
//! protocol host. `NodeRuntime::start_protocol` (`plan.rs`) picks the one the node was made for.

use std::sync::Arc;
use std::time::Duration;

use atomos_net::rpc::Rpc;
use atomos_net::transport::{FaultRules, NodeId, SendError, Transport};
use atomos_order::{OrderMsg, Register, StateMachine};
use atomos_protocols::oss::{OssConfig, OssNode};
use atomos_protocols::replicated::client::{self, StoreClient};
use atomos_protocols::replicated::ReplicatedStore;
use atomos_protocols::tfa::{TfaConfig, TfaNode};
use tracing::info;

use super::{NodeRuntime, RuntimeError};
use crate::certify::{CertifyOptions, SubmitOrderer};
use crate::disk::FsyncPolicy;
use crate::host::Host;
use crate::membership::{discover_members, transport_follows};
use crate::node::Protocol;
use crate::ordering::{OrderNode, OrderNodeConfig};
use crate::oss::{OssCertifier, OssDriver};
use crate::tfa::{TfaDriver, TfaSource};
use crate::wire::NodeMsg;

impl NodeRuntime {
    /// Starts an order-layer replica among this node and its peers, over this node's
    /// connections, with the register state machine.
    pub fn start_order(&mut self, cfg: OrderNodeConfig) -> Result<(), RuntimeError> {
        self.start_order_with(cfg, Register::new())
    }

    /// Runs the `certify` or the `active` protocol, as the node was made for: an order-layer
    /// replica among this node and its peers (`cfg.replica.replicas`, the same list on every
    /// member) whose state machine is the replicated store over this node's engine; from now
    /// on the node's update transactions commit by certification, and wait at most
    /// `commit_limit` for their verdict. Under `active` the store also runs the node's
    /// procedures, and update procedures the node invokes are ordered. The node must hold no
    /// objects yet. With `cfg.wal`, the store is recovered from that log at start.
    pub fn start_certify(
        &mut self,
        cfg: OrderNodeConfig,
        options: CertifyOptions,
    ) -> Result<(), RuntimeError> {
        let protocol = self.node.protocol();
        if !protocol.is_ordered() {
            return Err(RuntimeError::Certify(format!(
                "the node runs {protocol}, not certify or active"
            )));
        }
        if self.order.is_some() {
            return Err(RuntimeError::Certify(
                "an order replica already runs on this node".into(),
            ));
        }
        let engine = self.node.engine().clone();
        let store = match protocol {
            Protocol::Active => ReplicatedStore::active(engine, self.node.procedures().clone()),
            _ => ReplicatedStore::new(engine),
        }
        .map_err(RuntimeError::Certify)?;
        self.start_order_with(cfg, store)?;
        let submitter = match &self.order {
            Some(order) => order.submitter(),
            None => {
                return Err(RuntimeError::Certify(
                    "the order replica did not start".into(),
                ))
            }
        };
        let run = rand::random::<u64>();
        let orderer = SubmitOrderer::new(submitter.clone(), options.commit_limit);
        let sink = Arc::new(StoreClient::new(orderer, self.id, run));
        if !self.node.engine().set_certifier(sink.clone())
            || (protocol == Protocol::Active && !self.node.set_invoker(sink.clone()))
        {
            return Err(RuntimeError::Certify(
                "another protocol already runs on this node".into(),
            ));
        }
        // Abstract locks this node's earlier runs held die with them: ordered once a leader
        // takes it (each try waiting up to 5 s), on a thread of its own (the order node runs
        // on this runtime); then the store's housekeeping, until the node or its replica stops.
        let (node, stop) = (self.id, self.stop.clone());
        let release = StoreClient::new(
            SubmitOrderer::new(submitter.clone(), Duration::from_secs(5)),
            node,
            run,
        );
        std::thread::spawn(move || {
            loop {
                if stop.is_cancelled() || submitter.stopped() {
                    return;
                }
                if release.release_stale_runs().is_ok() {
                    break;
                }
            }
            crate::certify::housekeeping(&submitter, &stop, node, options);
        });
        info!(node = self.id, %protocol, "replicated store started");
        Ok(())
    }

    /// Under `certify`: orders a garbage collection now and returns how many unreachable
    /// anonymous objects it deleted (on every replica, at the same log position).
    pub fn collect(&self) -> Result<u64, RuntimeError> {
        let (Some(order), true) = (&self.order, self.node.protocol().is_ordered()) else {
            return Err(RuntimeError::Certify(
                "this node does not run certify or active".into(),
            ));
        };
        let orderer = SubmitOrderer::new(order.submitter(), crate::DEFAULT_COMMIT_LIMIT);
        client::collect(&orderer).map_err(|e| RuntimeError::Certify(format!("collection: {e}")))
    }

    /// Under `certify` and `active`: what became of a commit or update invocation of this
    /// node that failed with [`TxError::OutcomeUnknown`](atomos_core::TxError) carrying
    /// `ticket`. [`CommitOutcome::Pending`](crate::CommitOutcome::Pending) until a majority
    /// of the cluster decides it (by its deadline, the commit limit, if that has passed).
    pub fn outcome(&self, ticket: u64) -> crate::CommitOutcome {
        match (&self.order, self.node.protocol().is_ordered()) {
            (Some(order), true) => crate::certify::outcome(&order.submitter(), ticket),
            _ => crate::CommitOutcome::Unknown,
        }
    }

    /// Starts an order-layer replica with state machine `machine`.
    fn start_order_with<S: StateMachine + Send + 'static>(
        &mut self,
        mut cfg: OrderNodeConfig,
        machine: S,
    ) -> Result<(), RuntimeError> {
        cfg.health = Some(self.health.clone());
        // Only certify and active change members (an `order = true` replica beside another
        // protocol keeps the configuration's, which that protocol shares).
        let changes_members = self.node.protocol().is_ordered();
        if let (Some(tcp), true) = (&self.tcp, changes_members) {
            cfg.on_membership = Some(transport_follows(self.id, Arc::downgrade(tcp)));
        }
        let joining = changes_members && cfg.replica.replicas.is_empty();
        let link = OrderLink {
            rpc: self.rpc.clone(),
            faults: FaultRules::default(),
        };
        let inbox = self.order_inbox.clone();
        let node = OrderNode::start(cfg, machine, move |deliver| {
            let _ = inbox.set(deliver);
            let t: Arc<dyn Transport<OrderMsg>> = Arc::new(link);
            Ok(t)
        })?;
        info!(node = self.id, "order replica started");
        if let (Some(tcp), true) = (&self.tcp, joining) {
            tokio::spawn(discover_members(
                self.id,
                self.rpc.clone(),
                Arc::downgrade(tcp),
                self.health.clone(),
                self.stop.clone(),
            ));
        }
        if changes_members {
            let _ = self.changer.set(node.changer());
            let _ = self.backup_source.set(crate::backups::BackupSource {
                submitter: node.submitter(),
                snapshotter: node.snapshotter(),
            });
        }
        self.order = Some(node);
        Ok(())
    }

    /// Runs the TFA protocol among `members` (this node included; every member must be given
    /// the same list): from now on this node's transactions run under it. With `wal`, the
    /// node's home records live in that file (read back at start: see
    /// `atomos_protocols::tfa::durable`); without, a restart of this node forgets which keys
    /// elsewhere were created. Fails if the list lacks this node, TFA already runs, or the
    /// log cannot be opened or read.
    pub fn start_tfa(
        &mut self,
        members: Vec<u64>,
        cfg: TfaConfig,
        wal: Option<(std::path::PathBuf, FsyncPolicy)>,
    ) -> Result<(), RuntimeError> {
        if self.tfa.get().is_some() {
            return Err(RuntimeError::Tfa("TFA already runs on this node".into()));
        }
        let me = self.id;
        let open_members = members.clone();
        let host = self.host(wal.as_ref(), move |log| {
            let incarnation = TfaDriver::incarnation(me, log)?;
            TfaNode::open(me, open_members, incarnation, cfg, log).map_err(|e| e.to_string())
        })?;
        let driver = Arc::new(TfaDriver::new(
            host.clone(),
            Duration::from_secs(60),
            self.answer_poll,
        ));
        if self.tfa.set(driver.clone()).is_err() {
            return Err(RuntimeError::Tfa("TFA already runs on this node".into()));
        }
        if !self.node.engine().set_remote(Arc::new(TfaSource(driver))) {
            return Err(RuntimeError::Tfa(
                "another protocol already runs on this node".into(),
            ));
        }
        // Only now does it take messages and time: a node refused above runs nothing.
        self.serve_host(&host, |_| {})?;
        info!(node = self.id, members = ?members, "tfa started");
        Ok(())
    }

    /// Runs the `oss` protocol on this node among `cfg.members`, its log at `wal`; update
    /// transactions commit through it from now on, waiting at most `limit` for their answer.
    /// The node must run `oss` and hold no objects yet.
    pub fn start_oss(
        &mut self,
        cfg: OssConfig,
        wal: Option<(std::path::PathBuf, FsyncPolicy)>,
        limit: Duration,
    ) -> Result<(), RuntimeError> {
        let protocol = self.node.protocol();
        if protocol != Protocol::Oss {
            return Err(RuntimeError::Certify(format!(
                "the node runs {protocol}, not oss"
            )));
        }
        if self.oss.get().is_some() {
            return Err(RuntimeError::Certify(
                "oss already runs on this node".into(),
            ));
        }
        let members = cfg.members.clone();
        let (commit, domains) = (cfg.commit, cfg.domains.clone());
        let engine = self.node.engine().clone();
        let node = self.id.to_string();
        let mut ticks = 0u64;
        let host = self.host(wal.as_ref(), move |log| {
            OssNode::open(cfg, engine, log).map_err(|e| e.to_string())
        })?;
        let driver = Arc::new(OssDriver::new(host.clone(), limit));
        let _ = self.oss.set(driver.clone());
        if !self
            .node
            .engine()
            .set_certifier(Arc::new(OssCertifier(driver)))
        {
            return Err(RuntimeError::Certify(
                "another protocol already commits on this node".into(),
            ));
        }
        // Only now does it take messages and time: a node refused above runs nothing.
        self.serve_host(&host, move |host: &Host<OssNode>| {
            // The counters as metrics, once a second.
            ticks += 1;
            if ticks.is_multiple_of(100) {
                for (name, value) in host.with(OssNode::counters).named() {
                    metrics::counter!(format!("atomos_oss_{name}_total"), "node" => node.clone())
                        .absolute(value);
                }
            }
        })?;
        info!(
            node = self.id,
            members = ?members,
            commit = commit.name(),
            domains = ?domains,
            "oss started"
        );
        Ok(())
    }
}

/// Order-layer messages travel over the node's own connections, as one-way node messages.
struct OrderLink {
    rpc: Rpc<NodeMsg>,
    faults: FaultRules,
}

impl Transport<OrderMsg> for OrderLink {
    fn id(&self) -> NodeId {
        self.rpc.transport().map(|t| t.id()).unwrap_or(0)
    }

    fn peers(&self) -> Vec<NodeId> {
        self.rpc.transport().map(|t| t.peers()).unwrap_or_default()
    }

    fn send(&self, to: NodeId, msg: OrderMsg) -> Result<(), SendError> {
        self.rpc.send(to, NodeMsg::Order(msg))
    }

    fn faults(&self) -> &FaultRules {
        // Order messages travel on the node's connections: its rules are the ones that apply.
        match self.rpc.transport() {
            Ok(t) => t.faults(),
            Err(_) => &self.faults,
        }
    }

    fn shutdown(&self) {}
}
