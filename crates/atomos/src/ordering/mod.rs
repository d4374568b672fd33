//! Runs an order-layer replica ([`atomos_order::Replica`]) over a real transport with real time:
//! one task per replica feeds it ticks, messages from peers and requests from local clients,
//! carries out what it asks (sends, deliveries; disk writes on a thread of their own, with
//! whatever follows a write held back until it is durable), and measures what the layer
//! promises (optimistic deliveries, revocations, the delay from optimistic to final delivery).
//! A replica that fails (its disk, or a log that diverged) ends its task and reports to the
//! node's [`Health`].
//!
//! Applications submit requests with [`OrderNode::submit`]; each uses a client of this node
//! (a unique random client id, sequence numbers, re-sending to another replica when this one
//! does not answer). A closed-loop load generator (`load_clients`) drives benchmarks.
//!
//! This module holds the node, its configuration and its submitters; `task` holds the
//! replica's task and who waits for its answers. The replica and this node's clients run as
//! one seam machine, [`atomos_order::Endpoint`], which the simulator drives too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos_net::transport::{Deliver, NodeId, Transport};
use atomos_order::{
    decode_log, Delivery, Endpoint, EndpointConfig, MemberChange, Membership, OrderError, OrderMsg,
    Replica, ReplicaConfig, StateMachine,
};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::answer::{AnswerSlot, Replier};
use crate::disk::{Abandon, DiskError, FsyncPolicy};
use crate::driver::{open_log, LogDisk, Runner};
use crate::health::Health;
use crate::status::ReplicaStatus;

mod members;
mod refused_sends;
mod requests;
mod snapshots;
mod task;

pub use members::{MemberChanger, MembershipError, MembershipFn, MembershipHook};
pub use requests::{
    deadline_after, RequestOutcome, SubmitError, Ticket, EXPIRY_GRACE, WATCHED_MAX,
};
use requests::{Answer, Event, Reply, Watched};
pub use snapshots::Snapshotter;
use task::{run, Inbox, OrderIo, Task, Waiters};

/// Disk writes that may wait for the disk thread before the replica's task waits for it.
const DISK_QUEUE: usize = 1024;

/// Messages from the network that may wait for the replica's task; beyond that they are
/// dropped (and counted), as a lossy link would: the protocol re-sends what matters.
const NET_QUEUE: usize = 65_536;

/// Why an order node stopped, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum OrderNodeError {
    /// The replica failed (its log is unreadable, or it diverged from the committed order).
    #[error(transparent)]
    Order(#[from] OrderError),
    /// Its write-ahead log failed (a damaged record, or a write or fsync error).
    #[error(transparent)]
    Disk(#[from] DiskError),
    /// Its transport or its disk thread could not be set up.
    #[error("order node: {0}")]
    Io(#[from] std::io::Error),
}

/// Settings of one order node.
#[derive(Clone, Debug)]
pub struct OrderNodeConfig {
    /// The replica's settings (its id is the node id in the transport).
    pub replica: ReplicaConfig,
    /// Real time of one replica tick.
    pub tick: Duration,
    /// Where the write-ahead log lives and when it is fsynced; `None` keeps it in memory.
    pub wal: Option<(PathBuf, FsyncPolicy)>,
    /// Closed-loop clients generating load (each always has one request outstanding).
    pub load_clients: usize,
    /// Payload bytes of a generated request.
    pub load_request_bytes: usize,
    /// Each of the node's clients is retired after this many requests, and later ones come
    /// from new clients (0: never; see [`atomos_order::Endpoint::retire_clients_after`]).
    pub client_requests_max: u64,
    /// Ticks a client waits for an answer before re-sending to the next replica.
    pub client_resend_ticks: u64,
    /// How generated requests are made and reported (default: `load_request_bytes` of 7s,
    /// unreported).
    pub load_hooks: Option<LoadHooks>,
    /// Where the replica reports that it failed (default: a health of its own, which still
    /// logs the failure).
    pub health: Option<Arc<Health>>,
    /// Hears of every membership the replica applies (and, at start, the one its log holds),
    /// with the one before it (`None` at start): how the node's transport follows the
    /// members.
    pub on_membership: Option<MembershipHook>,
}

/// Makes the payload of generated request number n.
pub type PayloadFn = Arc<dyn Fn(u64) -> Vec<u8> + Send + Sync>;
/// Hears of a generated request (its payload) once it is answered.
pub type AnsweredFn = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// Makes the payload of the n-th generated request, and hears of each one answered.
#[derive(Clone)]
pub struct LoadHooks {
    /// The payload of generated request number n (from 0, per node start).
    pub payload: PayloadFn,
    /// Called with the payload of every generated request once it is answered.
    pub answered: AnsweredFn,
}

impl std::fmt::Debug for LoadHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadHooks")
    }
}

impl OrderNodeConfig {
    /// Defaults: 10 ms ticks; heartbeats every 3 ticks and elections after 30, so a silent
    /// leader is replaced within about half a second and a busy one is not deposed; the log in
    /// memory; no generated load; clients re-send after 400 ms.
    pub fn new(mut replica: ReplicaConfig) -> OrderNodeConfig {
        replica.heartbeat_ticks = 3;
        replica.election_ticks = 30;
        OrderNodeConfig {
            replica,
            tick: Duration::from_millis(10),
            wal: None,
            load_clients: 0,
            load_request_bytes: 64,
            client_requests_max: 0,
            client_resend_ticks: 40,
            load_hooks: None,
            health: None,
            on_membership: None,
        }
    }
}

/// What an order node measured since it started.
#[derive(Clone, Debug, Default)]
pub struct OrderNodeStats {
    /// Whether the replica is the Raft leader now.
    pub leader: bool,
    /// The replica's Raft term now (1 after the first election; each election adds one).
    pub term: u64,
    /// Entries optimistically delivered.
    pub opt_delivered: u64,
    /// Optimistic deliveries revoked.
    pub revoked: u64,
    /// Requests finally delivered.
    pub requests_delivered: u64,
    /// Generated requests answered.
    pub load_answered: u64,
    /// Microseconds from an entry's optimistic to its final delivery (p50, p99, samples).
    pub opt_to_final_us: (f64, f64, u64),
    /// Messages from the network dropped because the replica's inbox was full.
    pub inbox_dropped: u64,
    /// Messages the transport refused to send for the replica (a full backlog, an unknown
    /// peer, a message too large for a frame).
    pub sends_refused: u64,
    /// The latest refusal an operator must act on: a message too large for a frame (for
    /// example a snapshot past `max_frame_bytes`, which a lagging replica then never gets).
    pub last_refused: Option<String>,
    /// The state machine's own counters ([`StateMachine::counters`]), as of at most
    /// [`MACHINE_COUNTERS_EVERY`] ago.
    pub machine: Vec<(&'static str, u64)>,
    /// What the replica keeps, as of at most [`MACHINE_COUNTERS_EVERY`] ago.
    pub kept: Kept,
}

/// What a replica keeps that could grow with time: its latest snapshot and its bookkeeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    /// The encoded size of its latest snapshot's state.
    pub snapshot_bytes: u64,
    /// Client sessions held.
    pub sessions: u64,
    /// Delivered batches remembered (to deliver each once).
    pub batches: u64,
}

/// How many committed positions a ready replica may still have to apply (see
/// [`OrderNode::readiness`]).
pub const READY_LAG: u64 = 1_000;

/// How often a replica publishes its state machine's counters (in [`OrderNodeStats`] and as
/// metrics `atomos_replica_<name>_total`).
pub const MACHINE_COUNTERS_EVERY: Duration = Duration::from_millis(100);

/// Submits requests to an order node from any thread, blocking until the answer comes.
/// Cloneable; it does not keep the node running.
#[derive(Clone)]
pub struct Submitter {
    tx: mpsc::UnboundedSender<Event>,
    shared: Arc<Shared>,
}

impl Submitter {
    /// Orders `payload` if that happens within `limit` and returns the state machine's answer
    /// once it is finally delivered. Fails with [`SubmitError::Expired`] if it was not ordered
    /// in time (it never runs), with [`SubmitError::TimedOut`] if that is not known either
    /// [`EXPIRY_GRACE`] after the limit (ask [`Submitter::outcome`] later), or if the node
    /// stops. Blocks the calling thread, or suspends the calling fiber (do not call it from
    /// async code).
    pub fn submit_wait(&self, payload: Vec<u8>, limit: Duration) -> Result<Vec<u8>, SubmitError> {
        let now = Instant::now();
        // A limit too large for the clock waits a year.
        let wait_until = now
            .checked_add(limit.saturating_add(EXPIRY_GRACE))
            .unwrap_or(now + Duration::from_secs(365 * 86_400));
        let slot = Arc::new(AnswerSlot::default());
        self.tx
            .send(Event::Submit {
                payload,
                deadline_ms: deadline_after(limit),
                reply: Reply::Blocking(Replier::new(slot.clone())),
            })
            .map_err(|_| SubmitError::Stopped)?;
        match slot.wait_until(wait_until, Duration::ZERO) {
            Some(Some(Answer::Applied(answer))) => Ok(answer),
            Some(Some(Answer::Expired)) => Err(SubmitError::Expired(limit)),
            Some(Some(Answer::Forgotten)) => Err(SubmitError::Forgotten(limit)),
            Some(None) => Err(SubmitError::Stopped),
            None => {
                let ticket = self.shared.next_ticket.fetch_add(1, Ordering::Relaxed);
                self.shared.watched.lock().watch(ticket, slot);
                Err(SubmitError::TimedOut {
                    limit,
                    ticket: Ticket(ticket),
                })
            }
        }
    }

    /// Whether the node stopped: nothing submitted from now on is answered.
    pub fn stopped(&self) -> bool {
        self.tx.is_closed()
    }

    /// What became of the request `ticket` names (from [`SubmitError::TimedOut`]).
    pub fn outcome(&self, ticket: Ticket) -> RequestOutcome {
        self.shared.watched.lock().outcome(ticket.0)
    }
}

struct Shared {
    leader: AtomicBool,
    term: AtomicU64,
    /// The leader the replica follows or is (0: none known).
    leader_id: AtomicU64,
    /// The highest position known committed, and the last finally delivered.
    commit: AtomicU64,
    applied: AtomicU64,
    /// The replica rebuilds a lost log (it does not vote yet).
    rebuilding: AtomicBool,
    metrics: OrderMetrics,
    opt_delivered: AtomicU64,
    revoked: AtomicU64,
    requests_delivered: AtomicU64,
    kept: Mutex<Kept>,
    load_answered: AtomicU64,
    opt_to_final: Mutex<Histogram<u64>>,
    deliveries: Mutex<Option<mpsc::UnboundedSender<Delivery>>>,
    inbox_dropped: AtomicU64,
    refused: refused_sends::RefusedSends,
    machine: Mutex<Vec<(&'static str, u64)>>,
    /// Requests whose callers stopped waiting, and the number of the next such.
    watched: Mutex<Watched>,
    next_ticket: AtomicU64,
    /// The membership the replica applied last.
    membership: Mutex<Membership>,
}

impl Shared {
    /// Publishes the state machine's counters, here and as metrics.
    fn publish_machine(&self, node: u64, counters: Vec<(&'static str, u64)>) {
        for &(name, value) in &counters {
            metrics::counter!(format!("atomos_replica_{name}_total"), "node" => node.to_string())
                .absolute(value);
        }
        *self.machine.lock() = counters;
    }
}

/// The order layer's figures in the node's metrics (Prometheus when enabled).
struct OrderMetrics {
    opt_delivered: metrics::Counter,
    revoked: metrics::Counter,
    opt_to_final: metrics::Histogram,
    inbox_dropped: metrics::Counter,
}

impl OrderMetrics {
    fn new(node: u64) -> OrderMetrics {
        let labels = [("node", node.to_string())];
        OrderMetrics {
            opt_delivered: metrics::counter!("atomos_order_opt_delivered_total", &labels),
            revoked: metrics::counter!("atomos_order_revoked_total", &labels),
            opt_to_final: metrics::histogram!("atomos_order_opt_to_final_seconds", &labels),
            inbox_dropped: metrics::counter!("atomos_order_inbox_dropped_total", &labels),
        }
    }
}

/// The transport's messages go to the node's task, through a bounded inbox.
struct ToTask {
    inbox: mpsc::Sender<Event>,
    shared: Arc<Shared>,
}

impl Deliver<OrderMsg> for ToTask {
    fn message(&self, from: NodeId, msg: OrderMsg) {
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.inbox.try_send(Event::Net { from, msg })
        {
            self.shared.inbox_dropped.fetch_add(1, Ordering::Relaxed);
            self.shared.metrics.inbox_dropped.increment(1);
        }
    }
    fn link(&self, _peer: NodeId, _up: bool) {}
}

/// A running order replica. Dropping it (or [`OrderNode::stop`]) stops its task.
pub struct OrderNode {
    tx: mpsc::UnboundedSender<Event>,
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<Option<Result<(), OrderNodeError>>>>,
    transport: Arc<dyn Transport<OrderMsg>>,
    /// Stops the disk thread at once when the node stops.
    abandon: Option<Abandon>,
}

impl OrderNode {
    /// Starts replica `cfg.replica.id` with state machine `machine`; `connect` builds the
    /// transport from the receiver it must deliver to. Must be called inside a tokio runtime.
    pub fn start<S, F>(
        cfg: OrderNodeConfig,
        machine: S,
        connect: F,
    ) -> Result<OrderNode, OrderNodeError>
    where
        S: StateMachine + Send + 'static,
        F: FnOnce(Arc<dyn Deliver<OrderMsg>>) -> std::io::Result<Arc<dyn Transport<OrderMsg>>>,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let (net_tx, net_rx) = mpsc::channel(NET_QUEUE);
        let shared = Arc::new(Shared {
            leader: AtomicBool::new(false),
            leader_id: AtomicU64::new(0),
            commit: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            rebuilding: AtomicBool::new(false),
            term: AtomicU64::new(0),
            metrics: OrderMetrics::new(cfg.replica.id),
            opt_delivered: AtomicU64::new(0),
            revoked: AtomicU64::new(0),
            requests_delivered: AtomicU64::new(0),
            kept: Mutex::new(Kept::default()),
            load_answered: AtomicU64::new(0),
            opt_to_final: Mutex::new(
                Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"),
            ),
            deliveries: Mutex::new(None),
            inbox_dropped: AtomicU64::new(0),
            refused: Default::default(),
            machine: Mutex::new(Vec::new()),
            watched: Mutex::new(Watched::default()),
            next_ticket: AtomicU64::new(1),
            membership: Mutex::new(Membership::default()),
        });
        let transport = connect(Arc::new(ToTask {
            inbox: net_tx.clone(),
            shared: shared.clone(),
        }))?;
        let stop = CancellationToken::new();
        let stop_task = stop.clone();
        // A log that is never fsynced is written on the replica's task (no thread hop before
        // what follows a write goes out); any other on a disk thread of its own.
        let events = tx.clone();
        let (records, disk) = open_log(
            format!("order-disk-{}", cfg.replica.id),
            cfg.wal.as_ref(),
            DISK_QUEUE,
            true,
            move |e| {
                let _ = events.send(Event::Disk(e));
            },
        )?;
        // The records are moved into the log (a snapshot's state is not copied).
        let log = decode_log(records)?;
        let replica = Replica::open(cfg.replica.clone(), log, machine)?;
        let membership = replica.membership().clone();
        if let Some(hook) = &cfg.on_membership {
            if !membership.is_empty() {
                (hook.0)(None, &membership);
            }
        }
        *shared.membership.lock() = membership;
        let endpoint_cfg = EndpointConfig {
            // Random, so a restarted node never reuses a client id (and its sequence numbers).
            client_base: rand::random::<u64>() & !0xFFFF_FFFF,
            resend_ticks: cfg.client_resend_ticks,
            request_lifetime_ms: atomos_order::REQUEST_LIFETIME_MS,
        };
        let mut endpoint = Endpoint::new(replica, &cfg.replica.replicas, endpoint_cfg);
        endpoint.retire_clients_after(cfg.client_requests_max);
        let abandon = match &disk {
            LogDisk::Thread(worker) => Some(worker.abandoner()),
            LogDisk::Nowhere | LogDisk::Inline(_) => None,
        };
        // The replica counts its timers in ticks; the runner's clock, in milliseconds since
        // the Unix epoch, is what it stamps on the entries it proposes (the log's time).
        let unit = Duration::from_millis(1);
        let runner = Runner::on(endpoint, disk, unit, true).on_wall_clock();
        let task = Task {
            runner,
            io: OrderIo {
                me: cfg.replica.id,
                transport: transport.clone(),
                shared: shared.clone(),
                waiters: Waiters::new(&cfg),
                changes: BTreeMap::new(),
                snapshots: Vec::new(),
                on_membership: cfg.on_membership.clone(),
                opt_at: BTreeMap::new(),
                counters_due: Instant::now(),
                reported: Default::default(),
                events: tx.clone(),
            },
        };
        let health = cfg.health.clone().unwrap_or_default();
        let probe = Arc::downgrade(&shared);
        health.set_replica(Arc::new(move || match probe.upgrade() {
            Some(shared) => status(&shared),
            None => ReplicaStatus {
                not_ready: Some("the order node stopped".into()),
                ..ReplicaStatus::default()
            },
        }));
        let component = format!("order replica {}", cfg.replica.id);
        let inbox = Inbox {
            ctl: rx,
            net: net_rx,
            _net_open: net_tx,
        };
        let task = health.supervise(component, run(cfg, task, inbox, stop_task));
        Ok(OrderNode {
            tx,
            shared,
            stop,
            task: Some(task),
            transport,
            abandon,
        })
    }

    /// Orders `payload`, whenever that happens (it has no deadline), and returns the state
    /// machine's answer once it is finally delivered.
    pub async fn submit(&self, payload: Vec<u8>) -> Result<Vec<u8>, SubmitError> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Event::Submit {
                payload,
                deadline_ms: atomos_order::NO_DEADLINE,
                reply: Reply::Async(reply),
            })
            .map_err(|_| SubmitError::Stopped)?;
        match answer.await {
            Ok(Answer::Applied(response)) => Ok(response),
            Ok(Answer::Expired) => Err(SubmitError::Expired(Duration::MAX)),
            Ok(Answer::Forgotten) => Err(SubmitError::Forgotten(Duration::MAX)),
            Err(_) => Err(SubmitError::Stopped),
        }
    }

    /// Asks the replica to propose `change` (it must lead) and returns the position it was
    /// proposed at. The change has taken effect once [`OrderNode::membership`] shows it (a
    /// leader change can drop a proposal: ask again).
    pub async fn change_membership(&self, change: MemberChange) -> Result<u64, MembershipError> {
        self.changer().change(change).await
    }

    /// A handle that asks for membership changes from elsewhere (a client's request).
    pub fn changer(&self) -> MemberChanger {
        MemberChanger::new(self.tx.clone())
    }

    /// A handle that asks the replica for a snapshot covering a position (see
    /// [`Snapshotter`]).
    pub fn snapshotter(&self) -> Snapshotter {
        Snapshotter::new(self.tx.clone())
    }

    /// The membership the replica applied last (empty while a joining replica waits for its
    /// first snapshot).
    pub fn membership(&self) -> Membership {
        self.shared.membership.lock().clone()
    }

    /// A handle that submits from threads outside the async runtime.
    pub fn submitter(&self) -> Submitter {
        Submitter {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
        }
    }

    /// Every delivery from now on, in order (for tests and tools).
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<Delivery> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.shared.deliveries.lock() = Some(tx);
        rx
    }

    /// The transport (to set fault rules).
    pub fn transport(&self) -> &Arc<dyn Transport<OrderMsg>> {
        &self.transport
    }

    /// What the node measured so far.
    pub fn stats(&self) -> OrderNodeStats {
        let h = self.shared.opt_to_final.lock();
        OrderNodeStats {
            leader: self.shared.leader.load(Ordering::Relaxed),
            term: self.shared.term.load(Ordering::Relaxed),
            opt_delivered: self.shared.opt_delivered.load(Ordering::Relaxed),
            revoked: self.shared.revoked.load(Ordering::Relaxed),
            requests_delivered: self.shared.requests_delivered.load(Ordering::Relaxed),
            load_answered: self.shared.load_answered.load(Ordering::Relaxed),
            opt_to_final_us: (
                h.value_at_quantile(0.5) as f64 / 1000.0,
                h.value_at_quantile(0.99) as f64 / 1000.0,
                h.len(),
            ),
            inbox_dropped: self.shared.inbox_dropped.load(Ordering::Relaxed),
            sends_refused: self.shared.refused.count(),
            last_refused: self.shared.refused.last(),
            machine: self.shared.machine.lock().clone(),
            kept: *self.shared.kept.lock(),
        }
    }

    /// Whether the replica is ready to serve: it follows (or is) a leader, which means it hears
    /// from a majority (a leader that hears from none steps down, a follower that misses
    /// heartbeats starts an election, within about two election timeouts), it is not rebuilding
    /// a lost log, and it has finally delivered all but at most [`READY_LAG`] of the entries it
    /// knows committed. A follower knows no commit past its own log, so one whose log is still
    /// far behind the leader's (still receiving it, or waiting for a snapshot) can be ready by
    /// this measure. `Err` says why not.
    pub fn readiness(&self) -> Result<(), String> {
        readiness(&self.shared)
    }

    /// Where the replica stands now (what `atomos status` shows of it).
    pub fn status(&self) -> ReplicaStatus {
        status(&self.shared)
    }

    /// Stops the node at once, as if its process died: nothing more is sent or answered.
    pub fn shutdown(&self) {
        self.stop.cancel();
        self.transport.shutdown();
        if let Some(a) = &self.abandon {
            a.abandon();
        }
    }

    /// Stops the node like [`OrderNode::shutdown`] and waits for its task to end.
    pub async fn stop(mut self) -> Result<(), OrderNodeError> {
        self.shutdown();
        match self.task.take() {
            // A panic was reported to the node's health.
            Some(t) => t.await.ok().flatten().unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl Drop for OrderNode {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// See [`OrderNode::status`].
fn status(s: &Shared) -> ReplicaStatus {
    let leader = s.leader_id.load(Ordering::Relaxed);
    let membership = s.membership.lock().clone();
    ReplicaStatus {
        leader: (leader != 0).then_some(leader),
        term: s.term.load(Ordering::Relaxed),
        commit: s.commit.load(Ordering::Relaxed),
        applied: s.applied.load(Ordering::Relaxed),
        rebuilding: s.rebuilding.load(Ordering::Relaxed),
        sends_refused: s.refused.count(),
        last_refused: s.refused.last(),
        not_ready: readiness(s).err(),
        addresses: added(&membership, |info| info.address.to_string()),
        public_keys: added(&membership, |info| {
            info.public_keys.iter().map(|k| k.to_string()).collect()
        }),
        voters: membership.voters,
        learners: membership.learners,
        outgoing: membership.outgoing,
    }
}

/// What `what` takes from the information of each member added through the log, by id.
fn added<T>(
    membership: &atomos_order::Membership,
    what: impl Fn(&crate::membership::MemberInfo) -> T,
) -> Vec<(NodeId, T)> {
    membership
        .contexts
        .iter()
        .filter_map(|(&id, context)| {
            let info = crate::membership::MemberInfo::decode(context).ok()?;
            Some((id, what(&info)))
        })
        .collect()
}

/// See [`OrderNode::readiness`].
fn readiness(s: &Shared) -> Result<(), String> {
    if s.leader_id.load(Ordering::Relaxed) == 0 {
        return Err("no leader known: an election is running, or no majority is reachable".into());
    }
    if s.rebuilding.load(Ordering::Relaxed) {
        return Err("rebuilding a lost log from the others".into());
    }
    let (commit, applied) = (
        s.commit.load(Ordering::Relaxed),
        s.applied.load(Ordering::Relaxed),
    );
    if commit > applied + READY_LAG {
        return Err(format!(
            "catching up: {applied} of {commit} committed positions applied"
        ));
    }
    Ok(())
}
