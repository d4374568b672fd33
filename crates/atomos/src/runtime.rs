//! The node as a running member of a cluster: its engine, its transport, the request layer,
//! and the services every node runs whatever its protocol (answering pings, probing peers).
//!
//! [`NodeRuntime::start_tcp`] runs a node from its [`NodeSettings`] over TCP (what `atomos node`
//! does); [`Cluster::in_process`](crate::Cluster::in_process) runs several over in-memory links.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use atomos_net::handshake::Identity;
use atomos_net::keys::KeyPair;
use atomos_net::roster::Roster;
use atomos_net::rpc::{Envelope, Inbound, Rpc, RpcError};
use atomos_net::tcp::{TcpConfig, TcpTransport};
use atomos_net::transport::{Deliver, NodeId, Transport};
use atomos_order::{MemberChange, OrderMsg, RegisterOp, ReplicaConfig};
use parking_lot::Mutex;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::info;

mod hosting;
mod plan;
mod protocols;
mod services;

pub use plan::ProtocolPlan;

pub use crate::answer::DEFAULT_ANSWER_POLL;
use crate::client_service::{ClientLimits, ClientService};
pub use crate::client_service::{DEFAULT_CLIENT_REQUESTS_MAX, DEFAULT_CLIENT_REQUEST_TIMEOUT};
use crate::config::NodeSettings;
use crate::health::Health;
use crate::membership::Operators;
use crate::node::{Node, NodeConfig};
use crate::ordering::{LoadHooks, MemberChanger, MembershipError, OrderNode, OrderNodeConfig};
use crate::oss::OssDriver;
use crate::service::{ServiceConfig, TxService};
use crate::tfa::TfaDriver;
use crate::trust::{roster_of, KeysReloaded, ReloadError};
pub use crate::wire::NodeMsg;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The node's identity is unusable (empty cluster name).
    #[error("node identity: {0}")]
    Identity(#[from] atomos_net::handshake::IdentityError),
    /// No key pair could be made for a node without one.
    #[error("cannot make a key pair: {0}")]
    Key(String),
    /// The listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The order-layer replica could not start.
    #[error("order layer: {0}")]
    Order(#[from] crate::ordering::OrderNodeError),
    /// The TFA protocol could not start.
    #[error("tfa: {0}")]
    Tfa(String),
    /// The certify protocol could not start.
    #[error("certify: {0}")]
    Certify(String),
    /// A hosted protocol (TFA, oss) could not start: its log could not be opened or read, or
    /// the machine could not be built from it.
    #[error("{name}: {why}")]
    Protocol {
        /// The protocol.
        name: &'static str,
        /// Why.
        why: String,
    },
    /// The transaction service could not start.
    #[error("transaction service: {0}")]
    Service(String),
    /// The data directory is unusable.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
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

/// A running node. Dropping it (or [`NodeRuntime::shutdown`]) stops its services and closes its
/// connections.
pub struct NodeRuntime {
    id: NodeId,
    node: Node,
    rpc: Rpc<NodeMsg>,
    peers: Arc<Mutex<BTreeMap<NodeId, PeerState>>>,
    order: Option<OrderNode>,
    order_inbox: Arc<OnceLock<Arc<dyn Deliver<OrderMsg>>>>,
    tfa: OnceLock<Arc<TfaDriver>>,
    oss: OnceLock<Arc<OssDriver>>,
    /// The transaction service clients' prioritized requests run on, once started.
    service: Arc<OnceLock<Arc<TxService>>>,
    health: Arc<Health>,
    stop: CancellationToken,
    /// How long an application thread waiting for TFA's answer polls before it sleeps.
    answer_poll: Duration,
    /// Whether the hot-spot metrics name their objects' keys (see `crate::hot_spots`).
    hot_spot_keys: Arc<AtomicBool>,
    /// How many client requests are served at once, and for how long each.
    client_limits: Arc<ClientLimits>,
    /// Which keys the TCP transport admits (none for other transports).
    pub(crate) roster: Option<Arc<Roster>>,
    /// The TCP transport, which follows the members the order replica applies (none for
    /// other transports).
    tcp: Option<Arc<TcpTransport<Envelope<NodeMsg>>>>,
    /// Which clients may change the membership.
    operators: Arc<Operators>,
    /// Where clients' membership changes go, once the order replica started.
    pub(crate) changer: Arc<OnceLock<MemberChanger>>,
    /// What backups are taken through, once the node's order replica started.
    pub(crate) backup_source: Arc<OnceLock<crate::backups::BackupSource>>,
}

impl NodeRuntime {
    /// Starts a node over TCP as its settings say. Must be called inside a tokio runtime.
    pub async fn start_tcp(settings: &NodeSettings) -> Result<NodeRuntime, RuntimeError> {
        NodeRuntime::start_tcp_with(settings, atomos_core::Procedures::new()).await
    }

    /// Like [`NodeRuntime::start_tcp`], for a node whose procedures are those of `procedures`
    /// (registered before the protocol starts: under `active` the store runs them as soon as
    /// it replays its log).
    pub async fn start_tcp_with(
        settings: &NodeSettings,
        procedures: atomos_core::Procedures,
    ) -> Result<NodeRuntime, RuntimeError> {
        // Without peers nobody needs the secret or this node's key: random ones keep the port
        // closed to all but the clients listed.
        let secret = match &settings.secret {
            Some(s) => s.expose().to_vec(),
            None => rand::random::<[u8; 32]>().to_vec(),
        };
        let key = match &settings.key {
            Some(key) => key.clone(),
            None => KeyPair::generate().map_err(|e| RuntimeError::Key(e.to_string()))?,
        };
        let identity = Identity::member(settings.cluster.clone(), settings.node_id, secret, key)?
            .speaking_up_to(settings.wire_version)?;
        let roster = Arc::new(roster_of(settings));
        let members = settings.peers.iter().map(|p| (p.id, p.address)).collect();
        let mut cfg = TcpConfig::new(identity, members, roster.clone());
        cfg.max_frame = settings.max_frame_bytes;
        cfg.busy_poll = settings.busy_poll;
        let (rpc, inbox) = Rpc::new();
        let transport = TcpTransport::bind(cfg, settings.listen, rpc.deliverer())
            .await
            .map_err(|source| RuntimeError::Listen {
                addr: settings.listen,
                source,
            })?;
        let node = Node::with_procedures(
            NodeConfig {
                protocol: settings.protocol,
                contention: settings.contention,
                ..NodeConfig::default()
            },
            procedures,
        );
        info!(
            node = settings.node_id,
            cluster = %settings.cluster,
            listen = %transport.local_addr(),
            protocol = %settings.protocol,
            peers = settings.peers.len(),
            "node started"
        );
        let transport = Arc::new(transport);
        let mut runtime = NodeRuntime::start(settings.node_id, node, rpc, transport.clone(), inbox);
        runtime
            .operators
            .set_names(settings.operators.iter().cloned());
        let (names, keys) = (Arc::downgrade(&transport), roster.clone());
        runtime.operators.set_who(Arc::new(move |client| {
            let key = names.upgrade()?.client_key(client)?;
            keys.client_name(&key)
        }));
        tokio::spawn(crate::node_metrics::publish_connections(
            settings.node_id,
            Arc::downgrade(&transport),
            runtime.stop.clone(),
        ));
        runtime.roster = Some(roster);
        runtime.tcp = Some(transport);
        runtime.set_answer_poll(settings.answer_poll);
        runtime.show_hot_spot_keys(settings.metrics_hot_spot_keys);
        runtime.set_client_limits(
            settings.client_requests_max,
            settings.client_request_timeout,
        );
        if settings.order {
            runtime.start_order(order_config(settings)?)?;
        }
        runtime.start_protocol(plan_of(settings))?;
        if let Some(policy) = settings.sched {
            runtime.start_service(ServiceConfig {
                workers: settings.sched_workers,
                policy,
                ..ServiceConfig::default()
            })?;
        }
        Ok(runtime)
    }

    /// Runs `tick` every `period` until the node stops; a panic in it (a protocol machine
    /// stepped there) stops the node, reported as `name`'s.
    pub(crate) fn every(
        &self,
        name: &str,
        period: Duration,
        mut tick: impl FnMut() + Send + 'static,
    ) {
        let stop = self.stop.clone();
        self.health.supervise(name.into(), async move {
            let mut timer = tokio::time::interval(period);
            timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok::<(), String>(()),
                    _ = timer.tick() => tick(),
                }
            }
        });
    }

    /// Admits the clients and the members' keys of `settings` from now on, closing the
    /// connections of keys no longer listed. Under `tfa`, `oss` and `local` the members must be
    /// those the node started with; under `certify` and `active` the log decides who is a
    /// member, and the keys of the members both know are reloaded.
    pub fn reload_keys(&self, settings: &NodeSettings) -> Result<KeysReloaded, ReloadError> {
        let roster = self.roster.as_ref().ok_or(ReloadError::NoRoster)?;
        let follows_log = self.order.is_some() && self.node.protocol().is_ordered();
        crate::trust::reload(roster, settings, follows_log)
    }

    /// The OSS driver, if this node runs `oss`.
    pub fn oss(&self) -> Option<&Arc<OssDriver>> {
        self.oss.get()
    }

    /// The TFA driver, if this node runs TFA.
    pub fn tfa(&self) -> Option<&Arc<TfaDriver>> {
        self.tfa.get()
    }

    /// Whether the node's protocol components are alive; the first failure, if one failed.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The order-layer replica, if this node runs one.
    pub fn order(&self) -> Option<&OrderNode> {
        self.order.as_ref()
    }

    /// Asks this node's order replica to propose `change` of the members (it must lead):
    /// the position it was proposed at, or why not. See [`OrderNode::change_membership`].
    pub async fn change_membership(&self, change: MemberChange) -> Result<u64, MembershipError> {
        match &self.order {
            Some(order) if self.node.protocol().is_ordered() => {
                order.change_membership(change).await
            }
            _ => Err(MembershipError::NotReplicated(
                self.node.protocol().to_string(),
            )),
        }
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
        let order_inbox = Arc::new(OnceLock::new());
        let service = Arc::new(OnceLock::new());
        let client_limits = Arc::new(ClientLimits::new());
        let operators = Arc::new(Operators::default());
        let changer = Arc::new(OnceLock::new());
        let backup_source = Arc::new(OnceLock::new());
        let health = Health::new();
        let clients = ClientService {
            id,
            node: node.clone(),
            health: health.clone(),
            rpc: rpc.clone(),
            service: service.clone(),
            limits: client_limits.clone(),
            operators: operators.clone(),
            changer: changer.clone(),
            backup_source: backup_source.clone(),
            kept_backups: Arc::default(),
        };
        tokio::spawn(services::serve(
            id,
            inbox,
            clients,
            order_inbox.clone(),
            stop.clone(),
        ));
        tokio::spawn(services::probe(
            id,
            rpc.clone(),
            peers.clone(),
            stop.clone(),
        ));
        tokio::spawn(crate::node_metrics::publish(id, node.clone(), stop.clone()));
        let hot_spot_keys = Arc::new(AtomicBool::new(false));
        tokio::spawn(crate::hot_spots::publish(
            id,
            node.clone(),
            hot_spot_keys.clone(),
            stop.clone(),
        ));
        NodeRuntime {
            id,
            node,
            rpc,
            peers,
            order: None,
            order_inbox,
            tfa: OnceLock::new(),
            oss: OnceLock::new(),
            service,
            health,
            stop,
            answer_poll: DEFAULT_ANSWER_POLL,
            hot_spot_keys,
            client_limits,
            roster: None,
            tcp: None,
            operators,
            changer,
            backup_source,
        }
    }

    /// How long an application thread waiting for the TFA machine's answer polls for it,
    /// yielding its core between looks, before it sleeps (zero: it sleeps at once). Applies if
    /// called before TFA starts; the default is [`DEFAULT_ANSWER_POLL`]. (`oss` commits, about a
    /// millisecond each, never poll: polling took the CPU the protocol needs.)
    pub fn set_answer_poll(&mut self, poll: Duration) {
        self.answer_poll = poll;
    }

    /// Serves at most `max` client queries and as many submissions at once (1 to 65,536; each
    /// holds a thread until it is answered; one more is refused with `Busy` at once, never
    /// queued). A query runs with `timeout` as its transaction timeout (it fails when that
    /// passes) and a submission waits that long for its outcome (then it is answered as of
    /// unknown outcome: it may still run). Requests started before a call keep the limits
    /// they started under. Defaults: [`DEFAULT_CLIENT_REQUESTS_MAX`] and
    /// [`DEFAULT_CLIENT_REQUEST_TIMEOUT`].
    pub fn set_client_limits(&self, max: usize, timeout: Duration) {
        self.client_limits.set(max, timeout);
    }

    /// Whether this node's hot-spot metrics name their objects' keys (application data; off
    /// by default, when the series carry ranks only). Takes effect at the next publication.
    pub fn show_hot_spot_keys(&self, show: bool) {
        self.hot_spot_keys.store(show, Ordering::Relaxed);
    }

    /// Starts a transaction service on this node (once): clients' [`NodeMsg::Submit`]
    /// requests run on it at their priority, and applications may submit to it too.
    pub fn start_service(&self, config: ServiceConfig) -> Result<Arc<TxService>, RuntimeError> {
        if self.service.get().is_some() {
            return Err(RuntimeError::Service(
                "a transaction service already runs on this node".into(),
            ));
        }
        let service = Arc::new(
            TxService::start(&self.node, config)
                .map_err(|e| RuntimeError::Service(e.to_string()))?,
        );
        self.service
            .set(service.clone())
            .map_err(|_| RuntimeError::Service("started twice".into()))?;
        Ok(service)
    }

    /// The node's transaction service, if one was started.
    pub fn service(&self) -> Option<&Arc<TxService>> {
        self.service.get()
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
        services::ping(&self.rpc, peer, limit).await
    }

    /// Stops the services and closes every connection.
    pub fn shutdown(&self) {
        self.stop.cancel();
        if let Some(o) = &self.order {
            o.shutdown();
        }
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

/// How the node's protocol runs, from its settings: among its peers and itself, its log in
/// `data_dir`.
fn plan_of(settings: &NodeSettings) -> ProtocolPlan {
    let mut members: Vec<NodeId> = settings.peers.iter().map(|p| p.id).collect();
    members.push(settings.node_id);
    let mut plan = ProtocolPlan::new(members);
    plan.log = Some((settings.data_dir.clone(), settings.order_fsync));
    plan.rejoin = settings.order_rejoin;
    plan.join = settings.order_join;
    plan.certify.commit_limit = settings.commit_limit;
    plan.snapshot_every = settings.order_snapshot_every;
    plan.snapshot_chunk_bytes = snapshot_chunk_bytes(settings);
    plan.oss_commit = settings.oss_commit;
    plan.oss_domains = settings.oss_domains.clone();
    plan.oss_history_max = settings.oss_history_max;
    plan.oss_compact_after = settings.oss_compact_after;
    plan
}

/// Snapshot chunks fit a frame with room to spare: a quarter of `max_frame_bytes`, at most
/// 1 MiB (smaller chunks pace a transfer more evenly beside the other traffic).
fn snapshot_chunk_bytes(settings: &NodeSettings) -> usize {
    (settings.max_frame_bytes / 4).clamp(1, 1 << 20)
}

/// The order replica's settings from the node's: every member is a replica; the log is
/// `data_dir/order.wal`; generated load appends unique values to the register `load` and
/// records each answered one (8 bytes, big-endian) in `data_dir/acked.log`.
fn order_config(settings: &NodeSettings) -> Result<OrderNodeConfig, RuntimeError> {
    let data_err = |source| RuntimeError::DataDir {
        path: settings.data_dir.clone(),
        source,
    };
    std::fs::create_dir_all(&settings.data_dir).map_err(data_err)?;
    let mut members: Vec<u64> = settings.peers.iter().map(|p| p.id).collect();
    members.push(settings.node_id);
    members.sort_unstable();
    let mut replica = ReplicaConfig::new(settings.node_id, members);
    replica.seed = rand::random();
    replica.snapshot_every = settings.order_snapshot_every;
    replica.snapshot_chunk_bytes = snapshot_chunk_bytes(settings);
    replica.rejoin = settings.order_rejoin;
    let mut cfg = OrderNodeConfig::new(replica);
    cfg.wal = Some((settings.data_dir.join("order.wal"), settings.order_fsync));
    cfg.load_clients = settings.order_load_clients;
    if settings.order_load_clients > 0 && settings.order {
        let acked = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(settings.data_dir.join("acked.log"))
            .map_err(data_err)?;
        let acked = Mutex::new(acked);
        // Unique across restarts: the node id, a random incarnation, a counter.
        let prefix = (settings.node_id << 48) | ((rand::random::<u64>() & 0xFFFF) << 32);
        cfg.load_hooks = Some(LoadHooks {
            payload: Arc::new(move |n| {
                RegisterOp::Append {
                    key: "load".into(),
                    value: (prefix | (n & 0xFFFF_FFFF)).to_be_bytes().to_vec(),
                }
                .encode()
            }),
            answered: Arc::new(move |payload| {
                if let Ok(RegisterOp::Append { value, .. }) =
                    postcard::from_bytes::<RegisterOp>(payload)
                {
                    let _ = acked.lock().write_all(&value);
                }
            }),
        });
    }
    Ok(cfg)
}
