//! The settings table: every key a node's configuration reads, with its `ATOMOS_` variable,
//! the shape of its value, its default, which nodes read it and what it means. Loading,
//! `check-config`'s effective configuration and the generated reference all walk this table,
//! so a key exists in all three or in none.

use std::path::PathBuf;

use toml::{Table, Value};

use super::parse::{
    commit_mode, commit_mode_name, contention, contention_name, count_in, log_format, log_level,
    micros, millis, node_id, non_empty, number_in, sched, sched_name, switch,
};
use super::setting::{Kind, Readers, Setting};
use super::values::{address, check_domains, client_list, metrics_address, peer_list};
use super::{invalid, read_key_file, LogFormat, NodeSettings, Secret};
use super::{DEFAULT_LISTEN, MIN_SECRET_BYTES};
use crate::disk::FsyncPolicy;
use crate::node::Protocol;

fn text(value: impl ToString) -> Option<Value> {
    Some(Value::String(value.to_string()))
}

fn integer(value: impl TryInto<i64>) -> Option<Value> {
    Some(Value::Integer(value.try_into().unwrap_or(i64::MAX)))
}

fn boolean(value: bool) -> Option<Value> {
    Some(Value::Boolean(value))
}

fn millis_of(d: std::time::Duration) -> Option<Value> {
    integer(d.as_millis())
}

/// The settings with every default, before any key is read. `data_dir`'s default depends on
/// the node id and is set after the keys are read.
pub(super) fn defaults() -> NodeSettings {
    NodeSettings {
        cluster: "atomos".to_string(),
        node_id: 0,
        listen: DEFAULT_LISTEN,
        data_dir: PathBuf::new(),
        secret: None,
        key_file: None,
        key: None,
        protocol: Protocol::Local,
        contention: atomos_core::ContentionPolicy::default(),
        log_level: "info".to_string(),
        log_format: LogFormat::Text,
        metrics: None,
        metrics_hot_spot_keys: false,
        max_frame_bytes: 16 << 20,
        wire_version: atomos_net::wire::WIRE_VERSION,
        busy_poll: atomos_net::tcp::DEFAULT_BUSY_POLL,
        answer_poll: crate::answer::DEFAULT_ANSWER_POLL,
        order: false,
        order_fsync: FsyncPolicy::EveryBatch,
        order_load_clients: 0,
        order_snapshot_every: 10_000,
        bank_load_threads: 0,
        bank_load_ballast_mib: 0,
        bank_load_pace: std::time::Duration::from_millis(50),
        commit_limit: crate::certify::DEFAULT_COMMIT_LIMIT,
        order_rejoin: false,
        order_join: false,
        operators: Vec::new(),
        oss_commit: atomos_protocols::oss::CommitMode::default(),
        oss_domains: Vec::new(),
        oss_history_max: atomos_protocols::oss::OssConfig::DEFAULT_HISTORY_MAX,
        oss_compact_after: atomos_protocols::oss::OssConfig::DEFAULT_COMPACT_AFTER,
        sched: None,
        sched_workers: crate::service::ServiceConfig::default().workers,
        runtime_threads: None,
        client_requests_max: crate::client_service::DEFAULT_CLIENT_REQUESTS_MAX,
        client_request_timeout: crate::client_service::DEFAULT_CLIENT_REQUEST_TIMEOUT,
        peers: Vec::new(),
        clients: Vec::new(),
        unused: Vec::new(),
    }
}

/// Every key, in the order a configuration file lists them.
pub static SETTINGS: [Setting; 38] = [
    Setting {
        key: "cluster",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "The cluster's name. A peer of another cluster is refused at the handshake.",
        default_note: None,
        apply: |s, name, raw| {
            s.cluster = non_empty(name, raw.text())?;
            Ok(())
        },
        show: |s| text(&s.cluster),
    },
    Setting {
        key: "node_id",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "This member's id, unique in the cluster: a whole number below 2^63. 0 is a \
                  node alone; a member of a cluster or an order replica needs another.",
        default_note: None,
        apply: |s, name, raw| {
            s.node_id = node_id(name, raw.text())?;
            Ok(())
        },
        show: |s| integer(s.node_id),
    },
    Setting {
        key: "listen",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "Where this node listens for members and clients: an IP address and port, or \
                  a host name and port (resolved once, when the configuration loads).",
        default_note: None,
        apply: |s, name, raw| {
            s.listen = address(name, raw.text())?;
            Ok(())
        },
        show: |s| text(s.listen),
    },
    Setting {
        key: "data_dir",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "Where this node keeps its write-ahead logs, snapshots and the load's \
                  acknowledgement logs.",
        default_note: Some("`./atomos-data/node-<node_id>`"),
        apply: |s, name, raw| {
            s.data_dir = PathBuf::from(non_empty(name, raw.text())?);
            Ok(())
        },
        show: |s| text(s.data_dir.display()),
    },
    Setting {
        key: "secret",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "The cluster's shared secret, at least 32 bytes (`atomos cluster up` makes 64 \
                  hex digits). Required when the cluster has other members. Prefer the \
                  variable, or a file readable by its owner only; it is never printed.",
        default_note: Some("none"),
        apply: |s, name, raw| {
            let v = raw.text();
            if v.len() < MIN_SECRET_BYTES {
                return Err(invalid(
                    name,
                    format!(
                        "must be at least {MIN_SECRET_BYTES} bytes, not {} (`atomos cluster up` \
                         generates 64 hex digits)",
                        v.len()
                    ),
                ));
            }
            s.secret = Some(Secret(v.to_string()));
            Ok(())
        },
        show: |_| None,
    },
    Setting {
        key: "key_file",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "The file holding this member's key pair (`atomos keygen --out FILE`), \
                  readable by its owner only. Required when the cluster has other members or \
                  admits clients.",
        default_note: Some("none (a node alone makes a key pair at start)"),
        apply: |s, name, raw| {
            let path = PathBuf::from(non_empty(name, raw.text())?);
            s.key = Some(read_key_file(name, &path)?);
            s.key_file = Some(path);
            Ok(())
        },
        show: |s| s.key_file.as_ref().and_then(|p| text(p.display())),
    },
    Setting {
        key: "protocol",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "The consistency protocol: `local` (one node), `tfa` (objects spread over the \
                  members, each with an owner), `certify` (every member holds every object; \
                  commits certified in a replicated log), `active` (stored procedures run by \
                  every replica in the log's order), `oss` (consistency domains with a \
                  sequencer or token). docs/guide/choosing-a-protocol.md compares them.",
        default_note: None,
        apply: |s, name, raw| {
            s.protocol = raw
                .text()
                .parse::<Protocol>()
                .map_err(|e| invalid(name, e))?;
            Ok(())
        },
        show: |s| text(s.protocol),
    },
    Setting {
        key: "contention",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "What a transaction does on a conflict: `abort-self` (re-run at once), \
                  `backoff` (re-run after a random wait that doubles with each abort), or \
                  `priority` (the higher-priority transaction wins, among equals the older; a \
                  loser backs off longer the lower its priority).",
        default_note: None,
        apply: |s, name, raw| {
            s.contention = contention(name, raw.text())?;
            Ok(())
        },
        show: |s| text(contention_name(s.contention)),
    },
    Setting {
        key: "log_level",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "What is logged: a level (`error`, `warn`, `info`, `debug`, `trace`) or \
                  filter directives (`info,atomos_order=debug`). `RUST_LOG`, if set, wins.",
        default_note: None,
        apply: |s, name, raw| {
            s.log_level = log_level(name, raw.text())?;
            Ok(())
        },
        show: |s| text(&s.log_level),
    },
    Setting {
        key: "log_format",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "How log lines look: `text`, or `json` (one JSON object per line, for log \
                  collectors).",
        default_note: None,
        apply: |s, name, raw| {
            s.log_format = log_format(name, raw.text())?;
            Ok(())
        },
        show: |s| text(s.log_format.name()),
    },
    Setting {
        key: "metrics",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "Serve Prometheus metrics (`/metrics`), health (`/health`) and readiness \
                  (`/ready`) here: an address, or a port alone for 127.0.0.1. The endpoint has \
                  no authentication.",
        default_note: Some("off"),
        apply: |s, name, raw| {
            s.metrics = Some(metrics_address(name, raw.text())?);
            Ok(())
        },
        show: |s| s.metrics.and_then(text),
    },
    Setting {
        key: "metrics_hot_spot_keys",
        kind: Kind::Boolean,
        readers: Readers::Every,
        meaning: "Name the hot spots' keys (application data) in metric labels; otherwise \
                  they carry ranks only.",
        default_note: None,
        apply: |s, name, raw| {
            s.metrics_hot_spot_keys = switch(name, raw.text())?;
            Ok(())
        },
        show: |s| boolean(s.metrics_hot_spot_keys),
    },
    Setting {
        key: "max_frame_bytes",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "The largest frame accepted from a peer or client, from 1024 bytes to 1 GiB.",
        default_note: None,
        apply: |s, name, raw| {
            s.max_frame_bytes = count_in(name, raw.text(), 1024..=1 << 30, "bytes")?;
            Ok(())
        },
        show: |s| integer(s.max_frame_bytes),
    },
    Setting {
        key: "wire_version",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "The newest wire version this node speaks, from the oldest this build speaks \
                  (the previous release's) to its own. Each connection speaks the newest \
                  version both ends do, so a rolling upgrade needs no setting; a lower value \
                  makes this node speak as the previous release would.",
        default_note: None,
        apply: |s, name, raw| {
            use atomos_net::wire::{OLDEST_WIRE_VERSION, WIRE_VERSION};
            let text = raw.text();
            s.wire_version = text
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|v| (OLDEST_WIRE_VERSION..=WIRE_VERSION).contains(v))
                .ok_or_else(|| {
                    invalid(
                        name,
                        format!(
                            "{text:?} is not a wire version this build speaks (from \
                             {OLDEST_WIRE_VERSION} to {WIRE_VERSION})"
                        ),
                    )
                })?;
            Ok(())
        },
        show: |s| integer(s.wire_version),
    },
    Setting {
        key: "busy_poll_us",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "After network activity, keep a network worker awake this many microseconds \
                  (0: never), from 0 to 1000000. Trades a core for latency.",
        default_note: None,
        apply: |s, name, raw| {
            s.busy_poll = micros(name, raw.text())?;
            Ok(())
        },
        show: |s| integer(s.busy_poll.as_micros()),
    },
    Setting {
        key: "answer_poll_us",
        kind: Kind::Integer,
        readers: Readers::Tfa,
        meaning: "An application thread waiting for the TFA machine's answer polls this many \
                  microseconds before it sleeps (0: never), from 0 to 1000000.",
        default_note: None,
        apply: |s, name, raw| {
            s.answer_poll = micros(name, raw.text())?;
            Ok(())
        },
        show: |s| integer(s.answer_poll.as_micros()),
    },
    Setting {
        key: "order",
        kind: Kind::Boolean,
        readers: Readers::Every,
        meaning: "Run an order-layer replica (total order with optimistic delivery) among all \
                  members, its log in `data_dir/order.wal`. Not with `certify` or `active`, \
                  which run their own.",
        default_note: None,
        apply: |s, name, raw| {
            s.order = switch(name, raw.text())?;
            Ok(())
        },
        show: |s| boolean(s.order),
    },
    Setting {
        key: "order_fsync",
        kind: Kind::Text,
        readers: Readers::Logs,
        meaning: "When the write-ahead logs are flushed to disk: `batch` (before anything they \
                  hold is acknowledged), `never`, or a period like `10ms`. Only `batch` keeps \
                  every acknowledged commit through a power loss.",
        default_note: None,
        apply: |s, name, raw| {
            s.order_fsync = raw
                .text()
                .parse::<FsyncPolicy>()
                .map_err(|e| invalid(name, e))?;
            Ok(())
        },
        show: |s| text(s.order_fsync),
    },
    Setting {
        key: "order_load_clients",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "Closed-loop clients generating order requests on this node (tests and \
                  demos): each appends unique values to the register `load`; answered values \
                  go to `data_dir/acked.log`.",
        default_note: None,
        apply: |s, name, raw| {
            s.order_load_clients = count_in(name, raw.text(), 0..=u64::MAX, "clients")?;
            Ok(())
        },
        show: |s| integer(s.order_load_clients),
    },
    Setting {
        key: "order_snapshot_every",
        kind: Kind::Integer,
        readers: Readers::Snapshots,
        meaning: "The order replica snapshots its state and compacts its log once this many \
                  final deliveries (at least 1) since the last snapshot hold an eighth of the \
                  state's size (a large state is not rewritten for a few entries).",
        default_note: None,
        apply: |s, name, raw| {
            s.order_snapshot_every = number_in(name, raw.text(), 1..=u64::MAX, "entries")?;
            Ok(())
        },
        show: |s| integer(s.order_snapshot_every),
    },
    Setting {
        key: "bank_load_threads",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "Threads moving money between accounts shared by every member (tests and \
                  demos): the member with the smallest id creates them; every member audits \
                  the total once a second and logs it (`bank audit`).",
        default_note: None,
        apply: |s, name, raw| {
            s.bank_load_threads = count_in(name, raw.text(), 0..=u64::MAX, "threads")?;
            Ok(())
        },
        show: |s| integer(s.bank_load_threads),
    },
    Setting {
        key: "bank_load_ballast_mib",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "With a bank load: MiB of extra objects (`bank-load/ballast/N`, 256 KiB \
                  each) the member that creates the accounts writes before its transfers \
                  start, so that the store has that size (state-transfer benchmarks).",
        default_note: None,
        apply: |s, name, raw| {
            s.bank_load_ballast_mib = number_in(name, raw.text(), 0..=1 << 20, "MiB")?;
            Ok(())
        },
        show: |s| integer(s.bank_load_ballast_mib),
    },
    Setting {
        key: "bank_load_pace_ms",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "With a bank load: milliseconds each transfer thread pauses between \
                  transfers (0: none, the cluster's capacity; under `tfa` unpaced transfers \
                  starve the audits).",
        default_note: None,
        apply: |s, name, raw| {
            let ms = number_in(name, raw.text(), 0..=60_000, "milliseconds")?;
            s.bank_load_pace = std::time::Duration::from_millis(ms);
            Ok(())
        },
        show: |s| integer(s.bank_load_pace.as_millis() as u64),
    },
    Setting {
        key: "commit_timeout_ms",
        kind: Kind::Integer,
        readers: Readers::CommitWaiters,
        meaning: "How long a commit waits for its verdict before it fails with \
                  `OutcomeUnknown` (whose ticket can be asked about later), from 1 to 3600000.",
        default_note: None,
        apply: |s, name, raw| {
            s.commit_limit = millis(name, raw.text())?;
            Ok(())
        },
        show: |s| millis_of(s.commit_limit),
    },
    Setting {
        key: "order_rejoin",
        kind: Kind::Boolean,
        readers: Readers::Replicas,
        meaning: "This node's data directory was lost while the cluster has a history: its \
                  replica neither votes nor campaigns until it has caught up (an empty log \
                  looks the same as a new node's, so only an operator can say so). The log \
                  remembers it, so the setting may stay on.",
        default_note: None,
        apply: |s, name, raw| {
            s.order_rejoin = switch(name, raw.text())?;
            Ok(())
        },
        show: |s| boolean(s.order_rejoin),
    },
    Setting {
        key: "order_join",
        kind: Kind::Boolean,
        readers: Readers::Snapshots,
        meaning: "This node joins a running `certify` or `active` cluster: its replica knows \
                  no members and waits until an operator adds it (`atomos member add`), then \
                  catches up from the leader's snapshot. `peers` lists members to reach first. \
                  Ignored once its log holds the cluster's state, so it may stay on.",
        default_note: None,
        apply: |s, name, raw| {
            s.order_join = switch(name, raw.text())?;
            Ok(())
        },
        show: |s| boolean(s.order_join),
    },
    Setting {
        key: "operators",
        kind: Kind::TextList,
        readers: Readers::Every,
        meaning: "The clients, by the names `clients` lists their keys under, that may change \
                  the membership (`atomos member add|promote|remove`). Every member lists the \
                  same. The variable separates them by commas.",
        default_note: Some("none"),
        apply: |s, _name, raw| {
            s.operators = raw.list().into_iter().map(|n| n.trim().into()).collect();
            Ok(())
        },
        show: |s| Some(Value::Array(s.operators.iter().filter_map(text).collect())),
    },
    Setting {
        key: "oss_commit",
        kind: Kind::Text,
        readers: Readers::Oss,
        meaning: "How `oss` numbers commits: `ultra-peer` (a sequencer per domain), \
                  `distributed-token`, or `coordinator-token`. Every member must agree.",
        default_note: None,
        apply: |s, name, raw| {
            s.oss_commit = commit_mode(name, raw.text())?;
            Ok(())
        },
        show: |s| text(commit_mode_name(s.oss_commit)),
    },
    Setting {
        key: "oss_domains",
        kind: Kind::TextList,
        readers: Readers::Oss,
        meaning: "The key prefixes of `oss`'s consistency domains beside domain 0 (which holds \
                  every other key); each has its own sequencer or token. Every member lists \
                  the same, in the same order. The variable separates them by commas.",
        default_note: None,
        apply: |s, name, raw| {
            let prefixes: Vec<String> = raw.list().into_iter().map(|p| p.trim().into()).collect();
            check_domains(name, &prefixes)?;
            s.oss_domains = prefixes;
            Ok(())
        },
        show: |s| {
            Some(Value::Array(
                s.oss_domains.iter().filter_map(text).collect(),
            ))
        },
    },
    Setting {
        key: "oss_history_max",
        kind: Kind::Integer,
        readers: Readers::Oss,
        meaning: "The installed write sets `oss` keeps per domain (at least 1) for nodes that \
                  missed them; a node that lacks older ones is sent an image of the domain.",
        default_note: None,
        apply: |s, name, raw| {
            s.oss_history_max =
                number_in(name, raw.text(), 1..=u32::MAX as u64, "write sets")? as usize;
            Ok(())
        },
        show: |s| integer(s.oss_history_max as u64),
    },
    Setting {
        key: "oss_compact_after",
        kind: Kind::Integer,
        readers: Readers::Oss,
        meaning: "`oss` compacts the node's log (`oss.wal`) once this many records (at least \
                  1) were written since the last compaction.",
        default_note: None,
        apply: |s, name, raw| {
            s.oss_compact_after =
                number_in(name, raw.text(), 1..=u32::MAX as u64, "records")? as usize;
            Ok(())
        },
        show: |s| integer(s.oss_compact_after as u64),
    },
    Setting {
        key: "sched",
        kind: Kind::Text,
        readers: Readers::Every,
        meaning: "Start a transaction service for clients' prioritized requests with this \
                  policy: `none`, `preemptive`, `cmax[:N]` or `lazy[:N]`.",
        default_note: Some("no service"),
        apply: |s, name, raw| {
            s.sched = Some(sched(name, raw.text())?);
            Ok(())
        },
        show: |s| s.sched.and_then(|p| text(sched_name(p))),
    },
    Setting {
        key: "sched_workers",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "The transaction service's worker threads, from 1 to 1024.",
        default_note: Some("the machine's cores"),
        apply: |s, name, raw| {
            s.sched_workers = count_in(name, raw.text(), 1..=1024, "workers")?;
            Ok(())
        },
        show: |s| integer(s.sched_workers),
    },
    Setting {
        key: "runtime_threads",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "Worker threads of the runtime running the node's networking and protocol \
                  tasks, from 1 to 1024. Several nodes on one machine may serve better with \
                  fewer each.",
        default_note: Some("one per core"),
        apply: |s, name, raw| {
            s.runtime_threads = Some(count_in(name, raw.text(), 1..=1024, "threads")?);
            Ok(())
        },
        show: |s| s.runtime_threads.and_then(integer),
    },
    Setting {
        key: "client_requests_max",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "Client queries and submissions this node serves at once, from 1 to 4096; \
                  one more is refused with `Busy` at once.",
        default_note: None,
        apply: |s, name, raw| {
            s.client_requests_max = count_in(name, raw.text(), 1..=4096, "requests")?;
            Ok(())
        },
        show: |s| integer(s.client_requests_max),
    },
    Setting {
        key: "client_request_timeout_ms",
        kind: Kind::Integer,
        readers: Readers::Every,
        meaning: "How long a client's query runs, and its submission waits, before the node \
                  answers that its outcome is unknown, from 1 to 3600000.",
        default_note: None,
        apply: |s, name, raw| {
            s.client_request_timeout = millis(name, raw.text())?;
            Ok(())
        },
        show: |s| millis_of(s.client_request_timeout),
    },
    Setting {
        key: "peers",
        kind: Kind::Tables,
        readers: Readers::Every,
        meaning: "The cluster's members, one `[[peers]]` section each: `id`, `address` (as \
                  `listen`), `public_key` (the key `atomos keygen` printed, or a list of two \
                  while it is rotated). The list may hold this node too, at its own address. \
                  The variable is `id=address/key,id=address/key` (two keys as `key/key`) and \
                  replaces the file's list.",
        default_note: Some("none (a node alone)"),
        apply: |s, name, raw| {
            s.peers = peer_list(name, raw)?;
            Ok(())
        },
        show: |s| {
            let peers = s.peers.iter().map(|p| {
                let mut peer = Table::new();
                peer.insert("id".into(), Value::Integer(p.id as i64));
                peer.insert("address".into(), Value::String(p.address.to_string()));
                let mut keys: Vec<Value> = p.public_keys.iter().filter_map(text).collect();
                match keys.len() {
                    0 => {}
                    1 => {
                        peer.insert("public_key".into(), keys.remove(0));
                    }
                    _ => {
                        peer.insert("public_key".into(), Value::Array(keys));
                    }
                }
                Value::Table(peer)
            });
            Some(Value::Array(peers.collect()))
        },
    },
    Setting {
        key: "clients",
        kind: Kind::Tables,
        readers: Readers::Every,
        meaning: "The clients admitted, one `[[clients]]` section each: `name` (in logs and \
                  metrics) and `public_key`. Re-read on SIGHUP. The variable is \
                  `name=key,name=key`.",
        default_note: Some("none"),
        apply: |s, name, raw| {
            s.clients = client_list(name, raw)?;
            Ok(())
        },
        show: |s| {
            let clients = s.clients.iter().map(|c| {
                let mut client = Table::new();
                client.insert("name".into(), Value::String(c.name.clone()));
                client.insert("public_key".into(), Value::String(c.public_key.to_string()));
                Value::Table(client)
            });
            Some(Value::Array(clients.collect()))
        },
    },
];

/// The row of `key`, if it is one.
pub(super) fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}
