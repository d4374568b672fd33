//! What a node answers to clients (programs connected with the cluster secret, ids with the
//! client bit; see [`Client`](crate::Client)):
//!
//! - the node's protocol and procedures ([`NodeMsg::Describe`]);
//! - where the node stands: health, readiness, its replica's log ([`NodeMsg::Status`]);
//! - read-only procedures, run here from a snapshot ([`NodeMsg::Query`]);
//! - update procedures under `active`: the client's order-layer request, checked here and
//!   handed to the node's order replica, which orders it, deduplicates it by the client's id
//!   and sequence number and answers the client once it is finally delivered;
//! - procedures with a priority ([`NodeMsg::Submit`]), run on the node's transaction service
//!   (under the other protocols: their transactions run on the node that serves them);
//! - membership changes ([`NodeMsg::ChangeMembership`]), from operators only (clients whose
//!   name the members list in `operators`), proposed by the node's replica if it leads.
//!
//! Anything else a client sends is dropped and logged. A request that no member can order (the
//! cluster does not run `active`, or it is no invocation) is answered at once with
//! [`Answer::Refused`] at position 0 (it never runs); one that only this node cannot order
//! (the procedure is not registered here, the order replica has not started) is left
//! unanswered, because a copy sent to another member may still run, and the client re-sends
//! it to the next member with the same number.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atomos_core::ProcedureKind;
use atomos_net::rpc::{Reply, Rpc};
use atomos_net::transport::{is_client, Deliver, NodeId};
use atomos_order::{OrderMsg, Request};
use atomos_protocols::replicated::{Answer, Entry};
use parking_lot::RwLock;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, warn};

use crate::backups::{BackupSource, KeptBackups};
use crate::health::Health;
use crate::membership::Operators;
use crate::node::{Node, Protocol};
use crate::ordering::{MemberChanger, MembershipError};
use crate::service::TxService;
use crate::status::MemberStatus;
use crate::wire::MemberRefusal;
use crate::wire::{MemberRequest, NodeMsg, Refusal};
use atomos_order::ChangeRefused;

/// How long a member waits for the leader's answer to an operator's membership change it
/// passed on.
const PASS_ON_LIMIT: Duration = Duration::from_secs(2);

/// How many client requests a node serves at once by default (each may hold a thread).
pub const DEFAULT_CLIENT_REQUESTS_MAX: usize = 64;

/// How long a node works on a client's request by default before it answers that the
/// outcome is unknown.
pub const DEFAULT_CLIENT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What bounds a node's work for clients: requests in flight (each query or submission holds
/// a permit, and a thread, until it is answered) and how long each may take.
pub(crate) struct ClientLimits {
    /// Queries and submissions have permits of their own, so a flood of one kind (long
    /// submissions waiting for their turn) leaves the other served. New limits replace both
    /// pools; a request holding a permit of the old pool keeps it until it is answered.
    pools: RwLock<(Arc<Semaphore>, Arc<Semaphore>)>,
    /// The permits each pool had when made.
    total: AtomicUsize,
    timeout_ms: AtomicU64,
}

/// The most requests of one kind a node may allow at once.
const MAX_CLIENT_REQUESTS: usize = 1 << 16;

impl ClientLimits {
    pub(crate) fn new() -> ClientLimits {
        let limits = ClientLimits {
            pools: RwLock::new((Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)))),
            total: AtomicUsize::new(0),
            timeout_ms: AtomicU64::new(0),
        };
        limits.set(DEFAULT_CLIENT_REQUESTS_MAX, DEFAULT_CLIENT_REQUEST_TIMEOUT);
        limits
    }

    /// At most `max` queries and `max` submissions (1 to 65,536) in flight, each answered
    /// within `timeout`.
    pub(crate) fn set(&self, max: usize, timeout: Duration) {
        let max = max.clamp(1, MAX_CLIENT_REQUESTS);
        *self.pools.write() = (Arc::new(Semaphore::new(max)), Arc::new(Semaphore::new(max)));
        self.total.store(max, Ordering::Relaxed);
        self.timeout_ms.store(
            timeout.as_millis().clamp(1, u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    fn queries(&self) -> Arc<Semaphore> {
        self.pools.read().0.clone()
    }

    fn submissions(&self) -> Arc<Semaphore> {
        self.pools.read().1.clone()
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// Why a node does not order a client's request.
enum Unorderable {
    /// No member orders it (the cluster's protocol, or a request that is no invocation):
    /// answered with a refusal, which proves it never runs.
    Never(String),
    /// This node does not (the procedure is not registered here, say); another may.
    NotHere(String),
}

/// Serves clients' messages and requests on behalf of `node`.
pub(crate) struct ClientService {
    /// This node's id.
    pub(crate) id: NodeId,
    pub(crate) node: Node,
    /// Its health and its replica's state (what a status request is answered with).
    pub(crate) health: Arc<Health>,
    pub(crate) rpc: Rpc<NodeMsg>,
    /// Where prioritized requests run, once the node started a transaction service.
    pub(crate) service: Arc<std::sync::OnceLock<Arc<TxService>>>,
    pub(crate) limits: Arc<ClientLimits>,
    /// Which clients may change the membership.
    pub(crate) operators: Arc<Operators>,
    /// Where membership changes go, once the node's order replica started.
    pub(crate) changer: Arc<std::sync::OnceLock<MemberChanger>>,
    /// What backups are taken through, once the node's order replica started.
    pub(crate) backup_source: Arc<std::sync::OnceLock<BackupSource>>,
    /// The backups taken here for clients to fetch.
    pub(crate) kept_backups: Arc<KeptBackups>,
}

impl ClientService {
    /// A client's one-way message: an order-layer request under `active`, handed to `order`.
    pub(crate) fn message(
        &self,
        from: NodeId,
        msg: NodeMsg,
        order: Option<&Arc<dyn Deliver<OrderMsg>>>,
    ) {
        let NodeMsg::Order(OrderMsg::Request(req)) = msg else {
            debug!(
                client = from,
                ?msg,
                "a client's message that clients do not send: dropped"
            );
            return;
        };
        if req.client != from {
            warn!(
                client = from,
                claimed = req.client,
                "a client's request under another client's id: dropped"
            );
            return;
        }
        match (self.check_update(&req), order) {
            (Ok(()), Some(order)) => order.message(from, OrderMsg::Request(req)),
            (Ok(()), None) => self.pass(from, &req, "this node runs no order replica (yet)"),
            (Err(Unorderable::Never(reason)), _) => self.refuse(from, &req, reason),
            (Err(Unorderable::NotHere(reason)), _) => self.pass(from, &req, &reason),
        }
    }

    /// Whether `req` is an invocation of an update procedure this node would order, and if
    /// not, whether any member could.
    fn check_update(&self, req: &Request) -> Result<(), Unorderable> {
        let protocol = self.node.protocol();
        if protocol != Protocol::Active {
            return Err(Unorderable::Never(format!(
                "update procedures from clients need protocol active; this node runs {protocol}"
            )));
        }
        match Entry::decode(&req.payload) {
            Ok(Entry::Invoke { procedure, .. }) => match self.node.procedures().get(&procedure) {
                Ok(p) if p.kind() == ProcedureKind::Update => Ok(()),
                Ok(_) => Err(Unorderable::NotHere(format!(
                    "{procedure:?} is read-only here"
                ))),
                Err(e) => Err(Unorderable::NotHere(e.to_string())),
            },
            Ok(other) => Err(Unorderable::Never(format!(
                "clients may only invoke procedures, not {other:?}"
            ))),
            Err(e) => Err(Unorderable::Never(format!("the request is no entry: {e}"))),
        }
    }

    /// Leaves a request this node cannot order unanswered: another member may order it (or
    /// has ordered a copy the client sent before), so no answer here may say that it did not
    /// run. The client keeps its number and re-sends it to the next member.
    fn pass(&self, client: NodeId, req: &Request, reason: &str) {
        debug!(
            client,
            seq = req.seq,
            reason,
            "a client's invocation not ordered here: left to another member"
        );
    }

    fn busy(&self, what: &str) -> Refusal {
        Refusal::Busy(format!(
            "this node serves {} client {what} at once, and as many are in flight",
            self.limits.total()
        ))
    }

    fn refuse(&self, client: NodeId, req: &Request, reason: String) {
        debug!(client, seq = req.seq, %reason, "a client's invocation refused");
        let response = Answer::Refused {
            position: 0,
            reason,
        }
        .encode();
        let reply = OrderMsg::Reply {
            client: req.client,
            seq: req.seq,
            response,
        };
        if let Err(e) = self.rpc.send(client, NodeMsg::Order(reply)) {
            debug!(client, error = %e, "a refusal could not be sent");
        }
    }

    /// A membership change from an operator (a client the members list in `operators`), or
    /// one an operator's request reached through another member: handed to this node's
    /// replica, which proposes it if it leads. A member that does not lead passes an
    /// operator's request on to the leader it follows (once: a passed request is not passed
    /// again), so an operator reaches a leader its client file does not list. The answer says
    /// where the change was proposed, or why not.
    fn change_membership(&self, from: NodeId, request: MemberRequest, reply: Reply<NodeMsg>) {
        let from_operator = is_client(from);
        let checked = if from_operator {
            self.operators.check(from).map_err(|why| {
                debug!(client = from, %why, "a membership change refused");
                MemberRefusal::NotOperator(why)
            })
        } else {
            // Members authenticate with their own keys; one passes an operator's request on.
            Ok(())
        };
        let ready = checked
            .and_then(|()| {
                self.changer.get().cloned().ok_or_else(|| {
                    MemberRefusal::Refused(format!(
                        "this node runs {}: only certify and active clusters change their \
                         members",
                        self.node.protocol()
                    ))
                })
            })
            .and_then(|changer| {
                let change = request.to_change().map_err(MemberRefusal::Refused)?;
                Ok((changer, change))
            });
        let (changer, change) = match ready {
            Ok(ready) => ready,
            Err(refusal) => {
                let _ = reply.send(NodeMsg::MembershipChanged(Err(refusal)));
                return;
            }
        };
        let rpc = self.rpc.clone();
        tokio::spawn(async move {
            let result = match changer.change(change).await {
                Ok(at) => Ok(at),
                Err(MembershipError::Refused(ChangeRefused::NotLeader { leader: Some(l) }))
                    if from_operator =>
                {
                    let passed = NodeMsg::ChangeMembership(request);
                    match rpc.request(l, passed, PASS_ON_LIMIT).await {
                        Ok(NodeMsg::MembershipChanged(answer)) => answer,
                        _ => Err(MemberRefusal::NotLeader { leader: Some(l) }),
                    }
                }
                Err(MembershipError::Refused(ChangeRefused::NotLeader { leader })) => {
                    Err(MemberRefusal::NotLeader { leader })
                }
                Err(e) => Err(MemberRefusal::Refused(e.to_string())),
            };
            let _ = reply.send(NodeMsg::MembershipChanged(result));
        });
    }

    /// A client asks for a backup: taken off this task (the barrier waits for the cluster),
    /// and answered once it is kept here, or with why not.
    fn begin_backup(&self, reply: Reply<NodeMsg>) {
        let Some(source) = self.backup_source.get().cloned() else {
            let refusal = Refusal::Refused(format!(
                "this node runs {}: backups are taken of certify and active clusters (once \
                 the node's order replica started)",
                self.node.protocol()
            ));
            let _ = reply.send(NodeMsg::BackupReady(Err(refusal)));
            return;
        };
        let (kept, protocol, me) = (
            self.kept_backups.clone(),
            self.node.protocol().to_string(),
            self.id,
        );
        let limit = self.limits.timeout();
        tokio::spawn(async move {
            let offer = kept.take(source, protocol, me, limit).await;
            let _ = reply.send(NodeMsg::BackupReady(offer));
        });
    }

    /// A client's request: what the node offers, a read-only procedure (run on a blocking
    /// thread: it may wait for this node to catch up), or a procedure with a priority for the
    /// node's transaction service.
    pub(crate) fn request(&self, from: NodeId, msg: NodeMsg, reply: Reply<NodeMsg>) {
        match msg {
            NodeMsg::Describe => {
                let procedures = self.node.procedures();
                let catalog = procedures
                    .names()
                    .into_iter()
                    .filter_map(|name| procedures.get(&name).ok().map(|p| (name, p.kind())))
                    .collect();
                let _ = reply.send(NodeMsg::Catalog {
                    protocol: self.node.protocol().to_string(),
                    procedures: catalog,
                });
            }
            NodeMsg::Status => {
                let status = MemberStatus {
                    id: self.id,
                    protocol: self.node.protocol().to_string(),
                    failure: self.health.failure(),
                    not_ready: self.health.readiness().err(),
                    replica: self.health.replica(),
                };
                let _ = reply.send(NodeMsg::StatusReport(Box::new(status)));
            }
            NodeMsg::Query {
                procedure,
                arguments,
            } => {
                let Some(permit) = permit(self.limits.queries()) else {
                    let _ = reply.send(NodeMsg::QueryAnswer(Err(self.busy("queries"))));
                    return;
                };
                let (node, timeout) = (self.node.clone(), self.limits.timeout());
                tokio::task::spawn_blocking(move || {
                    let answer = query(&node, &procedure, &arguments, timeout);
                    let _ = reply.send(NodeMsg::QueryAnswer(answer));
                    drop(permit);
                });
            }
            NodeMsg::Submit {
                procedure,
                arguments,
                priority,
            } => {
                let answer = |r| NodeMsg::SubmitAnswer(r);
                if self.node.protocol() == Protocol::Active {
                    let _ = reply.send(answer(Err(Refusal::Refused(
                        "under active, update procedures are ordered: invoke them".into(),
                    ))));
                    return;
                }
                let Some(permit) = permit(self.limits.submissions()) else {
                    let _ = reply.send(answer(Err(self.busy("submissions"))));
                    return;
                };
                let Some(service) = self.service.get() else {
                    let _ = reply.send(answer(Err(Refusal::Refused(
                        "this node runs no transaction service".into(),
                    ))));
                    return;
                };
                match service.submit_procedure(priority, &procedure, arguments) {
                    Err(e) => {
                        let _ = reply.send(answer(Err(Refusal::Refused(e.to_string()))));
                    }
                    Ok(ticket) => {
                        // The request waits for its turn, up to the deadline: then it may
                        // still run, and the answer says so.
                        let deadline = std::time::Instant::now() + self.limits.timeout();
                        let timeout = self.limits.timeout();
                        tokio::task::spawn_blocking(move || {
                            let result = if !ticket.wait_until(deadline) {
                                Err(Refusal::Unknown(format!(
                                    "no outcome within {timeout:?}: it may still run"
                                )))
                            } else {
                                match ticket.wait() {
                                    Ok((result, _)) => result.map_err(Refusal::from),
                                    Err(e) => Err(Refusal::Refused(e.to_string())),
                                }
                            };
                            let _ = reply.send(answer(result));
                            drop(permit);
                        });
                    }
                }
            }
            NodeMsg::ChangeMembership(request) => self.change_membership(from, request, reply),
            NodeMsg::BackupBegin => self.begin_backup(reply),
            NodeMsg::BackupFetch { id, offset, len } => {
                let chunk = self.kept_backups.chunk(id, offset, len);
                let _ = reply.send(NodeMsg::BackupChunk(chunk));
            }
            other => debug!(client = from, msg = ?other, "a client's request not served: dropped"),
        }
    }
}

/// A permit for one more request in flight, if there is one left.
fn permit(permits: Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    permits.try_acquire_owned().ok()
}

/// Runs read-only procedure `name` on `node` from a snapshot, giving up after `timeout`.
fn query(node: &Node, name: &str, arguments: &[u8], timeout: Duration) -> Result<Vec<u8>, Refusal> {
    let procedure = node.procedures().get(name)?;
    if procedure.kind() != ProcedureKind::ReadOnly {
        return Err(Refusal::Refused(format!(
            "{name:?} is an update procedure: invoke it to have it ordered"
        )));
    }
    Ok(node
        .tx()
        .read_only()
        .timeout(timeout)
        .run(|tx| procedure.call(tx, arguments))?)
}
