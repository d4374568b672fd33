//! Several nodes in one process over in-memory links, for tests and demos.

use std::time::Duration;

use atomos_net::memory::MemoryNetwork;
use atomos_net::rpc::{Envelope, Rpc, RpcError};
use atomos_net::transport::NodeId;
use atomos_protocols::oss::OssConfig;

use crate::certify::CertifyOptions;
use crate::node::{Node, NodeConfig, Protocol};
use crate::ordering::OrderNodeConfig;
use crate::runtime::{NodeMsg, NodeRuntime};
use atomos_order::ReplicaConfig;
use atomos_protocols::tfa::TfaConfig;

/// Why a cluster could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A cluster needs at least one node.
    #[error("a cluster needs at least one node")]
    Empty,
    /// The protocol could not start on a node.
    #[error("cannot start the protocol: {0}")]
    Protocol(String),
    /// The runtime that drives the links could not start.
    #[error("cannot start the cluster's runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

/// `n` nodes (ids 1..=n) in this process, linked by an in-memory network, driven by a runtime
/// of their own. Use it from synchronous code (a test, a demo); dropping it stops every node.
pub struct Cluster {
    members: Vec<NodeRuntime>,
    runtime: tokio::runtime::Runtime,
}

impl Cluster {
    /// Starts `n` nodes running `protocol`. Under [`Protocol::Local`] each node keeps its own
    /// objects; the nodes still answer each other's requests.
    pub fn in_process(n: usize, protocol: Protocol) -> Result<Cluster, ClusterError> {
        Cluster::in_process_with(n, protocol, CertifyOptions::default())
    }

    /// [`Cluster::in_process`], with `options` for `certify` and `active` (under `oss` only
    /// its commit limit counts; ignored under the others).
    pub fn in_process_with(
        n: usize,
        protocol: Protocol,
        options: CertifyOptions,
    ) -> Result<Cluster, ClusterError> {
        if n == 0 {
            return Err(ClusterError::Empty);
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("atomos-cluster")
            .enable_all()
            .build()?;
        let network = MemoryNetwork::<Envelope<NodeMsg>>::new();
        let mut members: Vec<NodeRuntime> = runtime.block_on(async {
            (1..=n as NodeId)
                .map(|id| {
                    let (rpc, inbox) = Rpc::new();
                    let transport = network.join(id, rpc.deliverer());
                    let node = Node::new(NodeConfig {
                        protocol,
                        ..NodeConfig::default()
                    });
                    NodeRuntime::start(id, node, rpc, transport, inbox)
                })
                .collect()
        });
        let ids: Vec<NodeId> = (1..=n as NodeId).collect();
        let _guard = runtime.enter();
        for m in &mut members {
            let started = match protocol {
                Protocol::Local => Ok(()),
                Protocol::Tfa => m.start_tfa(ids.clone(), TfaConfig::default(), None),
                Protocol::Certify | Protocol::Active => {
                    let mut replica = ReplicaConfig::new(m.id(), ids.clone());
                    // Drawn anew at each start (batch numbers and election jitter).
                    replica.seed = rand::random();
                    m.start_certify(OrderNodeConfig::new(replica), options)
                }
                Protocol::Oss => {
                    let mut cfg = OssConfig::new(m.id(), ids.clone());
                    cfg.replica.seed = rand::random();
                    m.start_oss(cfg, None, options.commit_limit)
                }
            };
            started.map_err(|e| ClusterError::Protocol(e.to_string()))?;
        }
        drop(_guard);
        Ok(Cluster { members, runtime })
    }

    /// The node ids, 1..=n.
    pub fn ids(&self) -> Vec<NodeId> {
        self.members.iter().map(|m| m.id()).collect()
    }

    /// Node `id`'s running runtime, if there is such a node.
    pub fn member(&self, id: NodeId) -> Option<&NodeRuntime> {
        self.members.iter().find(|m| m.id() == id)
    }

    /// Node `id`, on which applications run transactions.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.member(id).map(|m| m.node())
    }

    /// Sends a ping from `from` to `to` and waits for the answer (at most `limit`).
    pub fn ping(&self, from: NodeId, to: NodeId, limit: Duration) -> Result<Duration, RpcError> {
        let member = self.member(from).ok_or(RpcError::Send(
            atomos_net::transport::SendError::UnknownPeer(from),
        ))?;
        self.runtime.block_on(member.ping(to, limit))
    }

    /// Runs `f` on the cluster's runtime (to use the nodes' async interfaces).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}
