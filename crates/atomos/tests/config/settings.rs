//! Defaults, a file with a membership list, environment overrides, and each protocol's and
//! service's settings.

use atomos::config::load;
use atomos::net::keys::KeyPair;
use atomos::{ContentionPolicy, Protocol};

use super::helpers::*;

#[test]
fn defaults_work_without_a_file() {
    let s = load(None, env(&[])).unwrap();
    assert_eq!(s.cluster, "atomos");
    assert_eq!(s.listen.to_string(), "127.0.0.1:7400");
    assert!(s.data_dir.starts_with("./atomos-data"));
    assert_eq!(s.protocol, Protocol::Local);
    assert_eq!(s.max_frame_bytes, 16 << 20);
    assert_eq!(s.busy_poll, atomos::net::tcp::DEFAULT_BUSY_POLL);
    assert_eq!(s.answer_poll, atomos::runtime::DEFAULT_ANSWER_POLL);
    assert!(s.peers.is_empty() && s.secret.is_none() && s.metrics.is_none());
}

/// Host names with a port are accepted where addresses are, resolved when the configuration
/// loads; a name without a port, or one that resolves to nothing, names its key.
#[test]
fn host_names_are_accepted_where_addresses_are() {
    let s = load(None, env(&[("ATOMOS_LISTEN", "localhost:7401")])).unwrap();
    assert!(s.listen.ip().is_loopback(), "{}", s.listen);
    assert_eq!(s.listen.port(), 7401);
    let err = load(None, env(&[("ATOMOS_LISTEN", "no-such-host.invalid:7401")])).unwrap_err();
    assert_eq!(key_of(err), "ATOMOS_LISTEN");
}

#[test]
fn a_file_with_a_membership_list_and_environment_overrides() {
    let path = file(
        "full.toml",
        &r#"
cluster = "prod"
node_id = 1
listen = "127.0.0.1:7401"
secret = "0123456789abcdef0123456789abcdef-file"
key_file = "KEY_FILE"
contention = "priority"
log_level = "debug"
metrics = "127.0.0.1:9401"

[[peers]]
id = 1
address = "127.0.0.1:7401"
public_key = "PK1"

[[peers]]
id = 2
address = "127.0.0.1:7402"
public_key = ["PK2", "PK22"]

[[clients]]
name = "app"
public_key = "PK9"
"#
        .replace("KEY_FILE", &key_file(1))
        .replace("PK1", &pk(1))
        .replace("PK22", &pk(22))
        .replace("PK2", &pk(2))
        .replace("PK9", &pk(9)),
    );
    let s = load(Some(&path), env(&[])).unwrap();
    assert_eq!((s.cluster.as_str(), s.node_id), ("prod", 1));
    assert_eq!(s.contention, ContentionPolicy::Priority);
    assert_eq!(s.peers.len(), 1, "this node is dropped from its own peers");
    assert_eq!(s.peers[0].id, 2);
    assert_eq!(
        s.peers[0].public_keys,
        vec![keys(2).public(), keys(22).public()],
        "a member rotating its key lists two"
    );
    assert_eq!(s.key.as_ref().map(KeyPair::public), Some(keys(1).public()));
    assert_eq!(s.clients.len(), 1);
    assert_eq!(
        (s.clients[0].name.as_str(), s.clients[0].public_key),
        ("app", keys(9).public())
    );
    assert!(
        !format!("{s:?}").contains(keys(1).private_hex().as_str()),
        "the private key is never printed"
    );
    assert_eq!(
        s.secret.as_ref().unwrap().expose(),
        b"0123456789abcdef0123456789abcdef-file"
    );
    assert!(
        !format!("{s:?}").contains("0123456789abcdef0123456789abcdef-file"),
        "the secret is never printed"
    );

    let s = load(
        Some(&path),
        env(&[
            ("ATOMOS_SECRET", "0123456789abcdef0123456789abcdef-env"),
            ("ATOMOS_LISTEN", "127.0.0.1:7501"),
            ("ATOMOS_PEERS", &format!("3=127.0.0.1:7503/{}", pk(3))),
            ("ATOMOS_CLIENTS", &format!("a={},b={}", pk(10), pk(11))),
        ]),
    )
    .unwrap();
    assert_eq!(s.peers[0].public_keys, vec![keys(3).public()]);
    assert_eq!(
        s.clients
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(
        s.secret.unwrap().expose(),
        b"0123456789abcdef0123456789abcdef-env"
    );
    assert_eq!(s.listen.to_string(), "127.0.0.1:7501");
    assert_eq!(s.peers.iter().map(|p| p.id).collect::<Vec<_>>(), vec![3]);
}

#[test]
fn oss_commit_modes_and_domains_are_read() {
    let path = file(
        "oss.toml",
        "protocol = \"oss\"\nnode_id = 1\noss_commit = \"coordinator-token\"\noss_domains = [\"acct/\", \"list/\"]\n",
    );
    let s = load(Some(&path), env(&[])).unwrap();
    assert_eq!(
        s.oss_commit,
        atomos::protocols::oss::CommitMode::CoordinatorToken
    );
    assert_eq!(
        s.oss_domains,
        vec!["acct/".to_string(), "list/".to_string()]
    );
    let s = load(
        Some(&path),
        env(&[
            ("ATOMOS_OSS_COMMIT", "distributed-token"),
            ("ATOMOS_OSS_DOMAINS", "x/"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.oss_commit,
        atomos::protocols::oss::CommitMode::DistributedToken
    );
    assert_eq!(s.oss_domains, vec!["x/".to_string()]);
    let s = load(None, env(&[])).unwrap();
    assert_eq!(s.oss_commit, atomos::protocols::oss::CommitMode::UltraPeer);
    assert!(s.oss_domains.is_empty());
}

#[test]
fn a_transaction_service_is_configured_by_its_policy_and_workers() {
    use atomos::service::Policy;
    let path = file("sched.toml", "sched = \"lazy:8\"\nsched_workers = 3\n");
    let s = load(Some(&path), env(&[])).unwrap();
    assert_eq!((s.sched, s.sched_workers), (Some(Policy::Lazy(8)), 3));
    let s = load(Some(&path), env(&[("ATOMOS_SCHED", "preemptive")])).unwrap();
    assert_eq!(s.sched, Some(Policy::Preemptive));
    assert_eq!(load(None, env(&[])).unwrap().sched, None);
    for (key, value) in [
        ("ATOMOS_SCHED", "fifo"),
        ("ATOMOS_SCHED", "cmax:0"),
        ("ATOMOS_SCHED", "cmax:-1"),
        ("ATOMOS_SCHED_WORKERS", "0"),
        ("ATOMOS_SCHED_WORKERS", "many"),
    ] {
        assert_eq!(key_of(load(None, env(&[(key, value)])).unwrap_err()), key);
    }
}

#[test]
fn the_runtime_threads_are_the_cores_unless_set() {
    assert_eq!(load(None, env(&[])).unwrap().runtime_threads, None);
    let path = file("runtime.toml", "runtime_threads = 3\n");
    assert_eq!(
        load(Some(&path), env(&[])).unwrap().runtime_threads,
        Some(3)
    );
    let s = load(Some(&path), env(&[("ATOMOS_RUNTIME_THREADS", "1")])).unwrap();
    assert_eq!(s.runtime_threads, Some(1));
    for value in ["0", "1025", "two", "-1"] {
        let e = load(None, env(&[("ATOMOS_RUNTIME_THREADS", value)])).unwrap_err();
        assert_eq!(key_of(e), "ATOMOS_RUNTIME_THREADS", "{value}");
    }
    let bad = file("runtime-bad.toml", "runtime_threads = 0\n");
    assert_eq!(
        key_of(load(Some(&bad), env(&[])).unwrap_err()),
        "runtime_threads"
    );
}
