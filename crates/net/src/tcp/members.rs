//! Members joining and leaving a running transport (the replicated log's membership changes),
//! and the clients connected.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{dial_loop, invalid, Link, TcpTransport};
use crate::counters::LinkCounters;
use crate::keys::PublicKey;
use crate::transport::{is_client, NodeId};
use crate::wire::WireMessage;

impl<M> TcpTransport<M>
where
    M: Serialize + DeserializeOwned + WireMessage + Send + 'static,
{
    /// Member `id`, listening at `addr` and proving one of `keys`, joined the cluster: it is
    /// admitted, sent to, and dialled if its id is above this node's (the lower id dials, as
    /// at start) or if this is a client's transport (a client dials every member). A member
    /// known already at another address is reached at the new one from now on. Must be called
    /// inside a tokio runtime.
    pub fn add_member(&self, id: NodeId, addr: SocketAddr, keys: Vec<PublicKey>) -> io::Result<()> {
        let s = &self.shared;
        let me = s.cfg.identity.node();
        if id == me || is_client(id) {
            return Err(invalid(format!(
                "member {id} cannot be added here: it is this node, or its id has the client bit"
            )));
        }
        if keys.is_empty() {
            return Err(invalid(format!(
                "member {id} has no public key: its connections could not be authenticated"
            )));
        }
        s.cfg.roster.add_member(id, keys);
        let link = {
            let mut links = s.links.write();
            if links.get(&id).is_some_and(|l| l.addr == addr) {
                return Ok(());
            }
            let link = Arc::new(Link::new(
                id,
                addr,
                LinkCounters::new(me, id),
                s.stop.child_token(),
                crate::wire::OLDEST_WIRE_VERSION,
            ));
            if let Some(old) = links.insert(id, link.clone()) {
                old.leave();
            }
            link
        };
        // A client listens nowhere: it dials every member.
        if (id > me || is_client(me)) && !s.stop.is_cancelled() {
            tokio::spawn(dial_loop(s.clone(), link));
        }
        Ok(())
    }

    /// The wire version the connection to member or client `peer` speaks, if one is open now.
    pub fn wire_version(&self, peer: NodeId) -> Option<u16> {
        let link = self
            .shared
            .member_link(peer)
            .or_else(|| self.shared.clients.lock().get(&peer).cloned())?;
        // Read under the connection's lock, which its version is set under.
        let current = link.current.lock();
        current.is_some().then(|| link.version())
    }

    /// How many clients are connected now.
    pub fn clients_connected(&self) -> usize {
        self.shared.clients.lock().len()
    }

    /// The key client `id`'s current connection proved (`None`: no client of that id is
    /// connected).
    pub fn client_key(&self, id: NodeId) -> Option<PublicKey> {
        self.shared
            .clients
            .lock()
            .get(&id)
            .and_then(|link| link.key)
    }

    /// Member `id` left the cluster: it is no longer admitted (its connections close), sent
    /// to or dialled.
    pub fn remove_member(&self, id: NodeId) {
        let s = &self.shared;
        s.cfg.roster.remove_member(id);
        if let Some(link) = s.links.write().remove(&id) {
            link.leave();
        }
    }
}
