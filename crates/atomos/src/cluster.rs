//! Several nodes in one process over in-memory links, for tests and demos.

use std::sync::Arc;
use std::time::Duration;

use atomos_net::memory::MemoryNetwork;
use atomos_net::rpc::{Envelope, Rpc, RpcError};
use atomos_net::transport::NodeId;

use crate::certify::CertifyOptions;
use crate::node::{Node, NodeConfig, Protocol};
use crate::ordering::MembershipError;
use crate::runtime::{NodeRuntime, ProtocolPlan};
use crate::wire::NodeMsg;
use atomos_order::MemberChange;

/// Why a cluster could not be built, or a node of it killed or restarted.
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
    /// No running node has that id.
    #[error("no running node {0}")]
    NoSuchNode(NodeId),
    /// The node runs, or is not one of the cluster's ids.
    #[error("node {0} is running, or not one of this cluster's")]
    NotStopped(NodeId),
    /// The protocol does not come back from a node's loss in process.
    #[error("{0}")]
    Unsupported(String),
    /// A membership change was not made.
    #[error("membership change: {0}")]
    Membership(#[from] MembershipError),
}

/// `n` nodes (ids 1..=n) in this process, linked by an in-memory network, driven by a runtime
/// of their own. Use it from synchronous code (a test, a demo); dropping it stops every node.
/// Under `certify` and `active` a node can be killed and restarted, as a process that loses
/// its (in-memory) log would be.
pub struct Cluster {
    members: Vec<NodeRuntime>,
    network: Arc<MemoryNetwork<Envelope<NodeMsg>>>,
    protocol: Protocol,
    options: CertifyOptions,
    n: usize,
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
        let mut cluster = Cluster {
            members: Vec::new(),
            network: MemoryNetwork::new(),
            protocol,
            options,
            n,
            runtime,
        };
        // Every node links first, then the protocols start (they reach each other at once).
        let mut members: Vec<NodeRuntime> = (1..=n as NodeId).map(|id| cluster.link(id)).collect();
        for member in &mut members {
            cluster.start_protocol(member, false, false)?;
        }
        cluster.members = members;
        Ok(cluster)
    }

    /// A node with id `id` on the cluster's network, no protocol started yet.
    fn link(&self, id: NodeId) -> NodeRuntime {
        self.runtime.block_on(async {
            let (rpc, inbox) = Rpc::new();
            let transport = self.network.join(id, rpc.deliverer());
            let node = Node::new(NodeConfig {
                protocol: self.protocol,
                ..NodeConfig::default()
            });
            NodeRuntime::start(id, node, rpc, transport, inbox)
        })
    }

    /// Starts the cluster's protocol on `member`; `rejoin` if it lost the log of an earlier
    /// start, `join` if it joins the running cluster.
    fn start_protocol(
        &self,
        member: &mut NodeRuntime,
        rejoin: bool,
        join: bool,
    ) -> Result<(), ClusterError> {
        let ids: Vec<NodeId> = (1..=self.n as NodeId).collect();
        let _guard = self.runtime.enter();
        let mut plan = ProtocolPlan::new(ids);
        plan.rejoin = rejoin;
        plan.join = join;
        plan.certify = self.options;
        let started = member.start_protocol(plan);
        started.map_err(|e| ClusterError::Protocol(e.to_string()))
    }

    /// Kills node `id` as a crash would: it stops at once, and its log (kept in memory) is
    /// gone. Application threads holding its [`Node`] get errors from it from now on.
    pub fn kill(&mut self, id: NodeId) -> Result<(), ClusterError> {
        let at = self
            .members
            .iter()
            .position(|m| m.id() == id)
            .ok_or(ClusterError::NoSuchNode(id))?;
        self.members.remove(at).shutdown();
        Ok(())
    }

    /// Starts node `id` again after [`Cluster::kill`], with an empty log: under `certify` and
    /// `active` it rejoins as a replica that lost its log (it neither votes nor campaigns
    /// until it has caught up from the others). Its [`Node`] is a new one: take it from
    /// [`Cluster::node`]. Other protocols lose what the killed node held, and are refused.
    pub fn restart(&mut self, id: NodeId) -> Result<(), ClusterError> {
        if !matches!(self.protocol, Protocol::Certify | Protocol::Active) {
            return Err(ClusterError::Unsupported(format!(
                "only certify and active bring a node back in process; {} keeps objects or \
                 ordering state only on the node that died",
                self.protocol
            )));
        }
        if id == 0 || id > self.n as NodeId || self.member(id).is_some() {
            return Err(ClusterError::NotStopped(id));
        }
        let mut member = self.link(id);
        self.start_protocol(&mut member, true, false)?;
        self.members.push(member);
        self.members.sort_by_key(|m| m.id());
        Ok(())
    }

    /// Starts node `id`, new to the cluster (above its first `n` ids), as a replica that
    /// joins: it knows no members and waits until a member adds it
    /// ([`Cluster::change_membership`] with [`MemberChange::AddLearner`]), then catches up from
    /// the leader's snapshot. Only `certify` and `active` change their members; the others are
    /// refused. A joined node is not restarted by [`Cluster::restart`].
    pub fn join(&mut self, id: NodeId) -> Result<(), ClusterError> {
        if id <= self.n as NodeId || self.member(id).is_some() {
            return Err(ClusterError::NotStopped(id));
        }
        let mut member = self.link(id);
        self.start_protocol(&mut member, false, true)?;
        self.members.push(member);
        self.members.sort_by_key(|m| m.id());
        Ok(())
    }

    /// Asks node `via` to propose `change` of the members (it must lead): the position it was
    /// proposed at. See [`crate::ordering::OrderNode::change_membership`].
    pub fn change_membership(
        &self,
        via: NodeId,
        change: MemberChange,
    ) -> Result<u64, ClusterError> {
        let member = self.member(via).ok_or(ClusterError::NoSuchNode(via))?;
        Ok(self.runtime.block_on(member.change_membership(change))?)
    }

    /// The ids of the running nodes (1..=n while none is killed).
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
