//! Membership changes as a node sees them: what a member added through the log carries (the
//! change's context: where it listens and the keys it proves), and how the node's TCP
//! transport follows the membership the order replica applies (a member added is admitted
//! and dialled, one removed is refused and forgotten).
//!
//! Only `certify` and `active` change membership: their replicas order everything through
//! the order layer, whose log carries the changes. `tfa` keeps objects on their owners, and
//! `oss` counts its members in its epochs and watermarks: both run with the members they
//! started with, and a change is refused with an error saying so.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use atomos_net::keys::PublicKey;
use atomos_net::rpc::Envelope;
use atomos_net::tcp::TcpTransport;
use atomos_net::transport::{NodeId, Transport};
use atomos_order::Membership;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use std::collections::BTreeSet;

use atomos_order::MemberChange;
use parking_lot::RwLock;

use crate::ordering::MembershipHook;
use crate::wire::{MemberRequest, NodeMsg};

/// What the members need to know of a member added through the log: where it listens and the
/// keys it may prove. Carried as the change's context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberInfo {
    /// Where it listens.
    pub address: SocketAddr,
    /// The keys it may prove (one; two while it rotates its key).
    pub public_keys: Vec<PublicKey>,
}

/// The context's layout, version 1 (the first byte says which).
#[derive(Serialize, Deserialize)]
struct MemberInfoV1 {
    address: String,
    public_keys: Vec<String>,
}

const MEMBER_INFO_V1: u8 = 1;

impl MemberInfo {
    /// The bytes a membership change carries.
    pub fn encode(&self) -> Vec<u8> {
        let v1 = MemberInfoV1 {
            address: self.address.to_string(),
            public_keys: self.public_keys.iter().map(|k| k.to_string()).collect(),
        };
        let mut bytes = vec![MEMBER_INFO_V1];
        // Strings only: postcard cannot fail on them.
        bytes.extend(postcard::to_stdvec(&v1).unwrap_or_default());
        bytes
    }

    /// What a membership change carried, or why it cannot be read.
    pub fn decode(bytes: &[u8]) -> Result<MemberInfo, String> {
        let Some((&version, rest)) = bytes.split_first() else {
            return Err("no member information".into());
        };
        if version != MEMBER_INFO_V1 {
            return Err(format!("member information of unknown version {version}"));
        }
        let v1: MemberInfoV1 = postcard::from_bytes(rest).map_err(|e| e.to_string())?;
        let address = v1
            .address
            .parse()
            .map_err(|e| format!("address {:?}: {e}", v1.address))?;
        let public_keys = v1
            .public_keys
            .iter()
            .map(|k| k.parse().map_err(|e| format!("public key {k:?}: {e}")))
            .collect::<Result<Vec<PublicKey>, String>>()?;
        if public_keys.is_empty() {
            return Err("no public key".into());
        }
        Ok(MemberInfo {
            address,
            public_keys,
        })
    }
}

impl MemberRequest {
    /// The change it asks for, or why it cannot be made (an address or a key that does not
    /// parse, no key).
    pub fn to_change(&self) -> Result<MemberChange, String> {
        Ok(match self {
            MemberRequest::AddLearner {
                id,
                address,
                public_keys,
            } => {
                if *id == 0 || atomos_net::transport::is_client(*id) {
                    return Err(format!(
                        "member id {id}: a member's id is above 0 and below 2^63"
                    ));
                }
                let address: SocketAddr = address
                    .parse()
                    .map_err(|e| format!("address {address:?} of member {id}: {e}"))?;
                let public_keys = public_keys
                    .iter()
                    .map(|k| {
                        k.parse()
                            .map_err(|e| format!("public key {k:?} of member {id}: {e}"))
                    })
                    .collect::<Result<Vec<PublicKey>, String>>()?;
                if public_keys.is_empty() {
                    return Err(format!("member {id} has no public key"));
                }
                let context = MemberInfo {
                    address,
                    public_keys,
                }
                .encode();
                MemberChange::AddLearner { id: *id, context }
            }
            MemberRequest::Promote { id } => MemberChange::Promote { id: *id },
            MemberRequest::Remove { id } => MemberChange::Remove { id: *id },
            MemberRequest::Replace { remove, add } => MemberChange::Replace {
                remove: *remove,
                add: *add,
            },
        })
    }
}

/// Which clients may change the membership: the operators, by the name their key is listed
/// under, and how a node tells a connected client's name.
#[derive(Default)]
pub(crate) struct Operators {
    names: RwLock<BTreeSet<String>>,
    /// The name of the client connected with an id (over TCP: by the key its connection
    /// proved); unset on other transports, where no client is an operator.
    who: std::sync::OnceLock<Arc<dyn Fn(NodeId) -> Option<String> + Send + Sync>>,
}

impl Operators {
    /// The clients listed under these names are operators from now on.
    pub(crate) fn set_names(&self, names: impl IntoIterator<Item = String>) {
        *self.names.write() = names.into_iter().collect();
    }

    /// How the node tells a connected client's name.
    pub(crate) fn set_who(&self, who: Arc<dyn Fn(NodeId) -> Option<String> + Send + Sync>) {
        let _ = self.who.set(who);
    }

    /// Whether client `id` is an operator, or why not.
    pub(crate) fn check(&self, id: NodeId) -> Result<(), String> {
        let name = self.who.get().and_then(|who| who(id));
        match name {
            Some(name) if self.names.read().contains(&name) => Ok(()),
            Some(name) => Err(format!(
                "client {name:?} is not an operator: list it in the members' `operators` to let \
                 it change the membership"
            )),
            None => Err("this client is not an operator (no operator is known here)".into()),
        }
    }
}

/// The hook that keeps node `me`'s TCP transport in step with the membership: members added
/// through the log (with their information) are admitted and reached, unless the transport
/// knows them already (keys rotated since, through the configuration, stay); members a change
/// removed are refused and forgotten, at start too where a configuration file still lists
/// them. Members the log does not know yet are left alone (a replica whose log lags must still
/// hear from them).
pub(crate) fn transport_follows(
    me: NodeId,
    transport: Weak<TcpTransport<Envelope<NodeMsg>>>,
) -> MembershipHook {
    MembershipHook(Arc::new(move |before, now: &Membership| {
        let Some(transport) = transport.upgrade() else {
            return;
        };
        let known = transport.peers();
        for (&id, context) in &now.contexts {
            if id == me || known.contains(&id) {
                continue;
            }
            match MemberInfo::decode(context) {
                Ok(info) => {
                    if let Err(e) = transport.add_member(id, info.address, info.public_keys) {
                        warn!(node = me, member = id, error = %e, "cannot reach a new member");
                    }
                }
                Err(e) => warn!(node = me, member = id, error = %e,
                    "a member was added without information this node can read: not reached"),
            }
        }
        let left = before.map(Membership::all).unwrap_or_default();
        let gone = left.into_iter().filter(|&id| !now.contains(id));
        let gone: BTreeSet<NodeId> = gone.chain(now.removed.iter().copied()).collect();
        for id in gone {
            if id != me && known.contains(&id) {
                info!(node = me, member = id, "member removed: no longer admitted");
                transport.remove_member(id);
            }
        }
    }))
}

/// How often a joining node asks its configured peers for the membership.
const DISCOVER_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// While a joining node's replica knows no membership (before its first snapshot), asks the
/// peers its configuration lists for theirs and admits the members the cluster added through
/// its log: the leader that will send the snapshot may be one its file does not list, whose
/// connections it would otherwise refuse. Ends once the replica knows a membership (from then
/// on [`transport_follows`] keeps the transport current) or the node stops.
pub(crate) async fn discover_members(
    me: NodeId,
    rpc: atomos_net::rpc::Rpc<NodeMsg>,
    transport: Weak<TcpTransport<Envelope<NodeMsg>>>,
    health: Arc<crate::health::Health>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut warned = BTreeSet::new();
    loop {
        if health.replica().is_some_and(|r| r.knows_members()) {
            return;
        }
        let Some(peers) = transport.upgrade().map(|t| t.peers()) else {
            return;
        };
        for peer in peers {
            let answer = tokio::select! {
                _ = stop.cancelled() => return,
                a = rpc.request(peer, NodeMsg::Status, DISCOVER_EVERY) => a,
            };
            let Ok(NodeMsg::StatusReport(status)) = answer else {
                continue;
            };
            let Some(transport) = transport.upgrade() else {
                return;
            };
            let known = transport.peers();
            let view = status.replica.iter().flat_map(|r| r.added_members());
            for (id, address, keys) in view.filter(|(id, ..)| *id != me && !known.contains(id)) {
                match transport.add_member(id, address, keys) {
                    Ok(()) => {
                        let what = "joining: member learned from a peer";
                        info!(node = me, member = id, %address, peer, "{what}")
                    }
                    Err(e) if warned.insert(id) => {
                        warn!(node = me, member = id, error = %e, "joining: cannot reach a member")
                    }
                    Err(_) => {}
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(DISCOVER_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use atomos_net::keys::KeyPair;

    #[test]
    fn member_information_round_trips_and_garbage_is_an_error() {
        let info = MemberInfo {
            address: "10.0.0.4:7400".parse().unwrap(),
            public_keys: vec![KeyPair::from_private([4; 32]).unwrap().public()],
        };
        assert_eq!(MemberInfo::decode(&info.encode()), Ok(info.clone()));
        assert!(MemberInfo::decode(&[]).is_err());
        assert!(MemberInfo::decode(&[9, 1, 2])
            .unwrap_err()
            .contains("version 9"));
        let mut bytes = info.encode();
        bytes.truncate(5);
        assert!(MemberInfo::decode(&bytes).is_err());
        let none = MemberInfo {
            public_keys: Vec::new(),
            ..info
        };
        assert_eq!(
            MemberInfo::decode(&none.encode()),
            Err("no public key".into())
        );
    }
}
