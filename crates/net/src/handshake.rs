//! The connection handshake, as a state machine without I/O: the Noise protocol framework
//! (pattern `NNpsk0`, via the `snow` crate), keyed by the cluster secret.
//!
//! 1. Both sides send a [`Preamble`] in the clear: the wire version and the cluster name, so a
//!    node of another version or cluster gets a clear refusal. Nothing secret is in it.
//! 2. The dialler (initiator) sends Noise's first message: a fresh ephemeral key and its node
//!    id, encrypted under a key mixed from a pre-shared key derived from the cluster secret
//!    (and the cluster name). Only a peer that knows the secret can produce or read it.
//! 3. The acceptor (responder) opens it (a peer that does not know the secret is refused here,
//!    before it was sent anything that depends on the secret), and answers with its ephemeral
//!    key and its node id, sealed under keys from both ephemeral keys and the secret.
//! 4. The dialler opens that answer, and sends an empty sealed record that proves it holds its
//!    ephemeral key: the acceptor counts the dialler as authenticated only then, so a replayed
//!    first message establishes nothing.
//!
//! Both preambles are Noise's prologue: a preamble changed on the way fails the handshake.
//! From then on every byte is sealed (see [`secure`](crate::secure)). The ephemeral keys come
//! from the operating system's random source, through `snow`.

use std::fmt;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use snow::{Builder, HandshakeState};

use crate::frame;
use crate::secure::{self, Opener, Sealer};
use crate::wire::WIRE_VERSION;

/// The Noise protocol every connection speaks.
pub const NOISE_PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";

/// Largest frame accepted before the peer has proved it knows the secret: a handshake needs
/// far less, and an unauthenticated peer gets no room for more.
pub const MAX_HANDSHAKE_FRAME: usize = 512;

/// Longest cluster name, in bytes (it must fit a handshake frame).
pub const MAX_CLUSTER_NAME: usize = 255;

/// Fixed bytes of the Noise prologue and of the pre-shared key's derivation.
const LABEL: &[u8] = b"atomos noise v1\0";

/// What each side sends first, in the clear.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preamble {
    /// The wire version the sender speaks.
    pub wire_version: u16,
    /// The sender's cluster.
    pub cluster: String,
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
    /// The cluster name is longer than [`MAX_CLUSTER_NAME`] bytes.
    #[error("the cluster name is {0} bytes long; at most {MAX_CLUSTER_NAME} are allowed")]
    LongCluster(usize),
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
        if cluster.len() > MAX_CLUSTER_NAME {
            return Err(IdentityError::LongCluster(cluster.len()));
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

    /// Noise's pre-shared key: HMAC-SHA256 keyed with the secret over a label and the cluster.
    fn psk(&self) -> [u8; 32] {
        // HMAC accepts keys of any length; `Identity::new` refuses an empty one.
        let mut mac =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(LABEL);
        mac.update(self.cluster.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// Which end of the connection a side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that dialled: it speaks first and proves itself first.
    Initiator,
    /// The side that accepted.
    Responder,
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
    /// The peer's handshake does not open with the cluster secret: it does not know it, or
    /// the handshake was tampered with.
    #[error("peer's handshake does not open with the cluster secret")]
    BadProof,
    /// The peer claims this node's own id.
    #[error("peer claims this node's own id {0}")]
    SameNode(u64),
    /// Bytes that are not the handshake message expected now.
    #[error("malformed handshake: {0}")]
    Malformed(String),
    /// The dialler reached another node than the one it dialled.
    #[error("expected node {expected} at this address, found node {found}")]
    UnexpectedPeer {
        /// The node dialled.
        expected: u64,
        /// The node that answered.
        found: u64,
    },
    /// A message arrived after the handshake failed or finished.
    #[error("handshake message after the handshake {0}")]
    Over(&'static str),
}

/// Where a handshake stands after a step.
pub enum Progress {
    /// More messages are needed from the peer.
    Pending,
    /// The peer is authenticated; from now on every byte is sealed with these.
    Established {
        /// The peer's node id.
        peer: u64,
        /// Seals what this side sends.
        sealer: Sealer,
        /// Opens what the peer sends.
        opener: Opener,
    },
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Progress::Pending => write!(f, "Pending"),
            Progress::Established { peer, .. } => write!(f, "Established {{ peer: {peer} }}"),
        }
    }
}

enum State {
    AwaitPreamble,
    /// Responder: the dialler's first Noise message.
    AwaitFirst(Box<HandshakeState>),
    /// Initiator: the acceptor's answer.
    AwaitAnswer(Box<HandshakeState>),
    /// Responder: the dialler's first sealed record.
    AwaitConfirm {
        peer: u64,
        sealer: Sealer,
        opener: Opener,
    },
    Over(&'static str),
}

/// One side of one connection's handshake.
pub struct Handshake {
    me: Identity,
    role: Role,
    /// The dialler's expected peer: any other is refused before it is sent the confirmation.
    expect: Option<u64>,
    preamble: Vec<u8>,
    state: State,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake")
            .field("me", &self.me)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts a handshake and appends the frames to send now (the preamble) to `out`.
    pub fn start(me: Identity, role: Role, out: &mut Vec<u8>) -> Handshake {
        let preamble = Preamble {
            wire_version: WIRE_VERSION,
            cluster: me.cluster.clone(),
        };
        // A string and an integer always encode; the name is bounded by `Identity::new`.
        let preamble = postcard::to_stdvec(&preamble).unwrap_or_default();
        let _ = frame::encode(&preamble, MAX_HANDSHAKE_FRAME, out);
        Handshake {
            me,
            role,
            expect: None,
            preamble,
            state: State::AwaitPreamble,
        }
    }

    /// As the dialler, refuses any peer but `peer` (before sending it the confirmation, so a
    /// node reached by mistake or redirection never counts this one as authenticated).
    pub fn expect_peer(&mut self, peer: u64) {
        self.expect = Some(peer);
    }

    /// Feeds one frame's payload from the peer and appends the frames to send to `out`. After
    /// a refusal every later step is refused too.
    pub fn step(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<Progress, Refusal> {
        // A step that fails leaves the handshake failed; one that succeeds sets what follows.
        let state = std::mem::replace(&mut self.state, State::Over("failed"));
        self.advance(state, payload, out)
    }

    fn advance(
        &mut self,
        state: State,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Progress, Refusal> {
        match state {
            State::AwaitPreamble => {
                let theirs = self.check_preamble(payload)?;
                let (first, second) = match self.role {
                    Role::Initiator => (&self.preamble[..], theirs),
                    Role::Responder => (theirs, &self.preamble[..]),
                };
                let mut prologue = LABEL.to_vec();
                for part in [first, second] {
                    prologue.extend_from_slice(&(part.len() as u32).to_be_bytes());
                    prologue.extend_from_slice(part);
                }
                let psk = self.me.psk();
                let builder = Builder::new(NOISE_PATTERN.parse().map_err(noise)?)
                    .psk(0, &psk)
                    .and_then(|b| b.prologue(&prologue))
                    .map_err(noise)?;
                match self.role {
                    Role::Initiator => {
                        let mut noise_state = builder.build_initiator().map_err(noise)?;
                        self.write_noise(&mut noise_state, out)?;
                        self.state = State::AwaitAnswer(Box::new(noise_state));
                    }
                    Role::Responder => {
                        let noise_state = builder.build_responder().map_err(noise)?;
                        self.state = State::AwaitFirst(Box::new(noise_state));
                    }
                }
                Ok(Progress::Pending)
            }
            State::AwaitFirst(mut noise_state) => {
                let peer = self.read_noise(&mut noise_state, payload)?;
                self.write_noise(&mut noise_state, out)?;
                let (sealer, opener) = into_channel(*noise_state)?;
                self.state = State::AwaitConfirm {
                    peer,
                    sealer,
                    opener,
                };
                Ok(Progress::Pending)
            }
            State::AwaitAnswer(mut noise_state) => {
                let peer = self.read_noise(&mut noise_state, payload)?;
                if let Some(expected) = self.expect.filter(|&e| e != peer) {
                    return Err(Refusal::UnexpectedPeer {
                        expected,
                        found: peer,
                    });
                }
                let (mut sealer, opener) = into_channel(*noise_state)?;
                sealer
                    .seal_record(&[], out)
                    .map_err(|e| Refusal::Malformed(e.to_string()))?;
                self.state = State::Over("finished");
                Ok(Progress::Established {
                    peer,
                    sealer,
                    opener,
                })
            }
            State::AwaitConfirm {
                peer,
                sealer,
                mut opener,
            } => {
                let mut plain = Vec::new();
                opener
                    .open(payload, &mut plain)
                    .map_err(|_| Refusal::BadProof)?;
                if !plain.is_empty() {
                    return Err(Refusal::Malformed("the confirmation carries data".into()));
                }
                self.state = State::Over("finished");
                Ok(Progress::Established {
                    peer,
                    sealer,
                    opener,
                })
            }
            State::Over(how) => Err(Refusal::Over(how)),
        }
    }

    /// Checks the peer's preamble; returns its bytes.
    fn check_preamble<'a>(&self, payload: &'a [u8]) -> Result<&'a [u8], Refusal> {
        let theirs: Preamble = postcard::from_bytes(payload)
            .map_err(|e| Refusal::Malformed(format!("preamble: {e}")))?;
        if theirs.wire_version != WIRE_VERSION {
            return Err(Refusal::Version {
                ours: WIRE_VERSION,
                theirs: theirs.wire_version,
            });
        }
        if theirs.cluster != self.me.cluster {
            return Err(Refusal::WrongCluster {
                ours: self.me.cluster.clone(),
                theirs: theirs.cluster,
            });
        }
        Ok(payload)
    }

    /// Appends this side's next Noise message, carrying its node id, as a frame.
    fn write_noise(
        &self,
        noise_state: &mut HandshakeState,
        out: &mut Vec<u8>,
    ) -> Result<(), Refusal> {
        let mut message = [0u8; MAX_HANDSHAKE_FRAME];
        let n = noise_state
            .write_message(&self.me.node.to_be_bytes(), &mut message)
            .map_err(noise)?;
        frame::encode(&message[..n], MAX_HANDSHAKE_FRAME, out)
            .map_err(|e| Refusal::Malformed(e.to_string()))
    }

    /// Opens the peer's Noise message; returns the node id it carries.
    fn read_noise(&self, noise_state: &mut HandshakeState, payload: &[u8]) -> Result<u64, Refusal> {
        let mut plain = [0u8; MAX_HANDSHAKE_FRAME];
        let n = noise_state
            .read_message(payload, &mut plain)
            .map_err(|_| Refusal::BadProof)?;
        let node: [u8; 8] = plain[..n]
            .try_into()
            .map_err(|_| Refusal::Malformed(format!("a node id of {n} bytes")))?;
        let node = u64::from_be_bytes(node);
        if node == self.me.node {
            return Err(Refusal::SameNode(node));
        }
        Ok(node)
    }
}

fn into_channel(noise_state: HandshakeState) -> Result<(Sealer, Opener), Refusal> {
    let keys = noise_state.into_stateless_transport_mode().map_err(noise)?;
    Ok(secure::split(keys))
}

fn noise(e: snow::Error) -> Refusal {
    Refusal::Malformed(format!("noise: {e}"))
}
