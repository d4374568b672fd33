//! The node as a running member of a cluster: its engine, its transport, the request layer,
//! and the services every node runs whatever its protocol (answering pings, probing peers).
//!
//! [`NodeRuntime::start_tcp`] runs a node from its [`NodeSettings`] over TCP (what `atomos node`
//! does); [`Cluster::in_process`](crate::Cluster::in_process) runs several over in-memory links.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_net::handshake::Identity;
use atomos_net::rpc::{Envelope, Inbound, Rpc, RpcError};
use atomos_net::tcp::{TcpConfig, TcpTransport};
use atomos_net::transport::{NodeId, Transport};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::NodeSettings;
use crate::node::{Node, NodeConfig};

/// Messages of the node runtime itself. Protocols add their own variants as they arrive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeMsg {
    /// Asks the receiver to answer with [`NodeMsg::Pong`] carrying the same value.
    Ping(u64),
    /// The answer to a ping.
    Pong(u64),
}

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The node's identity is unusable (empty cluster name).
    #[error("node identity: {0}")]
    Identity(#[from] atomos_net::handshake::IdentityError),
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// How a node's peer looked at its latest probe.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerState {
    /// It answered, in this round-trip time.
    Answers(Duration),
    /// It did not; why.
    Silent(String),
}

/// How often every peer is pinged, and how long an answer may take.
const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_LIMIT: Duration = Duration::from_millis(1000);

/// A running node. Dropping it (or [`NodeRuntime::shutdown`]) stops its services and closes its
/// connections.
pub struct NodeRuntime {
    id: NodeId,
    node: Node,
    rpc: Rpc<NodeMsg>,
    peers: Arc<Mutex<BTreeMap<NodeId, PeerState>>>,
    stop: CancellationToken,
}

impl NodeRuntime {
    /// Starts a node over TCP as its settings say. Must be called inside a tokio runtime.
    pub async fn start_tcp(settings: &NodeSettings) -> Result<NodeRuntime, RuntimeError> {
        // Without peers nobody needs the secret; a random one keeps the port closed to all.
        let secret = match &settings.secret {
            Some(s) => s.expose().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        };
        let identity = Identity::new(settings.cluster.clone(), settings.node_id, secret)?;
        let members = settings.peers.iter().map(|p| (p.id, p.address)).collect();
        let mut cfg = TcpConfig::new(identity, members);
        cfg.max_frame = settings.max_frame_bytes;
        let (rpc, inbox) = Rpc::new();
        let transport = TcpTransport::bind(cfg, settings.listen, rpc.deliverer())
            .await
            .map_err(|source| RuntimeError::Listen {
                addr: settings.listen,
                source,
            })?;
        let node = Node::new(NodeConfig {
            protocol: settings.protocol,
            contention: settings.contention,
            ..NodeConfig::default()
        });
        info!(
            node = settings.node_id,
            cluster = %settings.cluster,
            listen = %transport.local_addr(),
            protocol = %settings.protocol,
            peers = settings.peers.len(),
            "node started"
        );
        Ok(NodeRuntime::start(
            settings.node_id,
            node,
            rpc,
            Arc::new(transport),
            inbox,
        ))
    }

    /// Starts the services of node `id` on an already connected transport (`rpc` was built
    /// for it and `inbox` is its inbox). Must be called inside a tokio runtime.
    pub fn start(
        id: NodeId,
        node: Node,
        rpc: Rpc<NodeMsg>,
        transport: Arc<dyn Transport<Envelope<NodeMsg>>>,
        inbox: UnboundedReceiver<Inbound<NodeMsg>>,
    ) -> NodeRuntime {
        rpc.attach(transport);
        let peers = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = CancellationToken::new();
        tokio::spawn(serve(id, inbox, stop.clone()));
        tokio::spawn(probe(id, rpc.clone(), peers.clone(), stop.clone()));
        NodeRuntime {
            id,
            node,
            rpc,
            peers,
            stop,
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The node applications run transactions on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The request layer, for protocols and tools that talk to other nodes.
    pub fn rpc(&self) -> &Rpc<NodeMsg> {
        &self.rpc
    }

    /// Each peer's state at its latest probe (peers are probed every 500 ms; a peer not probed
    /// yet is absent).
    pub fn peers(&self) -> BTreeMap<NodeId, PeerState> {
        self.peers.lock().clone()
    }

    /// Pings `peer` and returns the round-trip time.
    pub async fn ping(&self, peer: NodeId, limit: Duration) -> Result<Duration, RpcError> {
        ping(&self.rpc, peer, limit).await
    }

    /// Stops the services and closes every connection.
    pub fn shutdown(&self) {
        self.stop.cancel();
        if let Ok(t) = self.rpc.transport() {
            t.shutdown();
        }
    }
}

impl Drop for NodeRuntime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn ping(rpc: &Rpc<NodeMsg>, peer: NodeId, limit: Duration) -> Result<Duration, RpcError> {
    let started = Instant::now();
    let token: u64 = rand::random();
    match rpc.request(peer, NodeMsg::Ping(token), limit).await? {
        NodeMsg::Pong(t) if t == token => Ok(started.elapsed()),
        other => {
            warn!(peer, answer = ?other, "a ping was answered with something else");
            Err(RpcError::PeerDown(peer))
        }
    }
}

/// Answers what every node answers.
async fn serve(
    id: NodeId,
    mut inbox: UnboundedReceiver<Inbound<NodeMsg>>,
    stop: CancellationToken,
) {
    loop {
        let inbound = tokio::select! {
            _ = stop.cancelled() => return,
            inbound = inbox.recv() => match inbound {
                Some(i) => i,
                None => return,
            },
        };
        match inbound {
            Inbound::Request {
                msg: NodeMsg::Ping(t),
                reply,
                ..
            } => {
                let _ = reply.send(NodeMsg::Pong(t));
            }
            Inbound::Request { from, msg, .. } | Inbound::Message { from, msg } => {
                warn!(node = id, from, ?msg, "unexpected message ignored");
            }
            Inbound::Link { .. } => {}
        }
    }
}

/// Pings every peer periodically; logs when a peer starts or stops answering.
async fn probe(
    id: NodeId,
    rpc: Rpc<NodeMsg>,
    peers: Arc<Mutex<BTreeMap<NodeId, PeerState>>>,
    stop: CancellationToken,
) {
    loop {
        // The membership as the transport knows it now (an in-memory network grows as nodes join).
        let ids = match rpc.transport() {
            Ok(t) => t.peers(),
            Err(_) => return,
        };
        for peer in ids {
            let state = tokio::select! {
                _ = stop.cancelled() => return,
                r = ping(&rpc, peer, PROBE_LIMIT) => match r {
                    Ok(rtt) => PeerState::Answers(rtt),
                    Err(e) => PeerState::Silent(e.to_string()),
                },
            };
            let before = peers.lock().insert(peer, state.clone());
            match (&before, &state) {
                (Some(PeerState::Answers(_)), PeerState::Answers(_)) => {}
                (Some(PeerState::Silent(_)), PeerState::Silent(_)) => {}
                (_, PeerState::Answers(rtt)) => {
                    info!(
                        node = id,
                        peer,
                        rtt_us = rtt.as_micros() as u64,
                        "peer answers"
                    )
                }
                (_, PeerState::Silent(why)) => {
                    warn!(node = id, peer, reason = %why, "peer does not answer")
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
    }
}
