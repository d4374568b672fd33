//! Checks of single configuration values: addresses, membership lists, domain prefixes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::str::FromStr;

use atomos_net::keys::{KeyPair, PublicKey};
use atomos_net::transport::is_client;

use serde::Deserialize;
use toml::Table;

use super::setting::Raw;
use super::{invalid, ClientKey, ConfigError, Peer};

/// The metrics endpoint's address: a port alone means 127.0.0.1.
pub(super) fn metrics_address(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    match value.trim().parse::<u16>() {
        Ok(port) => Ok(SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => address(key, value),
    }
}

/// An address: an IP address and port, or a host name and port, resolved now (once, when the
/// configuration loads; the first address the name resolves to).
pub(super) fn address(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    let value = value.trim();
    if let Ok(addr) = SocketAddr::from_str(value) {
        return Ok(addr);
    }
    let not_one = |why: String| {
        invalid(
            key,
            format!(
                "{value:?} is not an address like 127.0.0.1:7400 or a host name with a port \
                 (node1.example:7400): {why}"
            ),
        )
    };
    // Only a name with a port is looked up (a bare word is a mistake, not a host).
    if !value
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
    {
        return Err(not_one("no port".into()));
    }
    std::net::ToSocketAddrs::to_socket_addrs(value)
        .map_err(|e| not_one(e.to_string()))?
        .next()
        .ok_or_else(|| not_one("the name resolves to no address".into()))
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

/// Public keys in hex, blamed on `key` if one is not.
pub(super) fn public_keys(key: &str, keys: &[String]) -> Result<Vec<PublicKey>, ConfigError> {
    keys.iter().map(|k| public_key(key, k)).collect()
}

/// A public key in hex, blamed on `key` if it is not one.
fn public_key(key: &str, text: &str) -> Result<PublicKey, ConfigError> {
    text.parse::<PublicKey>().map_err(|e| {
        invalid(
            key,
            format!("{e} (a public key, as `atomos keygen` prints)"),
        )
    })
}

/// A member as a file's `[[peers]]` section gives it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    id: u64,
    address: String,
    public_key: Option<OneOrMany>,
}

/// A client as a file's `[[clients]]` section gives it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileClient {
    name: String,
    public_key: String,
}

/// A key, or a list of keys (a member whose key is being rotated).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(super) fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(key) => vec![key],
            OneOrMany::Many(keys) => keys,
        }
    }
}

/// Section `i` of the array of tables `name`, as `T`.
fn section<T: serde::de::DeserializeOwned>(
    name: &str,
    i: usize,
    table: Table,
) -> Result<T, ConfigError> {
    toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| invalid(&format!("{name}[{i}]"), e.message().to_string()))
}

/// The members: a file's `[[peers]]` sections, or a variable's `id=address/key,...` (several
/// keys of one member as `key/key`). A variable set but empty is refused: it would replace the
/// file's members with none, and a member would then commit alone.
pub(super) fn peer_list(name: &str, raw: Raw) -> Result<Vec<Peer>, ConfigError> {
    let list = match raw {
        Raw::Tables(sections) => {
            let mut peers = Vec::new();
            for (i, table) in sections.into_iter().enumerate() {
                let p: FilePeer = section(name, i, table)?;
                let keys = p.public_key.map(OneOrMany::into_vec).unwrap_or_default();
                peers.push(Peer {
                    id: p.id,
                    address: address(&format!("{name}[{i}].address"), &p.address)?,
                    public_keys: public_keys(&format!("{name}[{i}].public_key"), &keys)?,
                });
            }
            return Ok(peers);
        }
        Raw::Text(list) => list,
        Raw::List(items) => items.join(","),
    };
    if list.trim().is_empty() {
        return Err(invalid(
            name,
            "is set but empty: it would replace the file's members with none, and a node of a \
             cluster would then commit alone; unset it to use the file's peers",
        ));
    }
    let mut peers = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((id, rest)) = item.split_once('=') else {
            return Err(invalid(
                name,
                format!("{item:?} is not id=address/public_key"),
            ));
        };
        let id = id
            .trim()
            .parse()
            .map_err(|_| invalid(name, format!("{id:?} is not a node id")))?;
        let mut parts = rest.split('/');
        let addr = parts.next().unwrap_or_default();
        let keys: Vec<String> = parts.map(str::to_string).collect();
        peers.push(Peer {
            id,
            address: address(name, addr)?,
            public_keys: public_keys(name, &keys)?,
        });
    }
    Ok(peers)
}

/// The clients admitted: a file's `[[clients]]` sections, or a variable's `name=key,...`.
pub(super) fn client_list(name: &str, raw: Raw) -> Result<Vec<ClientKey>, ConfigError> {
    let list = match raw {
        Raw::Tables(sections) => {
            let mut clients = Vec::new();
            for (i, table) in sections.into_iter().enumerate() {
                let c: FileClient = section(name, i, table)?;
                let key = format!("{name}[{i}].public_key");
                let public_key = public_key(&key, &c.public_key)?;
                clients.push(ClientKey {
                    name: c.name,
                    public_key,
                });
            }
            return Ok(clients);
        }
        Raw::Text(list) => list,
        Raw::List(items) => items.join(","),
    };
    let mut clients = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((client, key)) = item.split_once('=') else {
            return Err(invalid(name, format!("{item:?} is not name=public_key")));
        };
        clients.push(ClientKey {
            name: client.trim().to_string(),
            public_key: public_key(name, key)?,
        });
    }
    Ok(clients)
}

/// Where the members and the clients were read from (the file's key or the variable), to
/// blame in errors.
#[derive(Clone, Copy)]
pub(super) struct KeySources<'a> {
    pub(super) peers: &'a str,
    pub(super) clients: &'a str,
}

/// Every other member has a key; this node's entry, if it lists keys, lists its own; no key
/// belongs to two principals; clients have names, each once.
pub(super) fn check_keys(
    me: u64,
    own: Option<&KeyPair>,
    members: &[Peer],
    clients: &[ClientKey],
    sources: KeySources<'_>,
) -> Result<(), ConfigError> {
    let mut holders: BTreeMap<PublicKey, String> = BTreeMap::new();
    let mut hold = |key: PublicKey, who: String| match holders.insert(key, who.clone()) {
        Some(other) if other != who => Err(invalid(
            if who.starts_with("client") {
                sources.clients
            } else {
                sources.peers
            },
            format!(
                "the public key {} is listed for both {other} and {who}: every member and \
                 client has a key of its own",
                key.fingerprint()
            ),
        )),
        _ => Ok(()),
    };
    for p in members {
        if p.id == me {
            if let Some(own) =
                own.filter(|k| !p.public_keys.is_empty() && !p.public_keys.contains(&k.public()))
            {
                return Err(invalid(
                    sources.peers,
                    format!(
                        "this node's own entry ({me}) lists public keys of which none is its \
                         key file's ({})",
                        own.public()
                    ),
                ));
            }
        } else if p.public_keys.is_empty() {
            return Err(invalid(
                sources.peers,
                format!(
                    "member {} has no public_key: a member's connections are authenticated by \
                     its key (its `atomos keygen` printed it)",
                    p.id
                ),
            ));
        }
        for key in &p.public_keys {
            hold(*key, format!("member {}", p.id))?;
        }
    }
    if let Some(own) = own {
        hold(own.public(), format!("member {me}"))?;
    }
    let mut names = std::collections::BTreeSet::new();
    for c in clients {
        if c.name.trim().is_empty() {
            return Err(invalid(
                sources.clients,
                "a client's name must not be empty",
            ));
        }
        if !names.insert(c.name.as_str()) {
            return Err(invalid(
                sources.clients,
                format!("the client name {:?} is listed twice", c.name),
            ));
        }
        hold(c.public_key, format!("client {:?}", c.name))?;
    }
    Ok(())
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
