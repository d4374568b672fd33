//! Node configuration: a TOML file, every key overridable by an `ATOMOS_...` environment
//! variable, defaults that work, and errors that name the key (or variable) and the problem.
//!
//! ```toml
//! cluster = "prod"
//! node_id = 1
//! listen = "127.0.0.1:7401"    # or a host name with a port, resolved when the file loads
//! key_file = "node-1.key"      # this member's key pair (`atomos keygen`); mode 600
//! protocol = "certify"
//!
//! [[peers]]
//! id = 2
//! address = "127.0.0.1:7402"
//! public_key = "..."           # member 2's public key; a list of keys while one is rotated
//! ```
//!
//! Every key is a row of one table ([`SETTINGS`]): its variable, the shape of its value, its
//! default, which nodes read it and what it means. Loading, [`effective_toml`] and the
//! reference in docs/guide/configuration.md ([`reference_markdown`]) are made from it.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::disk::FsyncPolicy;
use atomos_core::ContentionPolicy;
use atomos_net::keys::{KeyPair, PublicKey};
use atomos_protocols::oss::CommitMode;

use crate::node::Protocol;

mod client;
mod effective;
mod environment;
mod key_file;
mod parse;
mod reference;
mod setting;
mod source;
mod table;
mod values;
mod warnings;

pub use client::load_client;
pub use effective::effective_toml;
pub use environment::{check_variables, config_variables};
pub use key_file::{key_file_text, read_key_file, write_key_file};
pub use reference::reference_markdown;
pub use setting::{Kind, Readers, Setting};
pub use table::SETTINGS;
pub use warnings::exposure_warnings;

use values::{check_keys, check_members, KeySources};

/// Where a node listens unless told otherwise.
pub const DEFAULT_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7400));

/// Why a configuration cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The file is not valid TOML for this schema (unknown keys included).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation, with line and column.
        message: String,
    },
    /// A key has a value that cannot be used.
    #[error("configuration key {key}: {problem}")]
    Invalid {
        /// The key (file key, or the environment variable that set it).
        key: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// The shortest cluster secret accepted.
pub const MIN_SECRET_BYTES: usize = 32;

fn invalid(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        problem: problem.into(),
    }
}

/// A member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its node id.
    pub id: u64,
    /// Where it listens.
    pub address: SocketAddr,
    /// The keys it may prove (one; two while it rotates its key).
    pub public_keys: Vec<PublicKey>,
}

/// A client the members admit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientKey {
    /// What the operator calls it (in logs and metrics).
    pub name: String,
    /// The key it proves.
    pub public_key: PublicKey,
}

/// The cluster's shared secret; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret's bytes.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<hidden>")
    }
}

/// A node's validated settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSettings {
    /// Cluster name (peers of another cluster are refused).
    pub cluster: String,
    /// This node's id.
    pub node_id: u64,
    /// Where this node listens.
    pub listen: SocketAddr,
    /// Where this node keeps its data.
    pub data_dir: PathBuf,
    /// The cluster secret (required when the cluster has other members).
    pub secret: Option<Secret>,
    /// The file this member's key pair was read from (required when the cluster has other
    /// members).
    pub key_file: Option<PathBuf>,
    /// This member's key pair, read from `key_file`.
    pub key: Option<KeyPair>,
    /// The consistency protocol.
    pub protocol: Protocol,
    /// The contention manager.
    pub contention: ContentionPolicy,
    /// What is logged: a level, or `tracing` filter directives (`info,atomos_order=debug`).
    pub log_level: String,
    /// How log lines look.
    pub log_format: LogFormat,
    /// Address of the Prometheus text endpoint, if enabled.
    pub metrics: Option<SocketAddr>,
    /// Whether the hot-spot metrics name their objects' keys, which are application data
    /// (see [`crate::hot_spots`]); by default they carry ranks only.
    pub metrics_hot_spot_keys: bool,
    /// Largest frame accepted from a peer.
    pub max_frame_bytes: usize,
    /// The newest wire version the node speaks (see `atomos_net::wire`); by default this
    /// build's.
    pub wire_version: u16,
    /// How long the transport busy-polls after network activity (see
    /// `atomos_net::tcp::TcpConfig::busy_poll`); zero: never.
    pub busy_poll: Duration,
    /// How long an application thread waiting for the TFA machine's answer polls for
    /// it before it sleeps (see `atomos::runtime::NodeRuntime::set_answer_poll`); zero: never.
    pub answer_poll: Duration,
    /// Run an order-layer replica (total order with optimistic delivery) among all members,
    /// its log in `data_dir/order.wal`.
    pub order: bool,
    /// When the order log is fsynced.
    pub order_fsync: FsyncPolicy,
    /// Closed-loop clients generating order requests on this node (for tests and demos): each
    /// appends a unique value to the register `load`; answered values go to
    /// `data_dir/acked.log`.
    pub order_load_clients: usize,
    /// The order replica snapshots its state and compacts its log every this many final
    /// deliveries (at least 1).
    pub order_snapshot_every: u64,
    /// Threads running bank transfers over accounts shared by every member (for tests and
    /// demos): the member with the smallest id creates them; every member audits the total
    /// once a second and logs it ("bank audit").
    pub bank_load_threads: usize,
    /// With a bank load: MiB of extra objects the member that creates the accounts writes
    /// before its transfers start (a store of that size, for state-transfer benchmarks).
    pub bank_load_ballast_mib: u64,
    /// With a bank load: how long each transfer thread pauses between transfers.
    pub bank_load_pace: std::time::Duration,
    /// Under `certify` (whose replicated store keeps its log in `data_dir/certify.wal`, with
    /// the `order_fsync` and `order_snapshot_every` settings): how long a commit waits for its
    /// verdict before it fails with `TxError::OutcomeUnknown`.
    pub commit_limit: std::time::Duration,
    /// This node's data directory was lost while the cluster has a history: its order replica
    /// neither votes nor campaigns until it has caught up (a new node's empty log looks the
    /// same, so only an operator can say so). Its log remembers that it rejoins and, later,
    /// that it caught up, so the setting may stay on.
    pub order_rejoin: bool,
    /// Under `certify` and `active`: this node joins a running cluster. Its replica knows no
    /// members and waits until an operator adds it (`atomos member add`), then catches up
    /// from the leader's snapshot. Ignored once its log holds the cluster's state.
    pub order_join: bool,
    /// The clients (by the names under which `clients` lists their keys) that may change the
    /// membership (`atomos member`).
    pub operators: Vec<String>,
    /// Under `oss`: how commits are numbered (every member must agree).
    pub oss_commit: CommitMode,
    /// Under `oss`: the key prefixes of the consistency domains beside domain 0 (which holds
    /// every other key); each domain has its own sequencer or token. Every member must list
    /// the same, in the same order.
    pub oss_domains: Vec<String>,
    /// Under `oss`: installed write sets kept per domain for nodes that missed them (one that
    /// lacks older ones gets an image of the domain).
    pub oss_history_max: usize,
    /// Under `oss`: the node's log is compacted once this many records were written since
    /// the last compaction.
    pub oss_compact_after: usize,
    /// Start a transaction service with this policy: clients' requests with a priority run
    /// on it (`None`: no service).
    pub sched: Option<crate::service::Policy>,
    /// The transaction service's worker threads.
    pub sched_workers: usize,
    /// Worker threads of the runtime that runs the node's networking and protocol tasks
    /// (`None`: one per core). Several nodes on one machine share its cores: fewer threads
    /// each may serve them better (measured for benchmark processes, see BENCHMARKS.md).
    pub runtime_threads: Option<usize>,
    /// Client queries and submissions this node serves at once; one more is refused with
    /// `Busy` at once (see `NodeRuntime::set_client_limits`).
    pub client_requests_max: usize,
    /// How long this node works on a client's request before answering that its outcome is
    /// unknown.
    pub client_request_timeout: Duration,
    /// The other members, by id.
    pub peers: Vec<Peer>,
    /// The clients admitted.
    pub clients: Vec<ClientKey>,
    /// Keys set (as the file's key or the variable that set them) that mean nothing under
    /// the chosen protocol: a node warns about each at start.
    pub unused: Vec<String>,
}

/// How a node's log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// The name the configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// [`load`] with the process's environment, after refusing any `ATOMOS_` variable that no
/// setting reads ([`check_variables`]).
pub fn load_from_environment(path: Option<&Path>) -> Result<NodeSettings, ConfigError> {
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(name, _)| name.into_string().ok())
        .collect();
    check_variables(names.iter().map(String::as_str))?;
    load(path, |name| std::env::var(name).ok())
}

/// Reads `path` (if given) and the environment through `env`, applies defaults and validates.
/// `env` is `|name| std::env::var(name).ok()` in the program, and a map in tests. Each key's
/// variable, if set, wins over the file; errors name the one that gave the value.
pub fn load(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<NodeSettings, ConfigError> {
    let mut from_file = match path {
        None => Default::default(),
        Some(path) => source::read_file(path)?,
    };
    let mut s = table::defaults();
    // The rows set, with the name (key or variable) that set each.
    let mut set_by: Vec<(&Setting, String)> = Vec::new();
    for row in SETTINGS.iter() {
        let variable = row.variable();
        let given = match env(&variable) {
            Some(text) => Some((variable, source::from_variable(row.kind, text))),
            None => from_file
                .remove(row.key)
                .map(|raw| (row.key.to_string(), raw)),
        };
        if let Some((name, raw)) = given {
            row.apply(&mut s, &name, raw)?;
            set_by.push((row, name));
        }
    }
    let named = |key: &str| -> String {
        set_by
            .iter()
            .find(|(row, _)| row.key == key)
            .map_or_else(|| key.to_string(), |(_, name)| name.clone())
    };
    if !set_by.iter().any(|(row, _)| row.key == "data_dir") {
        s.data_dir = PathBuf::from(format!("./atomos-data/node-{}", s.node_id));
    }
    if (s.order || s.protocol.is_replicated()) && s.node_id == 0 {
        return Err(invalid(
            "node_id",
            "an order replica needs a node id other than 0",
        ));
    }
    if s.order && s.protocol.is_replicated() {
        return Err(invalid(
            "order",
            "certify and active run their own order replica (the replicated store's); the \
             register replica of `order` cannot run beside it",
        ));
    }
    if s.node_id == 0 && s.peers.iter().any(|p| p.id != 0) {
        return Err(invalid(
            "node_id",
            "a node with peers needs its own id, other than 0 (set `node_id` or ATOMOS_NODE_ID)",
        ));
    }
    let members = std::mem::take(&mut s.peers);
    s.peers = check_members(s.node_id, s.listen, members.clone())?;
    if !s.peers.is_empty() && s.secret.is_none() {
        return Err(invalid(
            "secret",
            "a cluster with other members needs a secret (set `secret` or ATOMOS_SECRET)",
        ));
    }
    if !s.peers.is_empty() && s.key.is_none() {
        return Err(invalid(
            "key_file",
            "a cluster with other members needs this member's key pair (`atomos keygen --out \
             FILE` makes one; set `key_file` or ATOMOS_KEY_FILE)",
        ));
    }
    if !s.clients.is_empty() && (s.key.is_none() || s.secret.is_none()) {
        return Err(invalid(
            if s.key.is_none() {
                "key_file"
            } else {
                "secret"
            },
            "clients are listed, but without this node's own key pair and the cluster secret \
             none could connect (a node alone makes random ones); set both",
        ));
    }
    let sources = KeySources {
        peers: &named("peers"),
        clients: &named("clients"),
    };
    check_keys(s.node_id, s.key.as_ref(), &members, &s.clients, sources)?;
    if let Some(name) = s
        .operators
        .iter()
        .find(|name| !s.clients.iter().any(|c| &c.name == *name))
    {
        return Err(invalid(
            &named("operators"),
            format!("{name:?} is no client's name: list its key under `clients` first"),
        ));
    }
    s.unused = set_by
        .iter()
        .filter(|(row, _)| !row.readers.read_by(&s))
        .map(|(_, name)| name.clone())
        .collect();
    Ok(s)
}

impl NodeSettings {
    /// Warnings about keys set that the chosen protocol does not read.
    pub fn unused_warnings(&self) -> Vec<String> {
        self.unused
            .iter()
            .map(|key| {
                format!(
                    "{key} is set but means nothing under protocol {}: it is ignored",
                    self.protocol
                )
            })
            .collect()
    }
}
