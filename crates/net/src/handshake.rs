//! The connection handshake, as a state machine without I/O.
//!
//! Both sides send [`HandshakeMsg::Hello`] as soon as the connection opens: cluster name, node
//! id, wire version and a fresh random nonce (the caller supplies it, so the machine stays
//! deterministic). On the peer's hello a side checks cluster and version and answers with
//! [`HandshakeMsg::Proof`]: HMAC-SHA256, keyed with the cluster secret, over a label, the
//! cluster, both node ids (sender first) and both nonces (sender's first). On the peer's proof it
//! verifies it (in constant time) and the connection is established. A proof binds both nonces
//! and the direction, so it cannot be replayed on another connection or reflected back.

use std::fmt;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::wire::WIRE_VERSION;

/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 32;

const LABEL: &[u8] = b"atomos handshake v1\0";

/// What the two sides exchange before anything else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandshakeMsg {
    /// Who the sender is.
    Hello {
        /// The sender's cluster.
        cluster: String,
        /// The sender's node id.
        node: u64,
        /// The wire version the sender speaks.
        wire_version: u16,
        /// A fresh random value.
        nonce: [u8; NONCE_LEN],
    },
    /// The sender's proof that it knows the cluster secret.
    Proof {
        /// HMAC-SHA256 as described in the module documentation.
        mac: [u8; 32],
    },
}

/// This node's identity for handshakes.
#[derive(Clone)]
pub struct Identity {
    cluster: String,
    node: u64,
    secret: Vec<u8>,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("secret", &"<hidden>")
            .finish()
    }
}

/// Why an identity cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The cluster secret is empty.
    #[error("the cluster secret is empty")]
    EmptySecret,
    /// The cluster name is empty.
    #[error("the cluster name is empty")]
    EmptyCluster,
}

impl Identity {
    /// Node `node` of `cluster`, authenticated with `secret`.
    pub fn new(
        cluster: impl Into<String>,
        node: u64,
        secret: impl Into<Vec<u8>>,
    ) -> Result<Identity, IdentityError> {
        let (cluster, secret) = (cluster.into(), secret.into());
        if cluster.is_empty() {
            return Err(IdentityError::EmptyCluster);
        }
        if secret.is_empty() {
            return Err(IdentityError::EmptySecret);
        }
        Ok(Identity {
            cluster,
            node,
            secret,
        })
    }

    /// The node id.
    pub fn node(&self) -> u64 {
        self.node
    }
}

/// Why a handshake refused the peer. Each is a reason to close the connection and log it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The peer belongs to another cluster.
    #[error("peer belongs to cluster {theirs:?}, not {ours:?}")]
    WrongCluster {
        /// Our cluster.
        ours: String,
        /// The peer's.
        theirs: String,
    },
    /// The peer speaks another wire version.
    #[error("peer speaks wire version {theirs}, this node speaks {ours}")]
    Version {
        /// Ours.
        ours: u16,
        /// The peer's.
        theirs: u16,
    },
    /// The peer's proof does not match: it does not know the cluster secret.
    #[error("peer's proof does not match the cluster secret")]
    BadProof,
    /// The peer claims this node's own id.
    #[error("peer claims this node's own id {0}")]
    SameNode(u64),
    /// A message arrived that the handshake does not expect now.
    #[error("unexpected {got} while {state}")]
    Unexpected {
        /// What arrived.
        got: &'static str,
        /// What the handshake was doing.
        state: &'static str,
    },
}

/// What to do after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this message to the peer.
    Send(HandshakeMsg),
    /// The peer is authenticated; the connection carries application messages from now on.
    Established {
        /// The peer's node id.
        peer: u64,
    },
}

#[derive(Clone, Debug)]
enum State {
    AwaitHello,
    AwaitProof {
        peer: u64,
        peer_nonce: [u8; NONCE_LEN],
    },
    Established {
        peer: u64,
    },
    Refused,
}

/// One side of one connection's handshake.
#[derive(Debug)]
pub struct Handshake {
    me: Identity,
    nonce: [u8; NONCE_LEN],
    state: State,
}

impl Handshake {
    /// Starts a handshake with a fresh random `nonce`; returns it with the hello to send.
    pub fn start(me: Identity, nonce: [u8; NONCE_LEN]) -> (Handshake, HandshakeMsg) {
        let hello = HandshakeMsg::Hello {
            cluster: me.cluster.clone(),
            node: me.node,
            wire_version: WIRE_VERSION,
            nonce,
        };
        (
            Handshake {
                me,
                nonce,
                state: State::AwaitHello,
            },
            hello,
        )
    }

    /// The authenticated peer, once established.
    pub fn peer(&self) -> Option<u64> {
        match self.state {
            State::Established { peer } => Some(peer),
            _ => None,
        }
    }

    /// Feeds one message from the peer. After a refusal every later step is refused too.
    pub fn step(&mut self, msg: HandshakeMsg) -> Result<Outcome, Refusal> {
        let result = self.advance(msg);
        if result.is_err() {
            self.state = State::Refused;
        }
        result
    }

    fn advance(&mut self, msg: HandshakeMsg) -> Result<Outcome, Refusal> {
        match (&self.state, msg) {
            (
                State::AwaitHello,
                HandshakeMsg::Hello {
                    cluster,
                    node,
                    wire_version,
                    nonce,
                },
            ) => {
                if cluster != self.me.cluster {
                    return Err(Refusal::WrongCluster {
                        ours: self.me.cluster.clone(),
                        theirs: cluster,
                    });
                }
                if wire_version != WIRE_VERSION {
                    return Err(Refusal::Version {
                        ours: WIRE_VERSION,
                        theirs: wire_version,
                    });
                }
                if node == self.me.node {
                    return Err(Refusal::SameNode(node));
                }
                let mac = self
                    .proof(self.me.node, node, &self.nonce, &nonce)
                    .finalize()
                    .into_bytes()
                    .into();
                self.state = State::AwaitProof {
                    peer: node,
                    peer_nonce: nonce,
                };
                Ok(Outcome::Send(HandshakeMsg::Proof { mac }))
            }
            (State::AwaitProof { peer, peer_nonce }, HandshakeMsg::Proof { mac }) => {
                let (peer, peer_nonce) = (*peer, *peer_nonce);
                self.proof(peer, self.me.node, &peer_nonce, &self.nonce)
                    .verify_slice(&mac)
                    .map_err(|_| Refusal::BadProof)?;
                self.state = State::Established { peer };
                Ok(Outcome::Established { peer })
            }
            (state, msg) => Err(Refusal::Unexpected {
                got: match msg {
                    HandshakeMsg::Hello { .. } => "hello",
                    HandshakeMsg::Proof { .. } => "proof",
                },
                state: match state {
                    State::AwaitHello => "awaiting the peer's hello",
                    State::AwaitProof { .. } => "awaiting the peer's proof",
                    State::Established { .. } => "established",
                    State::Refused => "refused",
                },
            }),
        }
    }

    /// The MAC state for a proof sent by `from` to `to`.
    fn proof(
        &self,
        from: u64,
        to: u64,
        from_nonce: &[u8; NONCE_LEN],
        to_nonce: &[u8; NONCE_LEN],
    ) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; `Identity::new` refuses an empty one.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.me.secret)
            .expect("HMAC takes any key length");
        mac.update(LABEL);
        mac.update(&(self.me.cluster.len() as u64).to_be_bytes());
        mac.update(self.me.cluster.as_bytes());
        mac.update(&from.to_be_bytes());
        mac.update(&to.to_be_bytes());
        mac.update(from_nonce);
        mac.update(to_nonce);
        mac
    }
}
