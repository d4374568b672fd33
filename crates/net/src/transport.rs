//! What every transport offers (TCP, in-memory; the simulator has its own network), and the
//! fault rules that can be set on a running transport.

use atomos_seam::stable::{mix64, GOLDEN};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

/// A node's id within its cluster.
pub use atomos_seam::NodeId;

/// The bit that marks a client's id: a client (a program that connects to a cluster with its
/// secret and is no member of it) has an id with this bit set, and a member never does, so
/// neither can pass for the other.
pub const CLIENT_BIT: NodeId = 1 << 63;

/// Whether `id` is a client's id (see [`CLIENT_BIT`]).
pub fn is_client(id: NodeId) -> bool {
    id & CLIENT_BIT != 0
}

/// Why a message was not accepted for sending. A message that was accepted can still be lost
/// (a connection breaks, a fault rule drops it): transports deliver at most once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The receiver is not a member of this cluster (nor a client connected now).
    #[error("node {0} is not a member of this cluster nor a connected client")]
    UnknownPeer(NodeId),
    /// Too many bytes are already waiting for this peer (it is slow or unreachable).
    #[error("{queued} bytes are already waiting for node {peer} (limit {limit})")]
    Backlog {
        /// The receiver.
        peer: NodeId,
        /// Bytes waiting.
        queued: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The message cannot be encoded (or is larger than the maximum frame).
    #[error("cannot send to node {peer}: {reason}")]
    Encode {
        /// The receiver.
        peer: NodeId,
        /// The codec's explanation.
        reason: String,
    },
    /// The message is of a kind the peer's wire version does not have (the peer runs an older
    /// build); it was not sent.
    #[error(
        "node {peer} speaks wire version {speaks}, which lacks this message (introduced in {since})"
    )]
    TooNew {
        /// The receiver.
        peer: NodeId,
        /// The version that introduced the message.
        since: u16,
        /// The version the link to the receiver speaks.
        speaks: u16,
    },
    /// The transport has been shut down.
    #[error("the transport is shut down")]
    Closed,
}

/// Where a transport hands what arrives. Implementations must not block: they are called on
/// the transport's receiving tasks (or, in memory, on the sender's thread).
pub trait Deliver<M>: Send + Sync + 'static {
    /// A whole message from `from`.
    fn message(&self, from: NodeId, msg: M);
    /// The link to `peer` came up (`true`) or went down (`false`).
    fn link(&self, peer: NodeId, up: bool);
}

/// Sends messages of type `M` to the other members of a cluster.
pub trait Transport<M>: Send + Sync {
    /// This node's id.
    fn id(&self) -> NodeId;
    /// The other members.
    fn peers(&self) -> Vec<NodeId>;
    /// Queues `msg` for `to` and returns at once; messages to one peer arrive in the order
    /// they were sent, or not at all.
    fn send(&self, to: NodeId, msg: M) -> Result<(), SendError>;
    /// The fault rules this transport applies (none unless set).
    fn faults(&self) -> &FaultRules;
    /// Closes every connection; later sends fail with [`SendError::Closed`].
    fn shutdown(&self);
}

/// Faults applied to the link to one peer (or to every link).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkRule {
    /// Probability in [0, 1] that a message is dropped.
    pub drop: f64,
    /// Every message waits this long before it is sent.
    pub delay: Duration,
    /// The peer is cut off: nothing is sent to it and what it sends is discarded.
    pub cut: bool,
}

impl LinkRule {
    fn is_clear(&self) -> bool {
        self.drop <= 0.0 && self.delay.is_zero() && !self.cut
    }
}

/// Fault rules, changeable while the transport runs, so latency and partitions can be staged
/// on one machine. Checking them costs one atomic load while no rule is set.
#[derive(Debug, Default)]
pub struct FaultRules {
    any: AtomicBool,
    rules: RwLock<Rules>,
    rng: AtomicU64,
}

#[derive(Debug, Default)]
struct Rules {
    all: LinkRule,
    peers: HashMap<NodeId, LinkRule>,
}

/// What to do with one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it now.
    Pass,
    /// Send it after this delay.
    Delay(Duration),
    /// Do not send it.
    Drop,
}

impl FaultRules {
    /// Sets the rule for every link (peers with their own rule keep it).
    pub fn set_all(&self, rule: LinkRule) {
        let mut r = self.rules.write();
        r.all = rule;
        self.refresh(&r);
    }

    /// Sets the rule for the link to `peer`.
    pub fn set_peer(&self, peer: NodeId, rule: LinkRule) {
        let mut r = self.rules.write();
        r.peers.insert(peer, rule);
        self.refresh(&r);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        let mut r = self.rules.write();
        *r = Rules::default();
        self.refresh(&r);
    }

    fn refresh(&self, r: &Rules) {
        let any = !r.all.is_clear() || r.peers.values().any(|p| !p.is_clear());
        self.any.store(any, Ordering::Release);
    }

    fn rule(&self, peer: NodeId) -> Option<LinkRule> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let r = self.rules.read();
        Some(*r.peers.get(&peer).unwrap_or(&r.all))
    }

    /// The verdict for a message to `peer`.
    pub fn outgoing(&self, peer: NodeId) -> Verdict {
        let Some(rule) = self.rule(peer) else {
            return Verdict::Pass;
        };
        if rule.cut || (rule.drop > 0.0 && self.coin() < rule.drop) {
            Verdict::Drop
        } else if !rule.delay.is_zero() {
            Verdict::Delay(rule.delay)
        } else {
            Verdict::Pass
        }
    }

    /// Whether a message from `peer` must be discarded (the peer is cut off).
    pub fn refuse_incoming(&self, peer: NodeId) -> bool {
        self.rule(peer).is_some_and(|r| r.cut)
    }

    /// A uniform number in [0, 1) (SplitMix64 over a shared counter).
    fn coin(&self) -> f64 {
        let state = self.rng.fetch_add(GOLDEN, Ordering::Relaxed);
        let z = mix64(state.wrapping_add(GOLDEN));
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_apply_per_peer_and_clear() {
        let f = FaultRules::default();
        assert_eq!(f.outgoing(2), Verdict::Pass);
        f.set_all(LinkRule {
            delay: Duration::from_millis(5),
            ..LinkRule::default()
        });
        f.set_peer(
            3,
            LinkRule {
                cut: true,
                ..LinkRule::default()
            },
        );
        assert_eq!(f.outgoing(2), Verdict::Delay(Duration::from_millis(5)));
        assert_eq!(f.outgoing(3), Verdict::Drop);
        assert!(f.refuse_incoming(3) && !f.refuse_incoming(2));
        f.clear();
        assert_eq!(f.outgoing(3), Verdict::Pass);
    }

    #[test]
    fn drop_probability_is_roughly_honoured() {
        let f = FaultRules::default();
        f.set_all(LinkRule {
            drop: 0.25,
            ..LinkRule::default()
        });
        let dropped = (0..10_000)
            .filter(|_| f.outgoing(1) == Verdict::Drop)
            .count();
        assert!((2_000..3_000).contains(&dropped), "{dropped}");
    }
}
