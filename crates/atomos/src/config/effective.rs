//! The effective configuration, written back as the TOML a file would hold.

use atomos_core::ContentionPolicy;
use atomos_protocols::oss::CommitMode;
use toml::{Table, Value};

use crate::disk::FsyncPolicy;
use crate::service::Policy;

use super::NodeSettings;

fn text(value: impl ToString) -> Value {
    Value::String(value.to_string())
}

fn integer(value: u64) -> Value {
    Value::Integer(i64::try_from(value).unwrap_or(i64::MAX))
}

fn contention_name(policy: ContentionPolicy) -> &'static str {
    match policy {
        ContentionPolicy::AbortSelf => "abort-self",
        ContentionPolicy::Backoff => "backoff",
        ContentionPolicy::Priority => "priority",
    }
}

fn fsync_name(policy: FsyncPolicy) -> String {
    match policy {
        FsyncPolicy::EveryBatch => "batch".to_string(),
        FsyncPolicy::Never => "never".to_string(),
        FsyncPolicy::Every(period) => format!("{}ms", period.as_millis()),
    }
}

fn commit_mode_name(mode: CommitMode) -> &'static str {
    CommitMode::NAMES
        .iter()
        .find(|(_, m)| *m == mode)
        .map_or("?", |(name, _)| name)
}

/// A scheduling policy as the `sched` key spells it.
fn sched_name(policy: Policy) -> String {
    match policy {
        Policy::Cmax(n) | Policy::Lazy(n) => format!("{}:{n}", policy.name()),
        other => other.name().to_string(),
    }
}

/// `settings` as a configuration file that gives the same node: every key with its value, the
/// defaults included. The secret is never written: a comment says whether one is set. The
/// key file is named, and this node's public key said in a comment.
pub fn effective_toml(settings: &NodeSettings) -> String {
    let s = settings;
    let mut t = Table::new();
    t.insert("cluster".into(), text(&s.cluster));
    t.insert("node_id".into(), integer(s.node_id));
    t.insert("listen".into(), text(s.listen));
    t.insert("data_dir".into(), text(s.data_dir.display()));
    if let Some(path) = &s.key_file {
        t.insert("key_file".into(), text(path.display()));
    }
    t.insert("protocol".into(), text(s.protocol));
    t.insert("contention".into(), text(contention_name(s.contention)));
    t.insert("log_level".into(), text(&s.log_level));
    t.insert("log_format".into(), text(s.log_format.name()));
    if let Some(metrics) = s.metrics {
        t.insert("metrics".into(), text(metrics));
    }
    t.insert(
        "metrics_hot_spot_keys".into(),
        Value::Boolean(s.metrics_hot_spot_keys),
    );
    t.insert("max_frame_bytes".into(), integer(s.max_frame_bytes as u64));
    t.insert(
        "busy_poll_us".into(),
        integer(s.busy_poll.as_micros() as u64),
    );
    t.insert(
        "answer_poll_us".into(),
        integer(s.answer_poll.as_micros() as u64),
    );
    t.insert("order".into(), Value::Boolean(s.order));
    t.insert("order_fsync".into(), text(fsync_name(s.order_fsync)));
    t.insert(
        "order_load_clients".into(),
        integer(s.order_load_clients as u64),
    );
    t.insert(
        "order_snapshot_every".into(),
        integer(s.order_snapshot_every),
    );
    t.insert(
        "bank_load_threads".into(),
        integer(s.bank_load_threads as u64),
    );
    t.insert(
        "commit_timeout_ms".into(),
        integer(s.commit_limit.as_millis() as u64),
    );
    t.insert("order_rejoin".into(), Value::Boolean(s.order_rejoin));
    t.insert("oss_commit".into(), text(commit_mode_name(s.oss_commit)));
    t.insert(
        "oss_domains".into(),
        Value::Array(s.oss_domains.iter().map(text).collect()),
    );
    if let Some(sched) = s.sched {
        t.insert("sched".into(), text(sched_name(sched)));
    }
    t.insert("sched_workers".into(), integer(s.sched_workers as u64));
    if let Some(threads) = s.runtime_threads {
        t.insert("runtime_threads".into(), integer(threads as u64));
    }
    t.insert(
        "client_requests_max".into(),
        integer(s.client_requests_max as u64),
    );
    t.insert(
        "client_request_timeout_ms".into(),
        integer(s.client_request_timeout.as_millis() as u64),
    );
    let peers = s
        .peers
        .iter()
        .map(|p| {
            let mut peer = Table::new();
            peer.insert("id".into(), integer(p.id));
            peer.insert("address".into(), text(p.address));
            let keys: Vec<Value> = p.public_keys.iter().map(text).collect();
            match keys.len() {
                0 => {}
                1 => {
                    peer.insert("public_key".into(), keys[0].clone());
                }
                _ => {
                    peer.insert("public_key".into(), Value::Array(keys));
                }
            }
            Value::Table(peer)
        })
        .collect();
    t.insert("peers".into(), Value::Array(peers));
    let clients = s
        .clients
        .iter()
        .map(|c| {
            let mut client = Table::new();
            client.insert("name".into(), text(&c.name));
            client.insert("public_key".into(), text(c.public_key));
            Value::Table(client)
        })
        .collect();
    t.insert("clients".into(), Value::Array(clients));
    let secret = if s.secret.is_some() {
        "# secret: set (not shown)\n"
    } else {
        "# secret: not set\n"
    };
    let key = match &s.key {
        Some(key) => format!("# this node's public key: {}\n", key.public()),
        None => "# this node's key: none (a node alone makes one at start)\n".to_string(),
    };
    format!("{secret}{key}{t}")
}
