//! Who may connect, and as whom: the members' public keys by node id, and the clients' public
//! keys by name. A handshake proves which static key the peer holds; the roster turns that key
//! and the peer's claim into an identity, or refuses it.
//!
//! - A peer claiming member id `n` is admitted only with one of the keys pinned for `n`. A
//!   client key never passes as a member, whatever id it claims.
//! - A client's id is not its to choose: it is derived from its key and a number it draws once
//!   per identity ([`client_id`]), so a client can speak only for its own key.
//! - The roster can change while connections run (a reload of the configuration): every
//!   connection is told ([`Roster::subscribe`]) and closes itself once its key is no longer
//!   admitted. Members may have several keys at once while one is rotated.

use std::collections::BTreeMap;

use parking_lot::RwLock;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::keys::PublicKey;
use crate::transport::{NodeId, CLIENT_BIT};

/// What a peer says it is, in its first handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Member `id`.
    Member(NodeId),
    /// A client; its id is derived from its key and this number.
    Client {
        /// Drawn at random when the client's identity is made (once per `Identity::client`,
        /// the same on every connection of that identity).
        nonce: u64,
    },
}

/// Why the roster refuses a peer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// A client's key claims a member's id.
    #[error("client {client:?}'s key claims member id {claimed}: clients never speak as members")]
    ClientAsMember {
        /// The id claimed.
        claimed: NodeId,
        /// The client's name in the roster.
        client: String,
    },
    /// A member's key claims another member's id.
    #[error("member {holder}'s key claims member id {claimed}")]
    OtherMembersKey {
        /// The id claimed.
        claimed: NodeId,
        /// The member the key belongs to.
        holder: NodeId,
    },
    /// The id claimed is no member of this cluster.
    #[error("node {0} is not a member of this cluster")]
    NotAMember(NodeId),
    /// The key is not one of the claimed member's keys, nor anyone else's.
    #[error("key {key} is not a key of member {claimed}")]
    WrongMemberKey {
        /// The id claimed.
        claimed: NodeId,
        /// The key's fingerprint.
        key: String,
    },
    /// A member's key connecting as a client.
    #[error("member {0}'s key connects as a client")]
    MemberAsClient(NodeId),
    /// The key is no client's (never listed, or revoked).
    #[error("key {0} is not a client key of this cluster (unknown or revoked)")]
    UnknownClient(String),
}

/// The keys a node admits. Shared between the transport and whoever reloads the
/// configuration.
#[derive(Debug)]
pub struct Roster {
    keys: RwLock<Keys>,
    changed: watch::Sender<u64>,
}

#[derive(Debug, Default, Clone)]
struct Keys {
    members: BTreeMap<NodeId, Vec<PublicKey>>,
    clients: BTreeMap<PublicKey, String>,
}

impl Roster {
    /// A roster of `members` (each id with the keys it may prove) and `clients` (each key with
    /// the name it is known by).
    pub fn new(
        members: impl IntoIterator<Item = (NodeId, Vec<PublicKey>)>,
        clients: impl IntoIterator<Item = (PublicKey, String)>,
    ) -> Roster {
        let keys = Keys {
            members: members.into_iter().collect(),
            clients: clients.into_iter().collect(),
        };
        Roster {
            keys: RwLock::new(keys),
            changed: watch::Sender::new(0),
        }
    }

    /// The keys pinned for member `id` (empty if it is none).
    pub fn member_keys(&self, id: NodeId) -> Vec<PublicKey> {
        self.keys
            .read()
            .members
            .get(&id)
            .cloned()
            .unwrap_or_default()
    }

    /// The members, with their keys.
    pub fn members(&self) -> BTreeMap<NodeId, Vec<PublicKey>> {
        self.keys.read().members.clone()
    }

    /// The clients admitted, by key.
    pub fn clients(&self) -> BTreeMap<PublicKey, String> {
        self.keys.read().clients.clone()
    }

    /// Replaces the clients admitted; connections of clients no longer listed close.
    pub fn set_clients(&self, clients: impl IntoIterator<Item = (PublicKey, String)>) {
        self.keys.write().clients = clients.into_iter().collect();
        self.changed.send_modify(|n| *n += 1);
    }

    /// Replaces the keys of the members already known (the membership itself stays: a member
    /// missing from `members` keeps its keys); connections proven with a key no longer
    /// listed close.
    pub fn set_member_keys(&self, members: impl IntoIterator<Item = (NodeId, Vec<PublicKey>)>) {
        let mut keys = self.keys.write();
        for (id, new) in members {
            if let Some(pinned) = keys.members.get_mut(&id) {
                *pinned = new;
            }
        }
        drop(keys);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Admits member `id` proving one of `keys` from now on (a member that joined the
    /// cluster, or new keys for one already known: connections proven with a key no longer
    /// listed close).
    pub fn add_member(&self, id: NodeId, keys: Vec<PublicKey>) {
        self.keys.write().members.insert(id, keys);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Admits member `id` no more (it left the cluster): its connections close.
    pub fn remove_member(&self, id: NodeId) {
        self.keys.write().members.remove(&id);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Notifies of every change to the roster.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The id of a peer proven to hold `key` and claiming `claim`, or why it is refused.
    pub fn admit(&self, claim: Claim, key: &PublicKey) -> Result<NodeId, Rejection> {
        let keys = self.keys.read();
        let holder = || {
            keys.members
                .iter()
                .find(|(_, ks)| ks.contains(key))
                .map(|(&id, _)| id)
        };
        match claim {
            Claim::Member(claimed) => {
                if keys
                    .members
                    .get(&claimed)
                    .is_some_and(|ks| ks.contains(key))
                {
                    return Ok(claimed);
                }
                if let Some(client) = keys.clients.get(key) {
                    return Err(Rejection::ClientAsMember {
                        claimed,
                        client: client.clone(),
                    });
                }
                if let Some(holder) = holder() {
                    return Err(Rejection::OtherMembersKey { claimed, holder });
                }
                if !keys.members.contains_key(&claimed) {
                    return Err(Rejection::NotAMember(claimed));
                }
                Err(Rejection::WrongMemberKey {
                    claimed,
                    key: key.fingerprint(),
                })
            }
            Claim::Client { nonce } => {
                if let Some(member) = holder() {
                    return Err(Rejection::MemberAsClient(member));
                }
                if !keys.clients.contains_key(key) {
                    return Err(Rejection::UnknownClient(key.fingerprint()));
                }
                Ok(client_id(key, nonce))
            }
        }
    }

    /// Whether a connection already admitted as `peer` with `key` still is.
    pub fn still_admits(&self, peer: NodeId, key: &PublicKey) -> bool {
        let keys = self.keys.read();
        if peer & CLIENT_BIT != 0 {
            keys.clients.contains_key(key)
        } else {
            keys.members.get(&peer).is_some_and(|ks| ks.contains(key))
        }
    }

    /// The name of the client holding `key`, if it is one.
    pub fn client_name(&self, key: &PublicKey) -> Option<String> {
        self.keys.read().clients.get(key).cloned()
    }
}

/// The id of a client holding `key` on a connection it numbered `nonce`: the client bit and 63
/// bits of a SHA-256 hash of both. Another key cannot produce the same id short of a second
/// preimage of the hash.
pub fn client_id(key: &PublicKey, nonce: u64) -> NodeId {
    let mut hash = Sha256::new();
    hash.update(b"atomos client id v1\0");
    hash.update(key.as_bytes());
    hash.update(nonce.to_be_bytes());
    let digest = hash.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    CLIENT_BIT | (u64::from_be_bytes(first) >> 1)
}
