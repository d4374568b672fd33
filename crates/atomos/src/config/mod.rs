//! Node configuration: a TOML file, every key overridable by an `ATOMOS_...` environment
//! variable, defaults that work, and errors that name the key and the problem.
//!
//! ```toml
//! cluster = "prod"
//! node_id = 1
//! listen = "127.0.0.1:7401"    # or a host name with a port, resolved when the file loads
//! data_dir = "./data/1"
//! secret = "..."            # or ATOMOS_SECRET; at least 32 bytes
//! key_file = "node-1.key"   # this member's key pair (`atomos keygen`); mode 600
//! protocol = "local"
//! contention = "backoff"    # abort-self | backoff | priority
//! log_level = "info"        # error | warn | info | debug | trace, or filter directives
//!                             # ("info,atomos_order=debug"); RUST_LOG, if set, wins
//! log_format = "text"        # text | json (one JSON object per line)
//! metrics = "9401"         # off unless set; a port alone is 127.0.0.1
//! metrics_hot_spot_keys = false  # name hot spots' keys (application data) in metric labels
//! max_frame_bytes = 16777216
//! busy_poll_us = 100        # after network activity, keep a worker awake this long (0: never)
//! answer_poll_us = 500      # a thread waiting for a TFA answer polls this long (0: never)
//! order = false             # run an order-layer replica among all members
//! order_fsync = "batch"     # batch | never | 10ms
//! order_load_clients = 0    # generated order load (tests, demos)
//! order_snapshot_every = 10000  # final deliveries between snapshots (log compactions)
//! bank_load_threads = 0     # threads moving money between shared accounts (tests, demos)
//! commit_timeout_ms = 10000 # certify, active, oss: a commit without a verdict by then is OutcomeUnknown
//! order_rejoin = false      # this node's data directory was lost: rejoin (vote once caught up)
//! oss_commit = "ultra-peer" # oss: ultra-peer | distributed-token | coordinator-token
//! oss_domains = []          # oss: key prefixes of consistency domains beside domain 0
//! sched = "lazy:4"          # a transaction service for clients' prioritized requests:
//!                           # none | preemptive | cmax[:N] | lazy[:N] (absent: no service)
//! sched_workers = 2         # its worker threads (default: the machine's cores)
//! runtime_threads = 2       # network runtime workers (default: one per core)
//! client_requests_max = 64  # client queries and submissions served at once (more: Busy)
//! client_request_timeout_ms = 10000  # a client's query runs, and its submission waits, this long
//!
//! [[peers]]
//! id = 2
//! address = "127.0.0.1:7402"
//! public_key = "..."        # member 2's public key; a list of keys while one is rotated
//!
//! [[clients]]               # the clients admitted (re-read on SIGHUP)
//! name = "app"
//! public_key = "..."
//! ```
//!
//! Environment variables: `ATOMOS_CLUSTER`, `ATOMOS_NODE_ID`, `ATOMOS_LISTEN`,
//! `ATOMOS_DATA_DIR`, `ATOMOS_SECRET`, `ATOMOS_PROTOCOL`, `ATOMOS_CONTENTION`,
//! `ATOMOS_LOG_LEVEL`, `ATOMOS_METRICS`, `ATOMOS_METRICS_HOT_SPOT_KEYS`, `ATOMOS_MAX_FRAME_BYTES`, `ATOMOS_BUSY_POLL_US`,
//! `ATOMOS_ANSWER_POLL_US`, `ATOMOS_ORDER`,
//! `ATOMOS_ORDER_FSYNC`, `ATOMOS_ORDER_LOAD_CLIENTS`, `ATOMOS_ORDER_SNAPSHOT_EVERY`,
//! `ATOMOS_BANK_LOAD_THREADS`, `ATOMOS_COMMIT_TIMEOUT_MS`, `ATOMOS_ORDER_REJOIN`,
//! `ATOMOS_OSS_COMMIT`, `ATOMOS_OSS_DOMAINS` (prefixes separated by commas),
//! `ATOMOS_SCHED`, `ATOMOS_SCHED_WORKERS`, `ATOMOS_RUNTIME_THREADS`,
//! `ATOMOS_CLIENT_REQUESTS_MAX`, `ATOMOS_CLIENT_REQUEST_TIMEOUT_MS`, `ATOMOS_KEY_FILE`,
//! `ATOMOS_PEERS` as `id=address/key,id=address/key` (several keys as `key/key`), and
//! `ATOMOS_CLIENTS` as `name=key,name=key`.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::disk::FsyncPolicy;
use atomos_core::ContentionPolicy;
use atomos_net::keys::{KeyPair, PublicKey};
use atomos_net::transport::is_client;
use atomos_protocols::oss::CommitMode;
use serde::Deserialize;

use crate::node::Protocol;

mod client;
mod effective;
mod environment;
mod key_file;
mod values;
mod warnings;

pub use client::load_client;
pub use effective::effective_toml;
pub use environment::{check_variables, CONFIG_VARIABLES};
pub use key_file::{key_file_text, read_key_file, write_key_file};
pub use warnings::exposure_warnings;

use values::{
    address, check_domains, check_keys, check_members, metrics_address, parse_client_list,
    parse_peer_list, public_keys, KeySources,
};

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    cluster: Option<String>,
    node_id: Option<u64>,
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    secret: Option<String>,
    key_file: Option<PathBuf>,
    protocol: Option<String>,
    contention: Option<String>,
    log_level: Option<String>,
    log_format: Option<String>,
    metrics: Option<String>,
    metrics_hot_spot_keys: Option<bool>,
    max_frame_bytes: Option<usize>,
    busy_poll_us: Option<u64>,
    answer_poll_us: Option<u64>,
    order: Option<bool>,
    order_fsync: Option<String>,
    order_load_clients: Option<usize>,
    order_snapshot_every: Option<u64>,
    bank_load_threads: Option<usize>,
    commit_timeout_ms: Option<u64>,
    order_rejoin: Option<bool>,
    oss_commit: Option<String>,
    oss_domains: Option<Vec<String>>,
    sched: Option<String>,
    sched_workers: Option<usize>,
    runtime_threads: Option<usize>,
    client_requests_max: Option<usize>,
    client_request_timeout_ms: Option<u64>,
    peers: Option<Vec<FilePeer>>,
    clients: Option<Vec<FileClient>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    id: u64,
    address: String,
    public_key: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileClient {
    name: String,
    public_key: String,
}

/// A key, or a list of keys (a member whose key is being rotated).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(key) => vec![key],
            OneOrMany::Many(keys) => keys,
        }
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
    /// Under `certify` (whose replicated store keeps its log in `data_dir/certify.wal`, with
    /// the `order_fsync` and `order_snapshot_every` settings): how long a commit waits for its
    /// verdict before it fails with `TxError::OutcomeUnknown`.
    pub commit_limit: std::time::Duration,
    /// This node's data directory was lost while the cluster has a history: its order replica
    /// neither votes nor campaigns until it has caught up (a new node's empty log looks the
    /// same, so only an operator can say so). Its log remembers that it rejoins and, later,
    /// that it caught up, so the setting may stay on.
    pub order_rejoin: bool,
    /// Under `oss`: how commits are numbered (every member must agree).
    pub oss_commit: CommitMode,
    /// Under `oss`: the key prefixes of the consistency domains beside domain 0 (which holds
    /// every other key); each domain has its own sequencer or token. Every member must list
    /// the same, in the same order.
    pub oss_domains: Vec<String>,
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

const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

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
/// `env` is `|name| std::env::var(name).ok()` in the program, and a map in tests.
pub fn load(
    path: Option<&Path>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<NodeSettings, ConfigError> {
    let file = match path {
        None => FileConfig::default(),
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
            toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string().trim_end().to_string(),
            })?
        }
    };
    // Each value: the environment if set, else the file, with the name to blame.
    let pick = |var: &str, key: &str, from_file: Option<String>| -> Option<(String, String)> {
        env(var)
            .map(|v| (var.to_string(), v))
            .or(from_file.map(|v| (key.to_string(), v)))
    };
    // Keys that only some protocols read, by the name that set them (checked at the end).
    let set = |var: &str, set_in_file: bool| -> Option<String> {
        if env(var).is_some() {
            Some(var.to_string())
        } else if set_in_file {
            Some(var.trim_start_matches("ATOMOS_").to_ascii_lowercase())
        } else {
            None
        }
    };
    let protocol_keys = [
        ("ATOMOS_ANSWER_POLL_US", file.answer_poll_us.is_some()),
        ("ATOMOS_COMMIT_TIMEOUT_MS", file.commit_timeout_ms.is_some()),
        ("ATOMOS_OSS_COMMIT", file.oss_commit.is_some()),
        ("ATOMOS_OSS_DOMAINS", file.oss_domains.is_some()),
        ("ATOMOS_ORDER_FSYNC", file.order_fsync.is_some()),
        (
            "ATOMOS_ORDER_SNAPSHOT_EVERY",
            file.order_snapshot_every.is_some(),
        ),
        ("ATOMOS_ORDER_REJOIN", file.order_rejoin.is_some()),
    ]
    .map(|(var, in_file)| (var, set(var, in_file)));

    let cluster = match pick("ATOMOS_CLUSTER", "cluster", file.cluster) {
        Some((key, v)) if v.trim().is_empty() => return Err(invalid(&key, "must not be empty")),
        Some((_, v)) => v,
        None => "atomos".to_string(),
    };
    let node_id = match pick(
        "ATOMOS_NODE_ID",
        "node_id",
        file.node_id.map(|n| n.to_string()),
    ) {
        Some((key, v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&id| !is_client(id))
            .ok_or_else(|| {
                invalid(
                    &key,
                    format!("{v:?} is not a node id (a whole number below 2^63)"),
                )
            })?,
        None => 0,
    };
    let listen = match pick("ATOMOS_LISTEN", "listen", file.listen) {
        Some((key, v)) => address(&key, &v)?,
        None => address("listen", "127.0.0.1:7400")?,
    };
    let data_dir = match pick(
        "ATOMOS_DATA_DIR",
        "data_dir",
        file.data_dir.map(|p| p.to_string_lossy().into_owned()),
    ) {
        Some((key, v)) if v.trim().is_empty() => return Err(invalid(&key, "must not be empty")),
        Some((_, v)) => PathBuf::from(v),
        None => PathBuf::from(format!("./atomos-data/node-{node_id}")),
    };
    let secret = match pick("ATOMOS_SECRET", "secret", file.secret) {
        Some((key, v)) if v.len() < MIN_SECRET_BYTES => {
            return Err(invalid(
                &key,
                format!(
                    "must be at least {MIN_SECRET_BYTES} bytes, not {} (`atomos cluster up` \
                     generates 64 hex digits)",
                    v.len()
                ),
            ))
        }
        Some((_, v)) => Some(Secret(v)),
        None => None,
    };
    let protocol = match pick("ATOMOS_PROTOCOL", "protocol", file.protocol) {
        Some((key, v)) => v.parse::<Protocol>().map_err(|e| invalid(&key, e))?,
        None => Protocol::Local,
    };
    let contention = match pick("ATOMOS_CONTENTION", "contention", file.contention) {
        Some((key, v)) => match v.as_str() {
            "abort-self" => ContentionPolicy::AbortSelf,
            "backoff" => ContentionPolicy::Backoff,
            "priority" => ContentionPolicy::Priority,
            other => {
                return Err(invalid(
                    &key,
                    format!(
                        "{other:?} is not a contention manager (abort-self, backoff, priority)"
                    ),
                ))
            }
        },
        None => ContentionPolicy::default(),
    };
    let log_level = match pick("ATOMOS_LOG_LEVEL", "log_level", file.log_level) {
        Some((key, v)) => {
            // A single word must be a level: a misspelt one would read as a module's name.
            let directives = v.contains(['=', ',']);
            let parsed = tracing_subscriber::EnvFilter::builder().parse(&v);
            if (directives && parsed.is_ok()) || LOG_LEVELS.contains(&v.as_str()) {
                v
            } else {
                return Err(invalid(
                    &key,
                    format!(
                        "{v:?} is neither a level ({}) nor filter directives like \
                         \"info,atomos_order=debug\"",
                        LOG_LEVELS.join(", ")
                    ),
                ));
            }
        }
        None => "info".to_string(),
    };
    let log_format = match pick("ATOMOS_LOG_FORMAT", "log_format", file.log_format) {
        Some((_, v)) if v == "text" => LogFormat::Text,
        Some((_, v)) if v == "json" => LogFormat::Json,
        Some((key, v)) => return Err(invalid(&key, format!("{v:?} is not text or json"))),
        None => LogFormat::Text,
    };
    let metrics = match pick("ATOMOS_METRICS", "metrics", file.metrics) {
        Some((key, v)) => Some(metrics_address(&key, &v)?),
        None => None,
    };
    let max_frame_bytes = match pick(
        "ATOMOS_MAX_FRAME_BYTES",
        "max_frame_bytes",
        file.max_frame_bytes.map(|n| n.to_string()),
    ) {
        Some((key, v)) => match v.trim().parse::<usize>() {
            Ok(n) if (1024..=1 << 30).contains(&n) => n,
            _ => {
                return Err(invalid(
                    &key,
                    format!("{v:?} is not a size from 1024 to 1073741824 bytes"),
                ))
            }
        },
        None => 16 << 20,
    };
    // A duration in microseconds from 0 to 1 s.
    let micros = |picked: Option<(String, String)>, default: Duration| match picked {
        Some((key, v)) => match v.trim().parse::<u64>() {
            Ok(n) if n <= 1_000_000 => Ok(Duration::from_micros(n)),
            _ => Err(invalid(
                &key,
                format!("{v:?} is not a number of microseconds from 0 to 1000000"),
            )),
        },
        None => Ok(default),
    };
    let busy_poll = micros(
        pick(
            "ATOMOS_BUSY_POLL_US",
            "busy_poll_us",
            file.busy_poll_us.map(|n| n.to_string()),
        ),
        atomos_net::tcp::DEFAULT_BUSY_POLL,
    )?;
    let answer_poll = micros(
        pick(
            "ATOMOS_ANSWER_POLL_US",
            "answer_poll_us",
            file.answer_poll_us.map(|n| n.to_string()),
        ),
        crate::answer::DEFAULT_ANSWER_POLL,
    )?;
    // A switch that defaults to off.
    let switch = |picked: Option<(String, String)>| match picked {
        Some((key, v)) => match v.trim() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            other => Err(invalid(&key, format!("{other:?} is not true or false"))),
        },
        None => Ok(false),
    };
    let metrics_hot_spot_keys = switch(pick(
        "ATOMOS_METRICS_HOT_SPOT_KEYS",
        "metrics_hot_spot_keys",
        file.metrics_hot_spot_keys.map(|b| b.to_string()),
    ))?;
    let order = switch(pick(
        "ATOMOS_ORDER",
        "order",
        file.order.map(|b| b.to_string()),
    ))?;
    let order_fsync = match pick("ATOMOS_ORDER_FSYNC", "order_fsync", file.order_fsync) {
        Some((key, v)) => v.parse::<FsyncPolicy>().map_err(|e| invalid(&key, e))?,
        None => FsyncPolicy::EveryBatch,
    };
    // A count that defaults to zero.
    let count = |picked: Option<(String, String)>, what: &str| match picked {
        Some((key, v)) => v
            .trim()
            .parse::<usize>()
            .map_err(|_| invalid(&key, format!("{v:?} is not a number of {what}"))),
        None => Ok(0),
    };
    let order_load_clients = count(
        pick(
            "ATOMOS_ORDER_LOAD_CLIENTS",
            "order_load_clients",
            file.order_load_clients.map(|n| n.to_string()),
        ),
        "clients",
    )?;
    let order_snapshot_every = match pick(
        "ATOMOS_ORDER_SNAPSHOT_EVERY",
        "order_snapshot_every",
        file.order_snapshot_every.map(|n| n.to_string()),
    ) {
        Some((key, v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(&key, format!("{v:?} is not a positive number of entries")))?,
        None => 10_000,
    };
    let bank_load_threads = count(
        pick(
            "ATOMOS_BANK_LOAD_THREADS",
            "bank_load_threads",
            file.bank_load_threads.map(|n| n.to_string()),
        ),
        "threads",
    )?;
    let commit_limit = match pick(
        "ATOMOS_COMMIT_TIMEOUT_MS",
        "commit_timeout_ms",
        file.commit_timeout_ms.map(|n| n.to_string()),
    ) {
        Some((key, v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| (1..=3_600_000).contains(&n))
            .map(std::time::Duration::from_millis)
            .ok_or_else(|| {
                invalid(
                    &key,
                    format!("{v:?} is not a number of milliseconds from 1 to 3600000"),
                )
            })?,
        None => crate::certify::DEFAULT_COMMIT_LIMIT,
    };
    let order_rejoin = switch(pick(
        "ATOMOS_ORDER_REJOIN",
        "order_rejoin",
        file.order_rejoin.map(|b| b.to_string()),
    ))?;
    let oss_commit = match pick("ATOMOS_OSS_COMMIT", "oss_commit", file.oss_commit) {
        Some((key, v)) => CommitMode::parse(v.trim()).ok_or_else(|| {
            let names: Vec<&str> = CommitMode::NAMES.iter().map(|(n, _)| *n).collect();
            invalid(
                &key,
                format!("{v:?} is not a commit mode ({})", names.join(", ")),
            )
        })?,
        None => CommitMode::default(),
    };
    let (domains_key, oss_domains) = match env("ATOMOS_OSS_DOMAINS") {
        Some(list) => (
            "ATOMOS_OSS_DOMAINS",
            list.split(',').map(|p| p.trim().to_string()).collect(),
        ),
        None => ("oss_domains", file.oss_domains.unwrap_or_default()),
    };
    check_domains(domains_key, &oss_domains)?;
    let sched = match pick("ATOMOS_SCHED", "sched", file.sched) {
        Some((key, v)) => match v.trim().parse::<crate::service::Policy>() {
            Ok(p) if p.cmax() == Some(0) => return Err(invalid(&key, "C_max must be at least 1")),
            Ok(p) => Some(p),
            Err(e) => return Err(invalid(&key, e.to_string())),
        },
        None => None,
    };
    // A count from 1 to `max` of `what`, if set.
    let bounded = |picked: Option<(String, String)>, max: usize, what: &str| match picked {
        Some((key, v)) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => Err(invalid(
                &key,
                format!("{v:?} is not a number of {what} from 1 to {max}"),
            )),
        },
        None => Ok(None),
    };
    let runtime_threads = bounded(
        pick(
            "ATOMOS_RUNTIME_THREADS",
            "runtime_threads",
            file.runtime_threads.map(|n| n.to_string()),
        ),
        1024,
        "threads",
    )?;
    let sched_workers = bounded(
        pick(
            "ATOMOS_SCHED_WORKERS",
            "sched_workers",
            file.sched_workers.map(|n| n.to_string()),
        ),
        1024,
        "workers",
    )?
    .unwrap_or(crate::service::ServiceConfig::default().workers);
    let client_requests_max = bounded(
        pick(
            "ATOMOS_CLIENT_REQUESTS_MAX",
            "client_requests_max",
            file.client_requests_max.map(|n| n.to_string()),
        ),
        4096,
        "requests",
    )?
    .unwrap_or(crate::runtime::DEFAULT_CLIENT_REQUESTS_MAX);
    let client_request_timeout = match pick(
        "ATOMOS_CLIENT_REQUEST_TIMEOUT_MS",
        "client_request_timeout_ms",
        file.client_request_timeout_ms.map(|n| n.to_string()),
    ) {
        Some((key, v)) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| (1..=3_600_000).contains(&n))
            .map(Duration::from_millis)
            .ok_or_else(|| {
                invalid(
                    &key,
                    format!("{v:?} is not a number of milliseconds from 1 to 3600000"),
                )
            })?,
        None => crate::runtime::DEFAULT_CLIENT_REQUEST_TIMEOUT,
    };
    if (order || protocol.is_replicated()) && node_id == 0 {
        return Err(invalid(
            "node_id",
            "an order replica needs a node id other than 0",
        ));
    }
    if order && protocol.is_replicated() {
        return Err(invalid(
            "order",
            "certify and active run their own order replica (the replicated store's); the \
             register replica of `order` cannot run beside it",
        ));
    }
    let peers = match env("ATOMOS_PEERS") {
        Some(list) if list.trim().is_empty() => {
            return Err(invalid(
                "ATOMOS_PEERS",
                "is set but empty: it would replace the file's members with none, and a node \
                 of a cluster would then commit alone; unset it to use the file's peers",
            ))
        }
        Some(list) => parse_peer_list(&list)?,
        None => {
            let mut peers = Vec::new();
            for (i, p) in file.peers.unwrap_or_default().into_iter().enumerate() {
                let keys = p.public_key.map(OneOrMany::into_vec).unwrap_or_default();
                peers.push(Peer {
                    id: p.id,
                    address: address(&format!("peers[{i}].address"), &p.address)?,
                    public_keys: public_keys(&format!("peers[{i}].public_key"), &keys)?,
                });
            }
            peers
        }
    };
    let clients = match env("ATOMOS_CLIENTS") {
        Some(list) => parse_client_list(&list)?,
        None => {
            let mut clients = Vec::new();
            for (i, c) in file.clients.unwrap_or_default().into_iter().enumerate() {
                let key = format!("clients[{i}].public_key");
                let public_key = public_keys(&key, std::slice::from_ref(&c.public_key))?[0];
                clients.push(ClientKey {
                    name: c.name,
                    public_key,
                });
            }
            clients
        }
    };
    let (key_file, key) = match pick(
        "ATOMOS_KEY_FILE",
        "key_file",
        file.key_file.map(|p| p.to_string_lossy().into_owned()),
    ) {
        Some((name, v)) if v.trim().is_empty() => return Err(invalid(&name, "must not be empty")),
        Some((name, v)) => {
            let path = PathBuf::from(v);
            let key = read_key_file(&name, &path)?;
            (Some(path), Some(key))
        }
        None => (None, None),
    };
    if node_id == 0 && peers.iter().any(|p| p.id != node_id) {
        return Err(invalid(
            "node_id",
            "a node with peers needs its own id, other than 0 (set `node_id` or ATOMOS_NODE_ID)",
        ));
    }
    let members = peers.clone();
    let peers = check_members(node_id, listen, peers)?;
    // Which protocols read which keys: `order_fsync` every write-ahead log (the order
    // register's, tfa's, the replicated stores', oss's); snapshots only the order replicas
    // that compact (oss's control log never does); rejoining every replicated log.
    let unused = protocol_keys
        .into_iter()
        .filter_map(|(var, set_as)| {
            let used = match var {
                "ATOMOS_ANSWER_POLL_US" => protocol == Protocol::Tfa,
                "ATOMOS_COMMIT_TIMEOUT_MS" => protocol.is_ordered() || protocol == Protocol::Oss,
                "ATOMOS_OSS_COMMIT" | "ATOMOS_OSS_DOMAINS" => protocol == Protocol::Oss,
                "ATOMOS_ORDER_FSYNC" => order || protocol != Protocol::Local,
                "ATOMOS_ORDER_SNAPSHOT_EVERY" => order || protocol.is_ordered(),
                _ => order || protocol.is_replicated(),
            };
            set_as.filter(|_| !used)
        })
        .collect();
    if !peers.is_empty() && secret.is_none() {
        return Err(invalid(
            "secret",
            "a cluster with other members needs a secret (set `secret` or ATOMOS_SECRET)",
        ));
    }
    if !peers.is_empty() && key.is_none() {
        return Err(invalid(
            "key_file",
            "a cluster with other members needs this member's key pair (`atomos keygen --out \
             FILE` makes one; set `key_file` or ATOMOS_KEY_FILE)",
        ));
    }
    if !clients.is_empty() && (key.is_none() || secret.is_none()) {
        return Err(invalid(
            if key.is_none() { "key_file" } else { "secret" },
            "clients are listed, but without this node's own key pair and the cluster secret \
             none could connect (a node alone makes random ones); set both",
        ));
    }
    let sources = KeySources {
        peers: if env("ATOMOS_PEERS").is_some() {
            "ATOMOS_PEERS"
        } else {
            "peers"
        },
        clients: if env("ATOMOS_CLIENTS").is_some() {
            "ATOMOS_CLIENTS"
        } else {
            "clients"
        },
    };
    check_keys(node_id, key.as_ref(), &members, &clients, sources)?;
    Ok(NodeSettings {
        cluster,
        node_id,
        listen,
        data_dir,
        secret,
        key_file,
        key,
        protocol,
        contention,
        log_level,
        log_format,
        metrics,
        metrics_hot_spot_keys,
        max_frame_bytes,
        busy_poll,
        answer_poll,
        order,
        order_fsync,
        order_load_clients,
        order_snapshot_every,
        bank_load_threads,
        commit_limit,
        order_rejoin,
        oss_commit,
        oss_domains,
        sched,
        sched_workers,
        runtime_threads,
        client_requests_max,
        client_request_timeout,
        peers,
        clients,
        unused,
    })
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
