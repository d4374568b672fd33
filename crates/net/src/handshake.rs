//! The connection handshake, as a state machine without I/O: the Noise protocol framework
//! (pattern `XXpsk0`, via the `snow` crate), keyed by the cluster secret and by each side's own
//! static key pair (see [`keys`](crate::keys)).
//!
//! 1. Both sides send a [`Preamble`] in the clear: the oldest and newest wire versions it
//!    speaks and the cluster name, so a node of another cluster, or with no version in common,
//!    gets a clear refusal. The connection speaks the newest version both sides do. Nothing
//!    secret is in it.
//! 2. The dialler (initiator) sends Noise's first message: a fresh ephemeral key and its
//!    [`Claim`] (member id, or the number a client's id derives from), encrypted under a key mixed from
//!    a pre-shared key derived from the cluster secret (and the cluster name). Only a peer that
//!    knows the secret can produce or read it.
//! 3. The acceptor (responder) opens it (a peer that does not know the secret is refused here,
//!    before it was sent anything that depends on the secret), and answers with its ephemeral
//!    key, its static public key and its member id, sealed under keys from both ephemeral keys,
//!    the secret, and its static key: only the holder of that static key's private half can
//!    produce it.
//! 4. The dialler opens that answer and checks, in its [`Roster`], that the static key is one
//!    pinned for the member it dialled. It then sends its own static public key, sealed and
//!    mixed with its private key: the acceptor counts the dialler as authenticated only then,
//!    and only if the roster admits that key with the claim of step 2 (a member's key for that
//!    member id, or a client's key, the client's id derived from it). A replayed first message
//!    establishes nothing.
//!
//! Both preambles are Noise's prologue: a preamble changed on the way fails the handshake.
//! From then on every byte is sealed (see the [`crate::secure`] module). The ephemeral keys come
//! from the operating system's random source, through `snow`.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use snow::{Builder, HandshakeState};

use crate::frame;
use crate::keys::{KeyPair, PublicKey, KEY_BYTES};
use crate::roster::{client_id, Claim, Rejection, Roster};
use crate::secure::{self, Opener, Sealer};
use crate::transport::{is_client, NodeId, CLIENT_BIT};
use crate::wire::{OLDEST_WIRE_VERSION, WIRE_VERSION};

/// The Noise protocol every connection speaks.
pub const NOISE_PATTERN: &str = "Noise_XXpsk0_25519_ChaChaPoly_BLAKE2s";

/// Largest frame accepted before the peer has proved it knows the secret: a handshake needs
/// far less, and an unauthenticated peer gets no room for more.
pub const MAX_HANDSHAKE_FRAME: usize = 512;

/// Longest cluster name, in bytes (it must fit a handshake frame).
pub const MAX_CLUSTER_NAME: usize = 255;

/// Fixed bytes of the Noise prologue and of the pre-shared key's derivation.
const LABEL: &[u8] = b"atomos noise v2\0";

/// What each side sends first, in the clear.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preamble {
    /// The oldest wire version the sender speaks. Builds of version 17 sent only this and the
    /// cluster, meaning the one version they speak, and refuse a peer whose first field differs:
    /// so it comes first, and `newest` after the cluster, where they do not read.
    pub oldest: u16,
    /// The sender's cluster.
    pub cluster: String,
    /// The newest wire version the sender speaks (absent from a version 17 build's preamble).
    pub newest: u16,
}

/// The first wire version whose preamble carries [`Preamble::newest`]; a side speaking an older
/// one sends the preamble without it, as builds of that version did.
pub const RANGED_PREAMBLE_SINCE: u16 = 18;

/// A preamble as version 17 builds sent it.
#[derive(Serialize, Deserialize)]
struct PreambleV17 {
    version: u16,
    cluster: String,
}

impl Preamble {
    /// This side's preamble when it speaks up to `newest`, as bytes.
    fn encode(cluster: &str, newest: u16) -> Vec<u8> {
        let cluster = cluster.to_string();
        // A string and integers always encode; the name is bounded by `Identity::checked`.
        if newest < RANGED_PREAMBLE_SINCE {
            postcard::to_stdvec(&PreambleV17 {
                version: newest,
                cluster,
            })
            .unwrap_or_default()
        } else {
            postcard::to_stdvec(&Preamble {
                oldest: OLDEST_WIRE_VERSION,
                cluster,
                newest,
            })
            .unwrap_or_default()
        }
    }

    /// Reads a peer's preamble, in either form. Bytes after `newest` are left unread, as
    /// version 17 builds left `newest`: a later version may append fields (they are bound into
    /// the handshake all the same, as part of the prologue).
    pub fn decode(bytes: &[u8]) -> Result<Preamble, Refusal> {
        let malformed = |e: postcard::Error| Refusal::Malformed(format!("preamble: {e}"));
        let (old, rest): (PreambleV17, &[u8]) =
            postcard::take_from_bytes(bytes).map_err(malformed)?;
        let newest = match rest {
            [] => old.version,
            _ => {
                let (newest, _later_fields): (u16, &[u8]) =
                    postcard::take_from_bytes(rest).map_err(malformed)?;
                newest
            }
        };
        if newest < old.version {
            return Err(Refusal::Malformed(format!(
                "preamble: newest wire version {newest} below the oldest {}",
                old.version
            )));
        }
        Ok(Preamble {
            oldest: old.version,
            cluster: old.cluster,
            newest,
        })
    }
}

/// The wire versions one side speaks, oldest to newest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Speaks {
    /// The oldest.
    pub oldest: u16,
    /// The newest.
    pub newest: u16,
}

impl fmt::Display for Speaks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.oldest == self.newest {
            write!(f, "wire version {}", self.oldest)
        } else {
            write!(f, "wire versions {} to {}", self.oldest, self.newest)
        }
    }
}

/// This node's (or client's) identity for handshakes: its cluster, the cluster secret, its own
/// key pair, and what it claims to be.
#[derive(Clone)]
pub struct Identity {
    cluster: String,
    claim: Claim,
    node: NodeId,
    secret: Vec<u8>,
    keys: KeyPair,
    /// The newest wire version this side speaks.
    newest: u16,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity")
            .field("cluster", &self.cluster)
            .field("node", &self.node)
            .field("key", &self.keys.public())
            .field("newest", &self.newest)
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
    /// A member's id has the client bit set.
    #[error("member id {0} has the client bit set: a member's id must be below {CLIENT_BIT}")]
    ClientBit(NodeId),
    /// A wire version this build does not speak.
    #[error(
        "wire version {0} is not spoken by this build: it speaks {OLDEST_WIRE_VERSION} to \
         {WIRE_VERSION}"
    )]
    WireVersion(u16),
}

impl Identity {
    /// Member `node` of `cluster`, which knows `secret` and holds `keys`.
    pub fn member(
        cluster: impl Into<String>,
        node: NodeId,
        secret: impl Into<Vec<u8>>,
        keys: KeyPair,
    ) -> Result<Identity, IdentityError> {
        if is_client(node) {
            return Err(IdentityError::ClientBit(node));
        }
        Identity::checked(
            cluster.into(),
            Claim::Member(node),
            node,
            secret.into(),
            keys,
        )
    }

    /// A client of `cluster`, which knows `secret` and holds `keys`. Its id is derived from its
    /// key and a number drawn now (see [`client_id`]): each call makes a new one.
    pub fn client(
        cluster: impl Into<String>,
        secret: impl Into<Vec<u8>>,
        keys: KeyPair,
    ) -> Result<Identity, IdentityError> {
        let nonce = rand::random::<u64>();
        let node = client_id(&keys.public(), nonce);
        Identity::checked(
            cluster.into(),
            Claim::Client { nonce },
            node,
            secret.into(),
            keys,
        )
    }

    fn checked(
        cluster: String,
        claim: Claim,
        node: NodeId,
        secret: Vec<u8>,
        keys: KeyPair,
    ) -> Result<Identity, IdentityError> {
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
            claim,
            node,
            secret,
            keys,
            newest: WIRE_VERSION,
        })
    }

    /// This identity speaking wire versions up to `newest` only (from
    /// [`OLDEST_WIRE_VERSION`]): its connections speak the previous release's messages, and,
    /// below [`RANGED_PREAMBLE_SINCE`], open with that release's preamble. A stand-in for a
    /// member not yet upgraded.
    pub fn speaking_up_to(mut self, newest: u16) -> Result<Identity, IdentityError> {
        if !(OLDEST_WIRE_VERSION..=WIRE_VERSION).contains(&newest) {
            return Err(IdentityError::WireVersion(newest));
        }
        self.newest = newest;
        Ok(self)
    }

    /// The wire versions this identity speaks.
    pub fn speaks(&self) -> Speaks {
        Speaks {
            oldest: OLDEST_WIRE_VERSION,
            newest: self.newest,
        }
    }

    /// The node id: a member's own, or a client's derived one (with [`CLIENT_BIT`] set).
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The public key this identity proves.
    pub fn public_key(&self) -> PublicKey {
        self.keys.public()
    }

    /// Noise's pre-shared key: HMAC-SHA256 keyed with the secret over a label and the cluster.
    fn psk(&self) -> [u8; 32] {
        // HMAC accepts keys of any length; `Identity::checked` refuses an empty one.
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
    /// The side that dialled: it speaks first and proves itself last.
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
    /// The peer speaks no wire version this node does.
    #[error("peer speaks {theirs}, this node {ours}: no version in common")]
    Version {
        /// Ours.
        ours: Speaks,
        /// The peer's.
        theirs: Speaks,
    },
    /// The peer's handshake does not open with the cluster secret and the keys it claims: it
    /// does not know the secret, does not hold its key, or the handshake was tampered with.
    #[error("peer's handshake does not open with the cluster secret")]
    BadProof,
    /// The peer claims this node's own id.
    #[error("peer claims this node's own id {0}")]
    SameNode(u64),
    /// The peer proved a key that the roster does not admit with its claim.
    #[error("{0}")]
    Rejected(#[from] Rejection),
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
        /// The peer's node id (a client's derived from its key).
        peer: NodeId,
        /// The wire version the connection speaks: the newest both sides do.
        version: u16,
        /// The static key the peer proved.
        key: PublicKey,
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
            Progress::Established {
                peer, key, version, ..
            } => {
                write!(
                    f,
                    "Established {{ peer: {peer}, key: {key:?}, version: {version} }}"
                )
            }
        }
    }
}

enum State {
    AwaitPreamble,
    /// Responder: the dialler's first Noise message.
    AwaitFirst(Box<HandshakeState>),
    /// Initiator: the acceptor's answer.
    AwaitAnswer(Box<HandshakeState>),
    /// Responder: the dialler's static key, proving its claim.
    AwaitConfirm {
        noise: Box<HandshakeState>,
        claim: Claim,
    },
    Over(&'static str),
}

/// One side of one connection's handshake.
pub struct Handshake {
    me: Identity,
    roster: Arc<Roster>,
    role: Role,
    /// The dialler's peer: any other is refused before it is sent the dialler's key.
    dialled: Option<NodeId>,
    preamble: Vec<u8>,
    /// The wire version agreed, once the peer's preamble is read.
    version: u16,
    state: State,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake")
            .field("me", &self.me)
            .field("role", &self.role)
            .field("dialled", &self.dialled)
            .finish_non_exhaustive()
    }
}

impl Handshake {
    /// Starts dialling member `peer` (only it is accepted, proven by a key `roster` pins for
    /// it) and appends the frames to send now (the preamble) to `out`.
    pub fn dial(me: Identity, roster: Arc<Roster>, peer: NodeId, out: &mut Vec<u8>) -> Handshake {
        Handshake::start(me, roster, Some(peer), out)
    }

    /// Starts answering a peer that connected (admitted as `roster` says) and appends the
    /// frames to send now (the preamble) to `out`.
    pub fn accept(me: Identity, roster: Arc<Roster>, out: &mut Vec<u8>) -> Handshake {
        Handshake::start(me, roster, None, out)
    }

    fn start(
        me: Identity,
        roster: Arc<Roster>,
        dialled: Option<NodeId>,
        out: &mut Vec<u8>,
    ) -> Handshake {
        let preamble = Preamble::encode(&me.cluster, me.newest);
        let _ = frame::encode(&preamble, MAX_HANDSHAKE_FRAME, out);
        let version = me.newest;
        Handshake {
            me,
            roster,
            role: if dialled.is_some() {
                Role::Initiator
            } else {
                Role::Responder
            },
            dialled,
            preamble,
            version,
            state: State::AwaitPreamble,
        }
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
                    .and_then(|b| b.local_private_key(self.me.keys.private_bytes()))
                    .map_err(noise)?;
                match self.role {
                    Role::Initiator => {
                        let mut noise_state = builder.build_initiator().map_err(noise)?;
                        write_noise(&mut noise_state, &encode_claim(self.me.claim), out)?;
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
                let claim = decode_claim(&read_noise(&mut noise_state, payload)?)?;
                if claim == Claim::Member(self.me.node) {
                    return Err(Refusal::SameNode(self.me.node));
                }
                write_noise(&mut noise_state, &encode_claim(self.me.claim), out)?;
                self.state = State::AwaitConfirm {
                    noise: noise_state,
                    claim,
                };
                Ok(Progress::Pending)
            }
            State::AwaitAnswer(mut noise_state) => {
                let claim = decode_claim(&read_noise(&mut noise_state, payload)?)?;
                let found = match claim {
                    Claim::Member(found) => found,
                    Claim::Client { .. } => {
                        return Err(Refusal::Malformed(
                            "the acceptor claims to be a client".into(),
                        ))
                    }
                };
                // The answer is sealed with the acceptor's static key: it holds that key.
                let key = remote_static(&noise_state)?;
                let peer = self.roster.admit(claim, &key)?;
                if let Some(expected) = self.dialled.filter(|&e| e != peer) {
                    return Err(Refusal::UnexpectedPeer { expected, found });
                }
                write_noise(&mut noise_state, &[], out)?;
                let (sealer, opener) = into_channel(*noise_state)?;
                self.state = State::Over("finished");
                Ok(Progress::Established {
                    peer,
                    version: self.version,
                    key,
                    sealer,
                    opener,
                })
            }
            State::AwaitConfirm {
                noise: mut noise_state,
                claim,
            } => {
                let plain = read_noise(&mut noise_state, payload)?;
                if !plain.is_empty() {
                    return Err(Refusal::Malformed("the confirmation carries data".into()));
                }
                let key = remote_static(&noise_state)?;
                let peer = self.roster.admit(claim, &key)?;
                let (sealer, opener) = into_channel(*noise_state)?;
                self.state = State::Over("finished");
                Ok(Progress::Established {
                    peer,
                    version: self.version,
                    key,
                    sealer,
                    opener,
                })
            }
            State::Over(how) => Err(Refusal::Over(how)),
        }
    }

    /// Checks the peer's preamble and settles the wire version; returns the preamble's bytes.
    fn check_preamble<'a>(&mut self, payload: &'a [u8]) -> Result<&'a [u8], Refusal> {
        let theirs = Preamble::decode(payload)?;
        let ours = self.me.speaks();
        let version = ours.newest.min(theirs.newest);
        if version < ours.oldest.max(theirs.oldest) {
            return Err(Refusal::Version {
                ours,
                theirs: Speaks {
                    oldest: theirs.oldest,
                    newest: theirs.newest,
                },
            });
        }
        if theirs.cluster != self.me.cluster {
            return Err(Refusal::WrongCluster {
                ours: self.me.cluster.clone(),
                theirs: theirs.cluster,
            });
        }
        self.version = version;
        Ok(payload)
    }
}

/// A claim on the wire: a kind byte (0 member, 1 client) and the id or number, big-endian.
fn encode_claim(claim: Claim) -> [u8; 9] {
    let (kind, value) = match claim {
        Claim::Member(id) => (0, id),
        Claim::Client { nonce } => (1, nonce),
    };
    let mut bytes = [kind; 9];
    bytes[1..].copy_from_slice(&value.to_be_bytes());
    bytes
}

fn decode_claim(bytes: &[u8]) -> Result<Claim, Refusal> {
    let malformed = || Refusal::Malformed(format!("a claim of {} bytes", bytes.len()));
    let (&kind, value) = bytes.split_first().ok_or_else(malformed)?;
    let value = u64::from_be_bytes(value.try_into().map_err(|_| malformed())?);
    match kind {
        0 => Ok(Claim::Member(value)),
        1 => Ok(Claim::Client { nonce: value }),
        other => Err(Refusal::Malformed(format!("a claim of kind {other}"))),
    }
}

/// Appends this side's next Noise message, carrying `payload`, as a frame.
fn write_noise(
    noise_state: &mut HandshakeState,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), Refusal> {
    let mut message = [0u8; MAX_HANDSHAKE_FRAME];
    let n = noise_state
        .write_message(payload, &mut message)
        .map_err(noise)?;
    frame::encode(&message[..n], MAX_HANDSHAKE_FRAME, out)
        .map_err(|e| Refusal::Malformed(e.to_string()))
}

/// Opens the peer's Noise message; returns its payload.
fn read_noise(noise_state: &mut HandshakeState, payload: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut plain = [0u8; MAX_HANDSHAKE_FRAME];
    let n = noise_state
        .read_message(payload, &mut plain)
        .map_err(|_| Refusal::BadProof)?;
    Ok(plain[..n].to_vec())
}

/// The static key the peer proved in the message just read.
fn remote_static(noise_state: &HandshakeState) -> Result<PublicKey, Refusal> {
    let key: [u8; KEY_BYTES] = noise_state
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| Refusal::Malformed("no static key from the peer".into()))?;
    Ok(PublicKey::from(key))
}

fn into_channel(noise_state: HandshakeState) -> Result<(Sealer, Opener), Refusal> {
    let keys = noise_state.into_stateless_transport_mode().map_err(noise)?;
    Ok(secure::split(keys))
}

fn noise(e: snow::Error) -> Refusal {
    Refusal::Malformed(format!("noise: {e}"))
}
