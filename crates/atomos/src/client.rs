//! Remote clients (HiperTM 3.3): a program that is no member of a cluster connects to it over
//! TCP with the cluster secret and a client key pair the members admit, and invokes the
//! procedures its nodes registered.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use atomos::{Client, ClientConfig};
//! // The file `atomos cluster up` writes: cluster, secret, key file, members and their keys.
//! let cfg = atomos::config::load_client(std::path::Path::new("cluster/client.toml"))?;
//! let client = Client::connect(cfg).await?;
//! let balance: i64 = client.invoke("balance", &"alice").await?;
//! # Ok(()) }
//! ```
//!
//! - **Update procedures** (under `active`) go through the order layer: the client numbers its
//!   invocations (its id, then 1, 2, 3, ...), keeps one outstanding, sends it to its reference
//!   replica, and re-sends it to the next member when no answer came within
//!   [`ClientConfig::resend_after`]; the member it reached last stays its reference. The order
//!   layer delivers each (id, number) at most once however often it is re-sent, and answers a
//!   re-sent one that ran already with its recorded outcome: each invocation runs exactly once
//!   and its result comes back once.
//! - **Read-only procedures** run on one member from a snapshot (never ordered, never
//!   aborted); a member that does not answer in time is replaced by the next.
//! - Invocations from several tasks on one client wait their turn; a program that wants more
//!   in flight opens more clients. An invocation that got no answer within
//!   [`ClientConfig::limit`] fails with [`ClientError::OutcomeUnknown`] and stays outstanding:
//!   it may still run, and the client's next invocations wait behind it.
//! - A client's id is derived from its key and a number drawn when it connects (see
//!   `atomos_net::roster::client_id`): it cannot speak for another key's ids, and a new client
//!   (a restarted program) starts a new sequence, so exactly-once holds within one client's
//!   life.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atomos_core::{decode_result, encode_arguments, Outcome, ProcedureKind};
use atomos_net::handshake::Identity;
use atomos_net::roster::Roster;
use atomos_net::rpc::{Inbound, Rpc, RpcError};
use atomos_net::tcp::{TcpConfig, TcpTransport};
use atomos_net::transport::{NodeId, Transport};
use atomos_order::{ClientAction, ClientInput};
use atomos_protocols::replicated::{Answer, Entry};
use parking_lot::RwLock;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

use crate::wire::NodeMsg;

mod backup;
mod blocking;
mod members;
mod settings;
mod status;

pub use blocking::BlockingClient;
pub use settings::{ClientConfig, ClientError};

/// How often the client's driver counts time for re-sends.
const TICK: Duration = Duration::from_millis(10);

/// What the cluster offers, as the member that answered last described it.
#[derive(Debug, Default)]
struct Catalog {
    protocol: String,
    procedures: BTreeMap<String, ProcedureKind>,
}

/// An update invocation handed to the driver: its order-layer payload and who waits.
/// The update's payload, its deadline (see `atomos_order::Request::deadline_ms`), and who
/// waits for its answer (`None`: it expired).
type Submission = (Vec<u8>, u64, oneshot::Sender<Heard>);

/// What a client's driver heard of one update.
enum Heard {
    /// It ran: the answer.
    Done(Vec<u8>),
    /// It was not ordered before its deadline: it never runs.
    Expired,
    /// Its deadline passed and the cluster no longer knows whether it ran.
    Forgotten,
}

/// A connection to a cluster that invokes its procedures. Cheap to share (`Arc`); dropping
/// it (or [`Client::close`]) closes its connections.
pub struct Client {
    cfg: ClientConfig,
    id: NodeId,
    rpc: Rpc<NodeMsg>,
    transport: Arc<TcpTransport<atomos_net::rpc::Envelope<NodeMsg>>>,
    catalog: RwLock<Catalog>,
    submissions: mpsc::UnboundedSender<Submission>,
    /// Serializes update invocations, so each waits for its own answer in turn.
    turn: tokio::sync::Mutex<()>,
    /// The member update invocations go to now.
    reference: Arc<AtomicU64>,
    /// Members the cluster added through its log, learned from status answers: id to address.
    learned: RwLock<BTreeMap<NodeId, std::net::SocketAddr>>,
    resends: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Client {
    /// Connects to the cluster and learns its procedures from the first member that answers.
    /// Must be called inside a tokio runtime.
    pub async fn connect(cfg: ClientConfig) -> Result<Client, ClientError> {
        if cfg.members.is_empty() {
            return Err(ClientError::Config("no members to connect to".into()));
        }
        if cfg.resend_after.is_zero() || cfg.limit.is_zero() {
            return Err(ClientError::Config(
                "resend_after and limit must be longer than zero".into(),
            ));
        }
        let identity = Identity::client(cfg.cluster.clone(), cfg.secret.clone(), cfg.key.clone())
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let id = identity.node();
        let roster = Arc::new(Roster::new(cfg.member_keys.clone(), []));
        let mut tcp = TcpConfig::new(identity, cfg.members.clone(), roster);
        tcp.max_frame = cfg.max_frame;
        let (rpc, inbox) = Rpc::new();
        let transport = Arc::new(
            TcpTransport::connect(tcp, rpc.deliverer())
                .map_err(|e| ClientError::Config(e.to_string()))?,
        );
        rpc.attach(transport.clone());
        let members: Vec<NodeId> = cfg.members.iter().map(|m| m.0).collect();
        let first = match cfg.reference {
            Some(r) => members.iter().position(|&m| m == r).ok_or_else(|| {
                ClientError::Config(format!("reference {r} is not among the members"))
            })?,
            None => (rand::random::<u64>() % members.len() as u64) as usize,
        };
        let (submissions, submitted) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let client = Client {
            id,
            rpc: rpc.clone(),
            transport,
            catalog: RwLock::new(Catalog::default()),
            submissions,
            turn: tokio::sync::Mutex::new(()),
            reference: Arc::new(AtomicU64::new(members[first])),
            learned: RwLock::new(BTreeMap::new()),
            resends: Arc::new(AtomicU64::new(0)),
            stop: stop.clone(),
            cfg,
        };
        let answered = client.describe(first).await?;
        // The member that answered is the reference, unless one was asked for.
        let first = if client.cfg.reference.is_some() {
            first
        } else {
            answered
        };
        client.reference.store(members[first], Ordering::Relaxed);
        let resend_ticks = client
            .cfg
            .resend_after
            .as_millis()
            .div_ceil(TICK.as_millis()) as u64;
        // The id comes from the client's key and outlives this program: its numbers start
        // from the clock (a thousand per millisecond), above those of every earlier run.
        let first_seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| (d.as_millis() as u64).saturating_mul(1_000));
        let order_client =
            atomos_order::Client::new(id, members, first, resend_ticks).numbered_from(first_seq);
        tokio::spawn(drive(
            order_client,
            rpc,
            inbox,
            submitted,
            client.reference.clone(),
            client.resends.clone(),
            stop,
        ));
        Ok(client)
    }

    /// This client's id (the client bit set; derived from its key; unique with overwhelming
    /// probability).
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The member update invocations go to now.
    pub fn reference(&self) -> NodeId {
        self.reference.load(Ordering::Relaxed)
    }

    /// How many times an update invocation was re-sent to another member.
    pub fn resends(&self) -> u64 {
        self.resends.load(Ordering::Relaxed)
    }

    /// The protocol the cluster runs, as the member that answered last said.
    pub fn protocol(&self) -> String {
        self.catalog.read().protocol.clone()
    }

    /// Invokes procedure `name` with `args` and returns its result. An update procedure is
    /// ordered and runs exactly once on every replica (the cluster must run `active`); a
    /// read-only one runs on one member from a snapshot.
    pub async fn invoke<A, R>(&self, name: &str, args: &A) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let arguments = self.arguments(name, args)?;
        let bytes = match self.kind_of(name).await? {
            ProcedureKind::Update => self.update(name, arguments).await?,
            ProcedureKind::ReadOnly => self.query(name, arguments).await?,
        };
        decode_result(name, &bytes).map_err(|e| ClientError::from_tx(name, e))
    }

    /// `args` encoded for procedure `name`, unless the client is closed.
    fn arguments<A: Serialize + ?Sized>(
        &self,
        name: &str,
        args: &A,
    ) -> Result<Vec<u8>, ClientError> {
        if self.stop.is_cancelled() {
            return Err(ClientError::Closed);
        }
        encode_arguments(name, args).map_err(|e| ClientError::from_tx(name, e))
    }

    /// Runs procedure `name` with `args` at `priority` (1 lowest) on the transaction service
    /// of the client's reference member (see `NodeRuntime::start_service`), under every
    /// protocol but `active`. The request is sent once: if no answer comes within the
    /// client's limit it fails with [`ClientError::OutcomeUnknown`] (an update may have run).
    pub async fn submit<A, R>(&self, name: &str, args: &A, priority: u8) -> Result<R, ClientError>
    where
        A: Serialize + ?Sized,
        R: DeserializeOwned,
    {
        let arguments = self.arguments(name, args)?;
        let member = self.cfg.members[self.reference_index()].0;
        let msg = NodeMsg::Submit {
            procedure: name.to_string(),
            arguments,
            priority,
        };
        let bytes = match self.rpc.request(member, msg, self.cfg.limit).await {
            Ok(NodeMsg::SubmitAnswer(Ok(result))) => result,
            Ok(NodeMsg::SubmitAnswer(Err(refusal))) => {
                return Err(ClientError::from_refusal(name, refusal, self.cfg.limit))
            }
            Ok(other) => {
                return Err(ClientError::Refused {
                    name: name.to_string(),
                    reason: format!("member {member} answered a submission with {other:?}"),
                })
            }
            Err(_) if self.stop.is_cancelled() => return Err(ClientError::Closed),
            Err(_) => {
                return Err(ClientError::OutcomeUnknown {
                    name: name.to_string(),
                    limit: self.cfg.limit,
                })
            }
        };
        decode_result(name, &bytes).map_err(|e| ClientError::from_tx(name, e))
    }

    /// Closes the client's connections; invocations waiting fail with [`ClientError::Closed`].
    pub fn close(&self) {
        self.stop.cancel();
        self.transport.shutdown();
    }

    /// The kind of procedure `name`, asking a member again when it is not known yet (it may
    /// have been registered since).
    async fn kind_of(&self, name: &str) -> Result<ProcedureKind, ClientError> {
        if let Some(kind) = self.catalog.read().procedures.get(name) {
            return Ok(*kind);
        }
        self.describe(self.reference_index()).await?;
        self.catalog
            .read()
            .procedures
            .get(name)
            .copied()
            .ok_or_else(|| ClientError::NoSuchProcedure {
                name: name.to_string(),
            })
    }

    fn reference_index(&self) -> usize {
        let reference = self.reference();
        self.cfg
            .members
            .iter()
            .position(|m| m.0 == reference)
            .unwrap_or(0)
    }

    /// Asks the members, from `first` on, what they offer until one answers; returns its
    /// index.
    async fn describe(&self, first: usize) -> Result<usize, ClientError> {
        let deadline = Instant::now() + self.cfg.limit;
        let (answered, answer) = self
            .ask_members(first, deadline, || NodeMsg::Describe)
            .await
            .ok_or(ClientError::Unreachable(self.cfg.limit))?;
        match answer {
            NodeMsg::Catalog {
                protocol,
                procedures,
            } => {
                *self.catalog.write() = Catalog {
                    protocol,
                    procedures: procedures.into_iter().collect(),
                };
                Ok(answered)
            }
            other => Err(ClientError::Config(format!(
                "member {} answered a description with {other:?}: is it an atomos node of this \
                 version?",
                self.cfg.members[answered].0
            ))),
        }
    }

    /// Sends `msg()` to the members in turn, from `first` on, each given `resend_after`,
    /// until one answers or `deadline` passes; returns who answered and what.
    async fn ask_members(
        &self,
        first: usize,
        deadline: Instant,
        msg: impl Fn() -> NodeMsg,
    ) -> Option<(usize, NodeMsg)> {
        let n = self.cfg.members.len();
        for attempt in 0usize.. {
            let now = Instant::now();
            if now >= deadline || self.stop.is_cancelled() {
                return None;
            }
            let index = (first + attempt) % n;
            let member = self.cfg.members[index].0;
            let wait = self.cfg.resend_after.min(deadline - now);
            match self.rpc.request(member, msg(), wait).await {
                Ok(answer) => return Some((index, answer)),
                Err(RpcError::Timeout { .. }) => {}
                // Not connected (yet): wait a little before the next member.
                Err(_) => sleep(TICK.min(deadline.saturating_duration_since(Instant::now()))).await,
            }
        }
        None
    }

    /// Runs read-only procedure `name` on a member.
    async fn query(&self, name: &str, arguments: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        let deadline = Instant::now() + self.cfg.limit;
        let ask = || NodeMsg::Query {
            procedure: name.to_string(),
            arguments: arguments.clone(),
        };
        match self
            .ask_members(self.reference_index(), deadline, ask)
            .await
        {
            Some((_, NodeMsg::QueryAnswer(Ok(result)))) => Ok(result),
            Some((_, NodeMsg::QueryAnswer(Err(refusal)))) => {
                Err(ClientError::from_refusal(name, refusal, self.cfg.limit))
            }
            Some((index, other)) => Err(ClientError::Refused {
                name: name.to_string(),
                reason: format!(
                    "member {} answered a query with {other:?}",
                    self.cfg.members[index].0
                ),
            }),
            None if self.stop.is_cancelled() => Err(ClientError::Closed),
            None => Err(ClientError::OutcomeUnknown {
                name: name.to_string(),
                limit: self.cfg.limit,
            }),
        }
    }

    /// Orders update procedure `name` and waits for its outcome.
    async fn update(&self, name: &str, arguments: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        let protocol = self.protocol();
        if protocol != "active" {
            return Err(ClientError::Refused {
                name: name.to_string(),
                reason: format!(
                    "update procedures from clients need protocol active; the cluster runs \
                     {protocol}"
                ),
            });
        }
        let payload = Entry::Invoke {
            procedure: name.to_string(),
            arguments,
        }
        .encode();
        let (tx, rx) = oneshot::channel();
        let unknown = || ClientError::OutcomeUnknown {
            name: name.to_string(),
            limit: self.cfg.limit,
        };
        // Ordered by the limit or never; its expiry is heard a little after.
        let deadline_ms = crate::ordering::deadline_after(self.cfg.limit);
        let wait_until = Instant::now() + self.cfg.limit + crate::ordering::EXPIRY_GRACE;
        // Submitted in turn, so the driver's numbering matches the waiters (and a caller that
        // gave up still leaves its invocation ahead of the next).
        let response = {
            let _turn = timeout(self.cfg.limit, self.turn.lock())
                .await
                .map_err(|_| unknown())?;
            self.submissions
                .send((payload, deadline_ms, tx))
                .map_err(|_| ClientError::Closed)?;
            match tokio::time::timeout_at(wait_until, rx).await {
                Ok(Ok(Heard::Done(response))) => response,
                Ok(Ok(Heard::Expired)) => {
                    return Err(ClientError::Expired {
                        name: name.to_string(),
                        limit: self.cfg.limit,
                    })
                }
                Ok(Ok(Heard::Forgotten)) => return Err(unknown()),
                Ok(Err(_)) => return Err(ClientError::Closed),
                Err(_) => return Err(unknown()),
            }
        };
        let refused = |reason: String| ClientError::Refused {
            name: name.to_string(),
            reason,
        };
        match Answer::decode(&response) {
            Ok(Answer::Invoked {
                outcome: Outcome::Returned(result),
                ..
            }) => Ok(result),
            Ok(Answer::Invoked {
                outcome: Outcome::Failed(reason),
                ..
            }) => Err(ClientError::Failed {
                name: name.to_string(),
                reason,
            }),
            Ok(Answer::Refused { reason, .. }) => Err(refused(reason)),
            Ok(other) => Err(refused(format!("the cluster answered with {other:?}"))),
            Err(e) => Err(refused(format!("the answer does not decode: {e}"))),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}

/// The client's driver: the order layer's client state machine fed with submissions, answers
/// and ticks; its sends go out on the client's connections, its answers to the waiters.
async fn drive(
    mut client: atomos_order::Client,
    rpc: Rpc<NodeMsg>,
    mut inbox: mpsc::UnboundedReceiver<Inbound<NodeMsg>>,
    mut submitted: mpsc::UnboundedReceiver<Submission>,
    reference: Arc<AtomicU64>,
    resends: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut waiting: BTreeMap<u64, oneshot::Sender<Heard>> = BTreeMap::new();
    let mut next_seq = client.next_number();
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        let input = tokio::select! {
            _ = stop.cancelled() => return,
            submission = submitted.recv() => match submission {
                Some((payload, deadline_ms, waiter)) => {
                    // The state machine numbers submissions one after another in arrival
                    // order, from where it starts.
                    waiting.insert(next_seq, waiter);
                    next_seq += 1;
                    ClientInput::Submit { payload, deadline_ms }
                }
                None => return,
            },
            inbound = inbox.recv() => match inbound {
                Some(Inbound::Message { from, msg: NodeMsg::Order(msg) })
                    if msg.answered_client().is_some() =>
                {
                    ClientInput::Message { from, msg }
                }
                Some(_) => continue,
                None => return,
            },
            _ = ticks.tick() => ClientInput::Tick,
        };
        client.step(input, &mut out);
        for action in out.drain(..) {
            let (seq, heard) = match action {
                // A member not connected (yet) misses it; the re-send goes to the next.
                ClientAction::Send { to, msg } => {
                    drop(rpc.send(to, NodeMsg::Order(msg)));
                    continue;
                }
                ClientAction::Done { seq, response } => (seq, Heard::Done(response)),
                ClientAction::Expired { seq } => (seq, Heard::Expired),
                ClientAction::Unknown { seq } => (seq, Heard::Forgotten),
            };
            if let Some(waiter) = waiting.remove(&seq) {
                let _ = waiter.send(heard);
            }
        }
        if let Some(target) = client.target() {
            reference.store(target, Ordering::Relaxed);
        }
        resends.store(client.resends(), Ordering::Relaxed);
    }
}
