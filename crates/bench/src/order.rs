//! `atomos bench order`: the order layer on N replicas in this process, linked by TCP on
//! loopback, each with a write-ahead log on disk and closed-loop clients generating requests.
//! Optionally the leader is stopped every few seconds (its task and connections end, as if the
//! process died) and restarted from its log after half a second.
//!
//! The replicas run the register (requests of `request_bytes` appended to one key), or the
//! `active` protocol's replicated store: every request invokes a bank transfer procedure
//! between two random accounts, run speculatively at its optimistic delivery and confirmed
//! (or run again) at its final one; the report then says how many speculations were confirmed.

use atomos_seam::stable::{mix64, GOLDEN};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::disk::FsyncPolicy;
use atomos::net::tcp::{TcpConfig, TcpTransport};
use atomos::net::transport::{LinkRule, Transport};
use atomos::order::{OrderMsg, Register, ReplicaConfig};
use atomos::ordering::{LoadHooks, OrderNode, OrderNodeConfig, OrderNodeStats};
use atomos::protocols::replicated::{Entry, ReplicatedStore};
use atomos::{Engine, EngineConfig, ProcedureKind, Procedures, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

/// Settings of an order benchmark.
#[derive(Clone, Debug)]
pub struct OrderBenchConfig {
    /// Replicas.
    pub nodes: usize,
    /// Payload bytes per request.
    pub request_bytes: usize,
    /// How long to measure.
    pub duration: Duration,
    /// When the write-ahead logs are fsynced.
    pub fsync: FsyncPolicy,
    /// Stop the leader this often (and restart it half a second later).
    pub kill_leader_every: Option<Duration>,
    /// Closed-loop clients per replica.
    pub clients_per_node: usize,
    /// Requests per batch at most.
    pub batch_max: usize,
    /// Delay on every link between the replicas.
    pub link_delay: Duration,
    /// What the replicas run.
    pub machine: OrderMachine,
    /// Each replica's clients are retired after this many requests, later requests coming
    /// from new clients (0: never): load from many short-lived clients.
    pub client_requests: u64,
    /// Sample memory, logs, snapshots and bookkeeping this often (see [`crate::soak`]).
    pub sample_every: Option<Duration>,
}

/// The state machine of an order benchmark's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderMachine {
    /// The register: each request appends its payload to one key.
    Register,
    /// The `active` protocol's store: each request invokes a transfer between two of
    /// `accounts` accounts (opened at 1,000 by their first transfer).
    Active {
        /// Accounts the transfers pick from.
        accounts: u64,
    },
}

/// What `atomos bench order` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OrderReport {
    /// Always "order".
    pub workload: String,
    /// Replicas.
    pub nodes: usize,
    /// Payload bytes per request.
    pub request_bytes: usize,
    /// Seconds measured.
    pub duration_s: f64,
    /// The fsync policy.
    pub fsync: String,
    /// Closed-loop clients per replica.
    pub clients_per_node: usize,
    /// Requests finally delivered and answered, per second.
    pub ordered_per_s: f64,
    /// Entries optimistically delivered, summed over replicas.
    pub opt_delivered: u64,
    /// Optimistic deliveries revoked, summed over replicas.
    pub revoked: u64,
    /// `revoked / opt_delivered`.
    pub revoked_ratio: f64,
    /// Delay set on every link, in milliseconds.
    pub link_delay_ms: f64,
    /// Leader stops performed.
    pub leader_kills: u64,
    /// The highest Raft term at the end (1 + elections after the first).
    pub max_term: u64,
    /// Optimistic-to-final delay in microseconds: the median over replicas of each one's p50
    /// and p99.
    pub opt_to_final_us: Percentiles,
    /// "register" or "active".
    #[serde(default)]
    pub machine: String,
    /// Under `active`, summed over replicas: invocations run speculatively.
    #[serde(default)]
    pub speculated: u64,
    /// Under `active`: finally delivered invocations whose speculative run was committed.
    #[serde(default)]
    pub confirmed: u64,
    /// Under `active`: finally delivered invocations run again (their speculation was
    /// invalidated or revoked, or never happened: a log replayed after a restart is run so).
    #[serde(default)]
    pub rerun: u64,
    /// `confirmed / (confirmed + rerun)`.
    #[serde(default)]
    pub confirmed_ratio: f64,
    /// Requests per client before it is retired (0: never).
    #[serde(default)]
    pub client_requests: u64,
    /// Samples taken every `--sample-every` seconds (none without it).
    #[serde(default)]
    pub samples: Vec<crate::soak::SoakSample>,
}

/// Two percentiles.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl OrderReport {
    /// One line for people.
    pub fn summary(&self) -> String {
        let speculation = if self.machine == "active" {
            format!(
                "; {} speculated, {} confirmed, {} run again ({:.2}% confirmed)",
                self.speculated,
                self.confirmed,
                self.rerun,
                self.confirmed_ratio * 100.0
            )
        } else {
            String::new()
        };
        let samples = if self.samples.is_empty() {
            String::new()
        } else {
            let clients = match self.client_requests {
                0 => String::new(),
                k => format!(
                    "; clients retired after {k} requests (about {} clients)",
                    (self.ordered_per_s * self.duration_s) as u64 / k
                ),
            };
            format!("{clients}\n{}", crate::soak::summary(&self.samples))
        };
        format!(
            "order: {} replicas, {} B requests, fsync {}: {:.0} requests ordered/s; {} opt-delivered, {} revoked ({:.2}%); opt->final p50 {:.0} us, p99 {:.0} us; {} leader kills, final term {}",
            self.nodes,
            self.request_bytes,
            self.fsync,
            self.ordered_per_s,
            self.opt_delivered,
            self.revoked,
            self.revoked_ratio * 100.0,
            self.opt_to_final_us.p50,
            self.opt_to_final_us.p99,
            self.leader_kills,
            self.max_term
        ) + &speculation
            + &samples
    }
}

struct Member {
    id: u64,
    addr: SocketAddr,
    wal: PathBuf,
    node: Option<OrderNode>,
}

/// Runs the benchmark.
pub fn run(cfg: &OrderBenchConfig) -> Result<OrderReport, String> {
    if cfg.nodes == 0 || cfg.duration.is_zero() {
        return Err("--nodes and --duration must be positive".into());
    }
    if cfg.nodes > crate::harness::MAX_NODES {
        return Err(format!(
            "--nodes must be at most {} (replicas run in this process), not {}",
            crate::harness::MAX_NODES,
            cfg.nodes
        ));
    }
    crate::network_runtime(crate::DEFAULT_RUNTIME_THREADS)?.block_on(run_cluster(cfg))
}

fn node_config(cfg: &OrderBenchConfig, m: &Member, ids: &[u64]) -> OrderNodeConfig {
    let mut replica = ReplicaConfig::new(m.id, ids.to_vec());
    replica.batch_max = cfg.batch_max;
    replica.seed = rand::random();
    let mut c = OrderNodeConfig::new(replica);
    c.wal = Some((m.wal.clone(), cfg.fsync));
    c.load_clients = cfg.clients_per_node;
    c.load_request_bytes = cfg.request_bytes;
    c.client_requests_max = cfg.client_requests;
    c
}

fn start(
    cfg: &OrderBenchConfig,
    m: &Member,
    ids: &[u64],
    members: &[(u64, SocketAddr)],
    listener: TcpListener,
) -> Result<OrderNode, String> {
    let identity = crate::keys::member_identity("bench-order", m.id)?;
    let roster = crate::keys::roster(members.iter().map(|(id, _)| *id));
    let tcp = TcpConfig::new(identity, members.to_vec(), roster);
    let connect = move |deliver| {
        let t: Arc<dyn Transport<OrderMsg>> =
            Arc::new(TcpTransport::start(tcp, listener, deliver)?);
        Ok(t)
    };
    let mut node_cfg = node_config(cfg, m, ids);
    let node = match cfg.machine {
        OrderMachine::Register => OrderNode::start(node_cfg, Register::new(), connect),
        OrderMachine::Active { accounts } => {
            node_cfg.load_hooks = Some(transfer_load(accounts));
            OrderNode::start(node_cfg, active_store()?, connect)
        }
    }
    .map_err(|e| format!("cannot start replica {}: {e}", m.id))?;
    if !cfg.link_delay.is_zero() {
        node.transport().faults().set_all(LinkRule {
            delay: cfg.link_delay,
            ..LinkRule::default()
        });
    }
    Ok(node)
}

async fn run_cluster(cfg: &OrderBenchConfig) -> Result<OrderReport, String> {
    let dir = std::env::temp_dir().join(format!("atomos-bench-order-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut listeners = Vec::new();
    let mut members = Vec::new();
    for id in 1..=cfg.nodes as u64 {
        let l = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot listen on loopback: {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        members.push(Member {
            id,
            addr,
            wal: dir.join(format!("node-{id}.wal")),
            node: None,
        });
        listeners.push(l);
    }
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    let addrs: Vec<(u64, SocketAddr)> = members.iter().map(|m| (m.id, m.addr)).collect();
    for (m, l) in members.iter_mut().zip(listeners) {
        m.node = Some(start(cfg, m, &ids, &addrs, l)?);
    }

    // Warm up until some leader orders requests, then measure.
    let warm = Instant::now();
    while answered(&members) == 0 {
        if warm.elapsed() > Duration::from_secs(10) {
            return Err("no request was ordered within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut carried = Totals::default();
    let start_totals = totals(&members);
    let started = Instant::now();
    let mut kills = 0;
    let mut next_kill = cfg.kill_leader_every.map(|d| started + d);
    let mut samples = Vec::new();
    let mut next_sample = cfg.sample_every.map(|d| started + d);
    while started.elapsed() < cfg.duration {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let (Some(at), Some(every)) = (next_sample, cfg.sample_every) {
            if Instant::now() >= at {
                next_sample = Some(at + every);
                let now = totals(&members);
                samples.push(sample(
                    &members,
                    started,
                    now.answered + carried.answered - start_totals.answered,
                ));
            }
        }
        if next_kill.is_some_and(|t| Instant::now() >= t) {
            next_kill = cfg.kill_leader_every.map(|d| Instant::now() + d);
            if let Some(i) = members
                .iter()
                .position(|m| m.node.as_ref().is_some_and(|n| n.stats().leader))
            {
                let node = members[i].node.take().ok_or("no node")?;
                carried.add(&node.stats());
                let _ = node.stop().await;
                kills += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let listener = rebind(members[i].addr).await?;
                members[i].node = Some(start(cfg, &members[i], &ids, &addrs, listener)?);
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let end = totals(&members);
    let stats: Vec<OrderNodeStats> = members
        .iter()
        .filter_map(|m| m.node.as_ref().map(|n| n.stats()))
        .collect();
    for m in &mut members {
        if let Some(n) = m.node.take() {
            let _ = n.stop().await;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ordered = end.answered + carried.answered - start_totals.answered;
    let opt = end.opt + carried.opt - start_totals.opt;
    let revoked = end.revoked + carried.revoked - start_totals.revoked;
    let speculated = end.speculated + carried.speculated - start_totals.speculated;
    let confirmed = end.confirmed + carried.confirmed - start_totals.confirmed;
    let rerun = end.rerun + carried.rerun - start_totals.rerun;
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    Ok(OrderReport {
        workload: "order".into(),
        nodes: cfg.nodes,
        request_bytes: cfg.request_bytes,
        duration_s: elapsed,
        fsync: cfg.fsync.to_string(),
        clients_per_node: cfg.clients_per_node,
        ordered_per_s: ordered as f64 / elapsed,
        opt_delivered: opt,
        revoked,
        revoked_ratio: if opt == 0 {
            0.0
        } else {
            revoked as f64 / opt as f64
        },
        link_delay_ms: cfg.link_delay.as_secs_f64() * 1000.0,
        leader_kills: kills,
        max_term: stats.iter().map(|s| s.term).max().unwrap_or(0),
        opt_to_final_us: Percentiles {
            p50: median(stats.iter().map(|s| s.opt_to_final_us.0).collect()),
            p99: median(stats.iter().map(|s| s.opt_to_final_us.1).collect()),
        },
        machine: match cfg.machine {
            OrderMachine::Register => "register".into(),
            OrderMachine::Active { .. } => "active".into(),
        },
        speculated,
        confirmed,
        rerun,
        client_requests: cfg.client_requests,
        samples,
        confirmed_ratio: if confirmed + rerun == 0 {
            0.0
        } else {
            confirmed as f64 / (confirmed + rerun) as f64
        },
    })
}

/// The transfer every request of the `active` machine invokes.
const TRANSFER: &str = "order-bench.transfer";
/// An account's balance before its first transfer.
const OPENING: i64 = 1_000;

fn account(i: u64) -> TRef<i64> {
    TRef::new(format!("acct/{i}"))
}

/// Moves one unit from `from` to `to` (accounts open with [`OPENING`] at their first use).
fn transfer(tx: &mut Tx<'_>, &(from, to): &(u64, u64)) -> Result<(), TxError> {
    for (i, delta) in [(from, -1), (to, 1)] {
        let a = account(i);
        if tx.exists(&a)? {
            tx.modify(&a, |b| *b += delta)?;
        } else {
            tx.create(&a, OPENING + delta)?;
        }
    }
    Ok(())
}

/// A fresh replica's `active` store (its log, replayed at start, brings it up to date).
fn active_store() -> Result<ReplicatedStore, String> {
    let procedures = Procedures::new();
    procedures
        .register(TRANSFER, ProcedureKind::Update, transfer)
        .map_err(|e| e.to_string())?;
    let engine = Arc::new(Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    }));
    ReplicatedStore::active(engine, procedures)
}

/// Generated requests invoking [`TRANSFER`] between two accounts drawn from `n` by a hash of
/// the request's number and a per-start seed.
fn transfer_load(accounts: u64) -> LoadHooks {
    let accounts = accounts.max(2);
    let seed: u64 = rand::random();
    LoadHooks {
        payload: Arc::new(move |n| {
            // Cheap, and good enough to spread the pairs.
            let z = mix64(seed.wrapping_add(n.wrapping_mul(GOLDEN)));
            let from = z % accounts;
            let to = (from + 1 + (z >> 32) % (accounts - 1)) % accounts;
            let arguments = atomos::encode_arguments(TRANSFER, &(from, to)).unwrap_or_default();
            Entry::Invoke {
                procedure: TRANSFER.to_string(),
                arguments,
            }
            .encode()
        }),
        answered: Arc::new(|_| {}),
    }
}

async fn rebind(addr: SocketAddr) -> Result<TcpListener, String> {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return Ok(l);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("cannot listen on {addr} again"))
}

#[derive(Default)]
struct Totals {
    answered: u64,
    opt: u64,
    revoked: u64,
    speculated: u64,
    confirmed: u64,
    rerun: u64,
}

impl Totals {
    fn add(&mut self, s: &OrderNodeStats) {
        self.answered += s.load_answered;
        self.opt += s.opt_delivered;
        self.revoked += s.revoked;
        let counter = |name: &str| {
            s.machine
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, v)| *v)
        };
        self.speculated += counter("speculated");
        self.confirmed += counter("confirmed");
        self.rerun += counter("rerun");
    }
}

fn totals(members: &[Member]) -> Totals {
    let mut t = Totals::default();
    for m in members {
        if let Some(n) = &m.node {
            t.add(&n.stats());
        }
    }
    t
}

/// A sample of the cluster now, `ordered` requests into the measurement.
fn sample(members: &[Member], started: Instant, ordered: u64) -> crate::soak::SoakSample {
    let live: Vec<_> = members
        .iter()
        .filter_map(|m| m.node.as_ref().map(|n| n.stats().kept))
        .collect();
    crate::soak::SoakSample {
        at_s: started.elapsed().as_secs_f64(),
        ordered,
        rss_bytes: crate::soak::rss_bytes(),
        wal_bytes: members
            .iter()
            .filter_map(|m| std::fs::metadata(&m.wal).ok())
            .map(|md| md.len())
            .sum(),
        snapshot_bytes: live.iter().map(|k| k.snapshot_bytes).max().unwrap_or(0),
        sessions: live.iter().map(|k| k.sessions).max().unwrap_or(0),
        batches: live.iter().map(|k| k.batches).max().unwrap_or(0),
    }
}

fn answered(members: &[Member]) -> u64 {
    totals(members).answered
}
