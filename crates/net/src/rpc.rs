//! Requests with responses (futures with timeouts) and one-way messages over any transport.
//!
//! ```text
//! let (rpc, mut inbox) = Rpc::<Msg>::new();
//! let transport = TcpTransport::bind(cfg, listen, rpc.deliverer()).await?;
//! rpc.attach(Arc::new(transport));
//! let answer = rpc.request(2, Msg::Ping, Duration::from_secs(1)).await?;
//! while let Some(Inbound::Request { msg, reply, .. }) = inbox.recv().await { reply.send(..)?; }
//! ```
//!
//! A response completes its request's future straight from the transport's receiving task; the
//! application sees requests, one-way messages and link changes on its inbox. A request fails
//! with a typed error when it times out, when the message cannot be sent, or as soon as the link
//! to its peer goes down; it never hangs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::transport::{Deliver, NodeId, SendError, Transport};
use crate::wire::WireMessage;

/// How requests, responses and one-way messages travel.
#[derive(Debug, Serialize, Deserialize)]
pub enum Envelope<M> {
    /// A message that expects no answer.
    OneWay(M),
    /// A request; the answer carries the same id.
    Request {
        /// Chosen by the requester, unique among its outstanding requests.
        id: u64,
        /// The request.
        body: M,
    },
    /// The answer to request `id`.
    Response {
        /// The request's id.
        id: u64,
        /// The answer.
        body: M,
    },
}

impl<M: WireMessage> WireMessage for Envelope<M> {
    fn since(&self) -> u16 {
        match self {
            Envelope::OneWay(body)
            | Envelope::Request { body, .. }
            | Envelope::Response { body, .. } => body.since(),
        }
    }
}

/// What the application receives.
#[derive(Debug)]
pub enum Inbound<M> {
    /// A one-way message.
    Message {
        /// The sender.
        from: NodeId,
        /// The message.
        msg: M,
    },
    /// A request; answer it with `reply` (or drop `reply`, and the requester times out).
    Request {
        /// The requester.
        from: NodeId,
        /// The request.
        msg: M,
        /// Sends the answer.
        reply: Reply<M>,
    },
    /// The link to `peer` came up or went down.
    Link {
        /// The peer.
        peer: NodeId,
        /// Whether it is up now.
        up: bool,
    },
}

/// Why a request has no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// The request could not be sent.
    #[error(transparent)]
    Send(#[from] SendError),
    /// No answer came in time.
    #[error("node {peer} did not answer within {} ms", after.as_millis())]
    Timeout {
        /// The peer asked.
        peer: NodeId,
        /// The time limit.
        after: Duration,
    },
    /// The link to the peer went down while the request was outstanding.
    #[error("the link to node {0} went down before it answered")]
    PeerDown(NodeId),
}

/// The request/response layer of one node. Cheap to clone.
pub struct Rpc<M> {
    core: Arc<Core<M>>,
}

impl<M> Clone for Rpc<M> {
    fn clone(&self) -> Self {
        Rpc {
            core: self.core.clone(),
        }
    }
}

type SharedTransport<M> = Arc<dyn Transport<Envelope<M>>>;

/// Takes one-way messages before they reach the inbox: returns the message to pass it on, or
/// `None` once it handled it.
pub type Interceptor<M> = Arc<dyn Fn(NodeId, M) -> Option<M> + Send + Sync>;

struct Core<M> {
    transport: OnceLock<SharedTransport<M>>,
    intercept: OnceLock<Interceptor<M>>,
    pending: Mutex<HashMap<u64, (NodeId, oneshot::Sender<M>)>>,
    next_id: AtomicU64,
    inbound: mpsc::UnboundedSender<Inbound<M>>,
    latency: metrics::Histogram,
}

impl<M: Send + 'static> Rpc<M> {
    /// A request layer and the inbox on which the application receives.
    pub fn new() -> (Rpc<M>, mpsc::UnboundedReceiver<Inbound<M>>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let core = Core {
            transport: OnceLock::new(),
            intercept: OnceLock::new(),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            inbound: tx,
            latency: metrics::histogram!("atomos_request_latency_seconds"),
        };
        (
            Rpc {
                core: Arc::new(core),
            },
            rx,
        )
    }

    /// What the transport must deliver to. It does not keep this layer alive.
    pub fn deliverer(&self) -> Arc<dyn Deliver<Envelope<M>>> {
        Arc::new(RpcDeliver {
            core: Arc::downgrade(&self.core),
        })
    }

    /// Connects the transport (built with [`Rpc::deliverer`]). Only the first call counts.
    pub fn attach(&self, transport: SharedTransport<M>) {
        let _ = self.core.transport.set(transport);
    }

    /// Handles one-way messages as they arrive, on the transport's receiving task, before the
    /// inbox (saving a task hop for latency-bound protocols). `f` must not block. Only the
    /// first call counts; returns whether this one did.
    pub fn intercept(&self, f: Interceptor<M>) -> bool {
        self.core.intercept.set(f).is_ok()
    }

    /// The attached transport.
    pub fn transport(&self) -> Result<&SharedTransport<M>, SendError> {
        self.core.transport.get().ok_or(SendError::Closed)
    }

    /// Sends a one-way message.
    pub fn send(&self, to: NodeId, msg: M) -> Result<(), SendError> {
        self.transport()?.send(to, Envelope::OneWay(msg))
    }

    /// Sends a request and waits at most `limit` for the answer.
    pub async fn request(&self, to: NodeId, msg: M, limit: Duration) -> Result<M, RpcError> {
        let transport = self.transport()?;
        let id = self.core.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.core.pending.lock().insert(id, (to, tx));
        // Removes the entry however this future ends (answered, failed, timed out, dropped).
        let _forget = Forget {
            core: &self.core,
            id,
        };
        let started = Instant::now();
        transport.send(to, Envelope::Request { id, body: msg })?;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(answer)) => {
                self.core.latency.record(started.elapsed().as_secs_f64());
                Ok(answer)
            }
            Ok(Err(_)) => Err(RpcError::PeerDown(to)),
            Err(_) => Err(RpcError::Timeout {
                peer: to,
                after: limit,
            }),
        }
    }
}

struct Forget<'a, M> {
    core: &'a Core<M>,
    id: u64,
}

impl<M> Drop for Forget<'_, M> {
    fn drop(&mut self) {
        self.core.pending.lock().remove(&self.id);
    }
}

/// Sends the answer to one request.
pub struct Reply<M> {
    core: Arc<Core<M>>,
    to: NodeId,
    id: u64,
}

impl<M> std::fmt::Debug for Reply<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("to", &self.to)
            .field("id", &self.id)
            .finish()
    }
}

impl<M> Reply<M> {
    /// Sends `answer` to the requester.
    pub fn send(self, answer: M) -> Result<(), SendError> {
        let transport = self.core.transport.get().ok_or(SendError::Closed)?;
        transport.send(
            self.to,
            Envelope::Response {
                id: self.id,
                body: answer,
            },
        )
    }
}

struct RpcDeliver<M> {
    core: Weak<Core<M>>,
}

impl<M: Send + 'static> Deliver<Envelope<M>> for RpcDeliver<M> {
    fn message(&self, from: NodeId, msg: Envelope<M>) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        // A closed inbox means the application stopped listening: drop what arrives.
        match msg {
            Envelope::Response { id, body } => {
                let waiter = {
                    let mut pending = core.pending.lock();
                    // Only the peer that was asked can answer.
                    match pending.get(&id) {
                        Some((peer, _)) if *peer == from => pending.remove(&id),
                        _ => None,
                    }
                };
                if let Some((_, tx)) = waiter {
                    let _ = tx.send(body);
                }
            }
            Envelope::Request { id, body } => {
                let reply = Reply {
                    core: core.clone(),
                    to: from,
                    id,
                };
                let _ = core.inbound.send(Inbound::Request {
                    from,
                    msg: body,
                    reply,
                });
            }
            Envelope::OneWay(msg) => {
                let msg = match core.intercept.get() {
                    Some(f) => match f(from, msg) {
                        Some(m) => m,
                        None => return,
                    },
                    None => msg,
                };
                let _ = core.inbound.send(Inbound::Message { from, msg });
            }
        }
    }

    fn link(&self, peer: NodeId, up: bool) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        if !up {
            // Fail the requests waiting on this peer now rather than at their timeouts.
            core.pending.lock().retain(|_, (p, _)| *p != peer);
        }
        let _ = core.inbound.send(Inbound::Link { peer, up });
    }
}
