//! Wire frames: node messages built by `arbitrary`, framed, mutated and decoded, and fed to
//! the machine each is for (a TFA node, an order replica, an OSS node).

use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::{Arbitrary, Unstructured};
use atomos::net::rpc::Envelope;
use atomos::net::tcp::LinkFrame;
use atomos::net::wire;
use atomos::order::{OrderMsg, Register, Replica};
use atomos::protocols::oss::{OssConfig, OssNode};
use atomos::protocols::tfa::clock::MAX_CLOCK;
use atomos::protocols::tfa::{TfaConfig, TfaMsg, TfaNode, TfaRequest};
use atomos::NodeMsg;
use atomos_seam::{Input, Machine};

use super::order::*;
use atomos_sim::fuzz::*;

/// A node message built by `arbitrary`.
pub(crate) fn arbitrary_node_msg(u: &mut Unstructured) -> arbitrary::Result<NodeMsg> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => NodeMsg::Ping(u.arbitrary()?),
        1 => NodeMsg::Pong(u.arbitrary()?),
        2 => NodeMsg::Order(OrderMsg::arbitrary(u)?),
        _ => NodeMsg::Tfa(TfaMsg::arbitrary(u)?),
    })
}

/// A wire frame's payload (what a sealed record carries, without the length prefix).
pub(crate) fn frame_payload(msg: NodeMsg, u: &mut Unstructured) -> Option<Vec<u8>> {
    let envelope = match u.int_in_range(0..=2u8).ok()? {
        0 => Envelope::OneWay(msg),
        1 => Envelope::Request {
            id: u.arbitrary().ok()?,
            body: msg,
        },
        _ => Envelope::Response {
            id: u.arbitrary().ok()?,
            body: msg,
        },
    };
    let frame = if u.ratio(1, 8u8).ok()? {
        LinkFrame::KeepAlive
    } else {
        LinkFrame::App(envelope)
    };
    let mut out = Vec::new();
    wire::encode(&frame, 1 << 20, &mut out).ok()?;
    Some(out[atomos::net::frame::PREFIX..].to_vec())
}

/// What a TFA node's state looks like from outside (to tell whether an input changed it).
pub(crate) fn tfa_state(n: &TfaNode) -> String {
    format!(
        "{} {:?} {:?} {} {} {}",
        n.clock(),
        n.counters(),
        n.in_flight(),
        n.pending_requests(),
        n.objects().len(),
        n.objects().locks_held()
    )
}

/// A TFA node with some history: objects it owns, a transaction running.
pub(crate) fn tfa_node() -> TfaNode {
    let mut n = TfaNode::new(1, vec![1, 2, 3], 1, TfaConfig::default()).expect("a member");
    let mut out = Vec::new();
    for h in 0..4u64 {
        n.step(h, Input::Request(TfaRequest::Begin { h }), &mut out)
            .expect("infallible");
    }
    n
}

thread_local! {
    /// The OSS node that decoded OSS messages go to (made at the first one).
    static OSS: std::cell::RefCell<Option<OssNode>> = const { std::cell::RefCell::new(None) };
}

/// Node 1 of three OSS nodes, on an engine of its own.
pub(crate) fn oss_node() -> OssNode {
    let engine = std::sync::Arc::new(atomos::Engine::new(atomos::EngineConfig {
        replicated: true,
        ..atomos::EngineConfig::default()
    }));
    OssNode::open(OssConfig::new(1, vec![1, 2, 3]), engine, &[]).expect("a member")
}

/// Inputs that decoded and reached a machine.
pub(crate) static DELIVERED: AtomicUsize = AtomicUsize::new(0);

/// Feeds a decoded node message to the machine that receives it.
pub(crate) fn deliver(
    tfa: &mut TfaNode,
    order: &mut Replica<Register>,
    now: u64,
    from: u64,
    msg: NodeMsg,
) {
    DELIVERED.fetch_add(1, Ordering::Relaxed);
    match msg {
        NodeMsg::Tfa(m) => {
            let refused = m.clock > MAX_CLOCK;
            let before = refused.then(|| tfa_state(tfa));
            tfa.step(now, Input::Message { from, msg: m }, &mut Vec::new())
                .expect("infallible");
            if let Some(before) = before {
                assert_eq!(
                    tfa_state(tfa),
                    before,
                    "a refused TFA message changed the node"
                );
            }
        }
        NodeMsg::Order(m) => {
            // Raft messages are taken from any replica (one that lags may not know the newest
            // members); nothing else a non-member sends changes the replica.
            let member = (1..=3).contains(&from);
            let checked = !member && !matches!(m, OrderMsg::Raft(_));
            let before = checked.then(|| order_standing(order));
            // A replica error stops the replica (the node reports it): allowed, never a panic.
            let _ = order.step(now, Input::Message { from, msg: m }, &mut Vec::new());
            if let Some(before) = before {
                assert_eq!(
                    order_standing(order),
                    before,
                    "a non-member's message changed the replica"
                );
            }
        }
        // An OSS node takes whatever decodes (or stops with an error), never panics.
        NodeMsg::Oss(m) => OSS.with(|oss| {
            let mut oss = oss.borrow_mut();
            let node = oss.get_or_insert_with(oss_node);
            let _ = node.step(now, Input::Message { from, msg: m }, &mut Vec::new());
        }),
        // Served by the node's client service, whose checks tests/clients.rs and
        // tests/backup.rs exercise.
        NodeMsg::Ping(_)
        | NodeMsg::Pong(_)
        | NodeMsg::Describe
        | NodeMsg::Catalog { .. }
        | NodeMsg::Status
        | NodeMsg::StatusReport(_)
        | NodeMsg::Query { .. }
        | NodeMsg::QueryAnswer(_)
        | NodeMsg::Submit { .. }
        | NodeMsg::SubmitAnswer(_)
        | NodeMsg::ChangeMembership(_)
        | NodeMsg::MembershipChanged(_)
        | NodeMsg::BackupBegin
        | NodeMsg::BackupReady(_)
        | NodeMsg::BackupFetch { .. }
        | NodeMsg::BackupChunk(_) => {}
    }
}

/// Checks that the inputs reached the machines (at least a fifth of them decoded), and says
/// how far the machines went.
pub(crate) fn reached(delivered_before: usize, order: &Replica<Register>, tfa: &TfaNode) {
    let delivered = DELIVERED.load(Ordering::Relaxed) - delivered_before;
    eprintln!(
        "{delivered} of {} inputs reached a machine; {}; tfa {}",
        inputs(),
        order.describe(),
        tfa_state(tfa)
    );
    assert!(
        delivered as u64 >= inputs() / 5,
        "only {delivered} inputs decoded"
    );
}

#[test]
pub(crate) fn wire_frames_decode_to_messages_their_machines_take_or_errors() {
    let _one = serial();
    let mut tfa = tfa_node();
    let mut order = replica(1);
    let delivered_before = DELIVERED.load(Ordering::Relaxed);
    let start = first_seed();
    for seed in start..start + inputs() {
        let mut rng = Rng::new(seed);
        let bytes = input_bytes(&mut rng, |u| {
            let msg = arbitrary_node_msg(u).ok()?;
            frame_payload(msg, u)
        });
        let from = [2, 3, 9][rng.below(3) as usize];
        bounded(&format!("wire seed {seed}"), || {
            if let Ok(LinkFrame::App(envelope)) =
                wire::decode::<LinkFrame<Envelope<NodeMsg>>>(&bytes)
            {
                let msg = match envelope {
                    Envelope::OneWay(m) => m,
                    Envelope::Request { body, .. } | Envelope::Response { body, .. } => body,
                };
                deliver(&mut tfa, &mut order, seed, from, msg);
            }
        });
        if seed % 64 == 0 {
            // Time passes too: re-sends and timeouts over whatever the inputs left.
            tfa.step(seed, Input::Tick, &mut Vec::new())
                .expect("infallible");
            let _ = order.step(seed, Input::Tick, &mut Vec::new());
        }
    }
    reached(delivered_before, &order, &tfa);
}

/// Where a replica stands, but for the count of messages it dropped from non-members.
fn order_standing(order: &Replica<Register>) -> String {
    let mut stats = order.stats();
    stats.from_non_members = 0;
    let described = order.describe();
    let place = described.split(", OrderStats").next().unwrap_or_default();
    format!("{place} {stats:?}")
}
