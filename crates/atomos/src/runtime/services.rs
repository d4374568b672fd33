//! The services every node runs whatever its protocol: it answers pings and hands each
//! inbound message to the part that owns it (the order replica, the TFA driver, the client
//! service), and it probes its peers, logging when one starts or stops answering.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use atomos_net::rpc::{Inbound, Rpc, RpcError};
use atomos_net::transport::{is_client, Deliver, NodeId};
use atomos_order::OrderMsg;
use parking_lot::Mutex;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::PeerState;
use crate::client_service::ClientService;
use crate::wire::NodeMsg;

/// How often every peer is pinged, and how long an answer may take.
const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_LIMIT: Duration = Duration::from_millis(1000);

/// Pings `peer`: its round-trip time, or why it did not answer within `limit`.
pub(super) async fn ping(
    rpc: &Rpc<NodeMsg>,
    peer: NodeId,
    limit: Duration,
) -> Result<Duration, RpcError> {
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
pub(super) async fn serve(
    id: NodeId,
    mut inbox: UnboundedReceiver<Inbound<NodeMsg>>,
    clients: ClientService,
    order: Arc<OnceLock<Arc<dyn Deliver<OrderMsg>>>>,
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
            Inbound::Message { from, msg } if is_client(from) => {
                clients.message(from, msg, order.get())
            }
            Inbound::Request {
                from,
                msg:
                    msg @ (NodeMsg::Describe
                    | NodeMsg::Status
                    | NodeMsg::Query { .. }
                    | NodeMsg::Submit { .. }
                    | NodeMsg::ChangeMembership(_)
                    | NodeMsg::BackupBegin
                    | NodeMsg::BackupFetch { .. }),
                reply,
            } => clients.request(from, msg, reply),
            Inbound::Message {
                from,
                msg: NodeMsg::Order(msg),
            } => match order.get() {
                Some(o) => o.message(from, msg),
                None => debug!(
                    node = id,
                    from, "order message for a node without order replica"
                ),
            },
            Inbound::Message {
                from,
                msg: NodeMsg::Tfa(_) | NodeMsg::Oss(_),
            } => {
                // A running protocol takes its messages where they arrive (see `crate::host`).
                debug!(
                    node = id,
                    from, "message for a protocol not running here dropped"
                );
            }
            Inbound::Request { from, msg, .. } | Inbound::Message { from, msg } => {
                warn!(node = id, from, ?msg, "unexpected message ignored");
            }
            Inbound::Link { .. } => {}
        }
    }
}

/// Pings every peer periodically; logs when a peer starts or stops answering.
pub(super) async fn probe(
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
