//! What a node answers to clients (programs connected with the cluster secret, ids with the
//! client bit; see [`Client`](crate::Client)):
//!
//! - the node's protocol and procedures ([`NodeMsg::Describe`]);
//! - read-only procedures, run here from a snapshot ([`NodeMsg::Query`]);
//! - update procedures under `active`: the client's order-layer request, checked here and
//!   handed to the node's order replica, which orders it, deduplicates it by the client's id
//!   and sequence number and answers the client once it is finally delivered;
//! - procedures with a priority ([`NodeMsg::Submit`]), run on the node's transaction service
//!   (under the other protocols: their transactions run on the node that serves them).
//!
//! Anything else a client sends is dropped and logged; a request that cannot be ordered is
//! answered at once with [`Answer::Refused`] at position 0 (it was never ordered).

use std::sync::Arc;

use atomos_core::{ProcedureKind, TxError};
use atomos_net::rpc::{Reply, Rpc};
use atomos_net::transport::{Deliver, NodeId};
use atomos_order::{OrderMsg, Request};
use atomos_protocols::replicated::{Answer, Entry};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::node::{Node, Protocol};
use crate::runtime::NodeMsg;
use crate::service::TxService;

/// Why a node did not run a client's procedure, as it travels back to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// No procedure of that name is registered on the node.
    NoSuchProcedure(String),
    /// The arguments or the result did not fit the procedure's types.
    Types(String),
    /// The procedure failed (its own error, or its transaction could not commit).
    Failed(String),
    /// The request cannot be served here (a write in a read-only query, and the like).
    Refused(String),
}

impl From<TxError> for Refusal {
    fn from(e: TxError) -> Refusal {
        match e {
            TxError::NoSuchProcedure { name } => Refusal::NoSuchProcedure(name),
            TxError::ProcedureTypes { reason, .. } => Refusal::Types(reason),
            other => Refusal::Failed(other.to_string()),
        }
    }
}

/// Serves clients' messages and requests on behalf of `node`.
pub(crate) struct ClientService {
    pub(crate) node: Node,
    pub(crate) rpc: Rpc<NodeMsg>,
    /// Where prioritized requests run, once the node started a transaction service.
    pub(crate) service: Arc<std::sync::OnceLock<Arc<TxService>>>,
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
            (Ok(()), None) => self.refuse(from, &req, "this node runs no order replica".into()),
            (Err(reason), _) => self.refuse(from, &req, reason),
        }
    }

    /// Whether `req` is an invocation of an update procedure this node would order.
    fn check_update(&self, req: &Request) -> Result<(), String> {
        let protocol = self.node.protocol();
        if protocol != Protocol::Active {
            return Err(format!(
                "update procedures from clients need protocol active; this node runs {protocol}"
            ));
        }
        match Entry::decode(&req.payload) {
            Ok(Entry::Invoke { procedure, .. }) => match self.node.procedures().get(&procedure) {
                Ok(p) if p.kind() == ProcedureKind::Update => Ok(()),
                Ok(_) => Err(format!("{procedure:?} is read-only: query it instead")),
                Err(e) => Err(e.to_string()),
            },
            Ok(other) => Err(format!("clients may only invoke procedures, not {other:?}")),
            Err(e) => Err(format!("the request is no entry: {e}")),
        }
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
            NodeMsg::Query {
                procedure,
                arguments,
            } => {
                let node = self.node.clone();
                tokio::task::spawn_blocking(move || {
                    let answer = query(&node, &procedure, &arguments);
                    let _ = reply.send(NodeMsg::QueryAnswer(answer));
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
                        // The wait may be long (the request waits for its turn).
                        tokio::task::spawn_blocking(move || {
                            let result = match ticket.wait() {
                                Ok((result, _)) => result.map_err(Refusal::from),
                                Err(e) => Err(Refusal::Refused(e.to_string())),
                            };
                            let _ = reply.send(answer(result));
                        });
                    }
                }
            }
            other => debug!(client = from, msg = ?other, "a client's request not served: dropped"),
        }
    }
}

/// Runs read-only procedure `name` on `node` from a snapshot.
fn query(node: &Node, name: &str, arguments: &[u8]) -> Result<Vec<u8>, Refusal> {
    let procedure = node.procedures().get(name)?;
    if procedure.kind() != ProcedureKind::ReadOnly {
        return Err(Refusal::Refused(format!(
            "{name:?} is an update procedure: invoke it to have it ordered"
        )));
    }
    Ok(node.atomically_read(|tx| procedure.call(tx, arguments))?)
}
