//! The nodes a workload runs on: one local node, or a cluster of nodes in this process linked
//! in memory or over TCP on loopback, each with its own runtime services.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use atomos::disk::FsyncPolicy;
use atomos::net::memory::MemoryNetwork;
use atomos::net::rpc::{Envelope, Rpc};
use atomos::net::tcp::{TcpConfig, TcpTransport};
use atomos::net::transport::{LinkRule, Transport};
use atomos::{ContentionPolicy, Node, NodeConfig, NodeMsg, NodeRuntime, Protocol, ProtocolPlan};
use tokio::net::TcpListener;

/// How the benchmarked nodes are linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// In-memory links (no serialization cost beyond the protocol's own encoding).
    #[default]
    Memory,
    /// TCP connections on loopback, with the handshake and framing of real nodes.
    Tcp,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Memory => "memory",
            TransportKind::Tcp => "tcp",
        })
    }
}

impl FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "memory" => Ok(TransportKind::Memory),
            "tcp" => Ok(TransportKind::Tcp),
            other => Err(format!("unknown transport {other:?} (known: memory, tcp)")),
        }
    }
}

/// The benchmarked nodes. Dropping it stops them.
pub struct BenchNodes {
    nodes: Vec<Node>,
    // Kept alive for the nodes' services; dropped after them.
    members: Vec<NodeRuntime>,
    runtime: Option<tokio::runtime::Runtime>,
    /// `certify`: the replicas' logs, removed when the nodes stop.
    wal_dir: Option<std::path::PathBuf>,
}

/// Numbers the temporary log directories of this process's benchmarked clusters.
static NEXT_WAL_DIR: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The cluster's temporary log directory, made at its first use.
fn wal_dir_of(wal_dir: &mut Option<std::path::PathBuf>) -> Result<std::path::PathBuf, String> {
    let dir = wal_dir.get_or_insert_with(|| {
        std::env::temp_dir().join(format!(
            "atomos-bench-{}-{}",
            std::process::id(),
            NEXT_WAL_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    });
    std::fs::create_dir_all(&*dir).map_err(|e| e.to_string())?;
    Ok(dir.clone())
}

/// The cluster a benchmark runs on.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The protocol every node runs.
    pub protocol: Protocol,
    /// How many nodes (`Protocol::Local`: one, whatever this says).
    pub nodes: usize,
    /// How the nodes are linked.
    pub transport: TransportKind,
    /// Every link waits this long before sending.
    pub link_delay: Duration,
    /// The engines' contention manager.
    pub contention: ContentionPolicy,
    /// When replicated logs are fsynced.
    pub fsync: FsyncPolicy,
    /// `oss`: how commits are numbered.
    pub oss_commit: atomos::protocols::oss::CommitMode,
    /// `tfa`: how long a waiting application thread polls for an answer.
    pub answer_poll: Duration,
    /// TCP: how long a transport keeps a runtime worker awake after activity.
    pub busy_poll: Duration,
    /// Worker threads of the runtime the nodes' networking runs on (one runtime per process).
    pub runtime_threads: usize,
}

impl BenchNodes {
    /// Starts the nodes `spec` describes. `Protocol::Local` gives one node and no links.
    pub fn start(spec: &ClusterSpec) -> Result<BenchNodes, String> {
        let (protocol, nodes, transport) = (spec.protocol, spec.nodes, spec.transport);
        let config = node_config(spec);
        if protocol == Protocol::Local {
            return Ok(BenchNodes {
                nodes: vec![Node::new(config)],
                members: Vec::new(),
                runtime: None,
                wal_dir: None,
            });
        }
        let runtime = crate::network_runtime(spec.runtime_threads)?;
        let ids: Vec<u64> = (1..=nodes as u64).collect();
        let mut members = runtime.block_on(async {
            match transport {
                TransportKind::Memory => {
                    let network = MemoryNetwork::<Envelope<NodeMsg>>::new();
                    Ok(ids
                        .iter()
                        .map(|&id| {
                            let (rpc, inbox) = Rpc::new();
                            let t = network.join(id, rpc.deliverer());
                            NodeRuntime::start(id, Node::new(config.clone()), rpc, t, inbox)
                        })
                        .collect::<Vec<_>>())
                }
                TransportKind::Tcp => tcp_members(&ids, &config, spec.busy_poll).await,
            }
        })?;
        let _guard = runtime.enter();
        let mut wal_dir: Option<std::path::PathBuf> = None;
        for m in &mut members {
            start_protocol(m, spec, &ids, &mut wal_dir)?;
        }
        Ok(BenchNodes {
            nodes: members.iter().map(|m| m.node().clone()).collect(),
            members,
            runtime: Some(runtime),
            wal_dir,
        })
    }

    /// Starts member `id` alone, of a cluster whose members listen at `addrs` (its own
    /// included): the others run in other processes. It listens on `listener`, bound to its
    /// own address, and returns once it reaches every other member (or fails after 30 s).
    pub fn member(
        spec: &ClusterSpec,
        id: u64,
        listener: std::net::TcpListener,
        addrs: &[(u64, SocketAddr)],
    ) -> Result<BenchNodes, String> {
        let config = node_config(spec);
        let runtime = crate::network_runtime(spec.runtime_threads)?;
        let ids: Vec<u64> = addrs.iter().map(|&(id, _)| id).collect();
        let mut member = runtime.block_on(async {
            listener
                .set_nonblocking(true)
                .map_err(|e| format!("cannot listen: {e}"))?;
            let listener =
                TcpListener::from_std(listener).map_err(|e| format!("cannot listen: {e}"))?;
            let member = tcp_member(id, listener, addrs, &config, spec.busy_poll)?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            reach_all(&member, &ids, deadline).await?;
            Ok::<_, String>(member)
        })?;
        let _guard = runtime.enter();
        let mut wal_dir = None;
        start_protocol(&mut member, spec, &ids, &mut wal_dir)?;
        Ok(BenchNodes {
            nodes: vec![member.node().clone()],
            members: vec![member],
            runtime: Some(runtime),
            wal_dir,
        })
    }

    /// The nodes, in id order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Waits until every node has applied everything committed before the call (under
    /// `certify`; elsewhere at once).
    pub fn sync(&self) -> Result<(), String> {
        for n in &self.nodes {
            n.sync().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The running members (empty for a local node).
    pub fn members(&self) -> &[NodeRuntime] {
        &self.members
    }

    /// The runtime the nodes' networking runs on (`None` for a local node).
    pub fn runtime(&self) -> Option<tokio::runtime::Handle> {
        self.runtime.as_ref().map(|rt| rt.handle().clone())
    }
}

impl Drop for BenchNodes {
    fn drop(&mut self) {
        for m in &self.members {
            m.shutdown();
        }
        self.members.clear();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        if let Some(dir) = self.wal_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The configuration of every benchmarked node.
fn node_config(spec: &ClusterSpec) -> NodeConfig {
    NodeConfig {
        protocol: spec.protocol,
        contention: spec.contention,
        // Hot spots are part of every report.
        monitor_conflicts: true,
        ..NodeConfig::default()
    }
}

async fn tcp_members(
    ids: &[u64],
    config: &NodeConfig,
    busy_poll: Duration,
) -> Result<Vec<NodeRuntime>, String> {
    let mut listeners = Vec::new();
    for _ in ids {
        listeners.push(
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|e| format!("cannot listen on loopback: {e}"))?,
        );
    }
    let addrs: Vec<(u64, SocketAddr)> = ids
        .iter()
        .zip(&listeners)
        .map(|(&id, l)| l.local_addr().map(|a| (id, a)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut members = Vec::new();
    for (&id, listener) in ids.iter().zip(listeners) {
        members.push(tcp_member(id, listener, &addrs, config, busy_poll)?);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    for m in &members {
        reach_all(m, ids, deadline).await?;
    }
    Ok(members)
}

/// Member `id`, listening on `listener`, linked over TCP to the others of `addrs`, its
/// transport busy-polling for `busy_poll` after activity.
fn tcp_member(
    id: u64,
    listener: TcpListener,
    addrs: &[(u64, SocketAddr)],
    config: &NodeConfig,
    busy_poll: Duration,
) -> Result<NodeRuntime, String> {
    let identity = crate::keys::member_identity("bench", id)?;
    let peers = addrs.iter().filter(|(p, _)| *p != id).copied().collect();
    let (rpc, inbox) = Rpc::new();
    let roster = crate::keys::roster(addrs.iter().map(|(p, _)| *p));
    let mut tcp = TcpConfig::new(identity, peers, roster);
    tcp.busy_poll = busy_poll;
    let transport: Arc<dyn Transport<Envelope<NodeMsg>>> =
        Arc::new(TcpTransport::start(tcp, listener, rpc.deliverer()).map_err(|e| e.to_string())?);
    Ok(NodeRuntime::start(
        id,
        Node::new(config.clone()),
        rpc,
        transport,
        inbox,
    ))
}

/// Waits until `m` has a connection to every other member of `ids` (fails at `deadline`).
async fn reach_all(
    m: &NodeRuntime,
    ids: &[u64],
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    for &peer in ids.iter().filter(|&&p| p != m.id()) {
        while m.ping(peer, Duration::from_millis(200)).await.is_err() {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("node {} cannot reach node {peer}", m.id()));
            }
        }
    }
    Ok(())
}

/// Starts `spec`'s protocol on member `m` of the cluster `ids` (with its link delay and answer
/// polling); its log goes to a directory of its own in `wal_dir`, made at its first use.
fn start_protocol(
    m: &mut NodeRuntime,
    spec: &ClusterSpec,
    ids: &[u64],
    wal_dir: &mut Option<std::path::PathBuf>,
) -> Result<(), String> {
    let ClusterSpec {
        protocol,
        link_delay,
        fsync,
        oss_commit,
        answer_poll,
        ..
    } = spec.clone();
    let ids = ids.to_vec();
    m.set_answer_poll(answer_poll);
    if !link_delay.is_zero() {
        if let Ok(t) = m.rpc().transport() {
            t.faults().set_all(LinkRule {
                delay: link_delay,
                ..LinkRule::default()
            });
        }
    }
    if protocol == Protocol::Local {
        return Err("protocol local runs no protocol between nodes".into());
    }
    let mut plan = ProtocolPlan::new(ids);
    let dir = wal_dir_of(wal_dir)?.join(format!("node-{}", m.id()));
    plan.log = Some((dir, fsync));
    plan.oss_commit = oss_commit;
    m.start_protocol(plan).map_err(|e| e.to_string())?;
    Ok(())
}
