//! Checks of single configuration values: addresses, membership lists, domain prefixes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;

use atomos_net::transport::is_client;

use super::{invalid, ConfigError, Peer};

/// The metrics endpoint's address: a port alone means 127.0.0.1.
pub(super) fn metrics_address(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    match value.trim().parse::<u16>() {
        Ok(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => address(key, value),
    }
}

pub(super) fn address(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    SocketAddr::from_str(value.trim()).map_err(|_| {
        invalid(
            key,
            format!("{value:?} is not an address like 127.0.0.1:7400"),
        )
    })
}

/// Consistency domains' prefixes: none empty (domain 0 takes every key no prefix names), none
/// twice.
pub(super) fn check_domains(key: &str, prefixes: &[String]) -> Result<(), ConfigError> {
    for (i, p) in prefixes.iter().enumerate() {
        if p.is_empty() {
            return Err(invalid(
                key,
                "a domain's prefix must not be empty (domain 0 holds every key no prefix names)",
            ));
        }
        if prefixes[..i].contains(p) {
            return Err(invalid(key, format!("the prefix {p:?} is listed twice")));
        }
    }
    Ok(())
}

pub(super) fn parse_peer_list(list: &str) -> Result<Vec<Peer>, ConfigError> {
    let mut peers = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((id, addr)) = item.split_once('=') else {
            return Err(invalid(
                "ATOMOS_PEERS",
                format!("{item:?} is not id=address"),
            ));
        };
        let id = id
            .trim()
            .parse()
            .map_err(|_| invalid("ATOMOS_PEERS", format!("{id:?} is not a node id")))?;
        peers.push(Peer {
            id,
            address: address("ATOMOS_PEERS", addr)?,
        });
    }
    Ok(peers)
}

/// The membership list may name this node too (one list for the whole cluster): then its
/// address must be ours, and it is dropped from the peers. Ids must be unique.
pub(super) fn check_members(
    me: u64,
    listen: SocketAddr,
    members: Vec<Peer>,
) -> Result<Vec<Peer>, ConfigError> {
    let mut seen: BTreeMap<u64, SocketAddr> = BTreeMap::new();
    let mut peers = Vec::new();
    for p in members {
        if is_client(p.id) {
            return Err(invalid(
                "peers",
                format!("{} is not a node id (ids of members are below 2^63)", p.id),
            ));
        }
        if seen.insert(p.id, p.address).is_some() {
            return Err(invalid(
                "peers",
                format!("node id {} is listed twice", p.id),
            ));
        }
        if p.id != me && p.address == listen {
            return Err(invalid(
                "peers",
                format!(
                    "peer {} is listed at this node's own address {listen}",
                    p.id
                ),
            ));
        }
        if let Some((other, _)) = seen.iter().find(|(id, a)| **id != p.id && **a == p.address) {
            return Err(invalid(
                "peers",
                format!(
                    "nodes {other} and {} are both listed at {}",
                    p.id, p.address
                ),
            ));
        }
        if p.id == me {
            if p.address != listen {
                return Err(invalid(
                    "peers",
                    format!(
                        "this node ({me}) is listed at {}, but listens on {listen}",
                        p.address
                    ),
                ));
            }
            continue;
        }
        peers.push(p);
    }
    Ok(peers)
}
