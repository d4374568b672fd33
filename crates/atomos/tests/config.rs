//! Node configuration: defaults, file, environment overrides, and errors that name the key.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use atomos::config::{load, load_client, write_key_file, ConfigError};
use atomos::net::keys::KeyPair;
use atomos::{ContentionPolicy, Protocol};

/// Key pair `n` (derived from `n`: tests only).
fn keys(n: u8) -> KeyPair {
    KeyPair::from_private([n; 32]).unwrap()
}

/// Key pair `n`'s public key, in hex.
fn pk(n: u8) -> String {
    keys(n).public().to_string()
}

/// A key file holding key pair `n`, readable by its owner only; its path.
fn key_file(n: u8) -> String {
    let path = file(&format!("key-{n}.key"), "");
    write_key_file(&path, &keys(n), "a test", true).unwrap();
    path.display().to_string()
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("atomos-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn key_of(e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { key, .. } => key,
        other => panic!("expected an invalid key, got {other}"),
    }
}

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

#[test]
fn bad_values_name_their_key() {
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_LISTEN", "nowhere")])).unwrap_err()),
        "ATOMOS_LISTEN"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_NODE_ID", "-3")])).unwrap_err()),
        "ATOMOS_NODE_ID"
    );
    // Ids with the top bit set belong to clients.
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_NODE_ID", "9223372036854775808")])).unwrap_err()),
        "ATOMOS_NODE_ID"
    );
    assert_eq!(
        key_of(
            load(
                None,
                env(&[
                    ("ATOMOS_NODE_ID", "1"),
                    ("ATOMOS_PEERS", "9223372036854775809=127.0.0.1:7000"),
                ])
            )
            .unwrap_err()
        ),
        "peers"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_LOG_LEVEL", "loud")])).unwrap_err()),
        "ATOMOS_LOG_LEVEL"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_PROTOCOL", "magic")])).unwrap_err()),
        "ATOMOS_PROTOCOL"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_MAX_FRAME_BYTES", "12")])).unwrap_err()),
        "ATOMOS_MAX_FRAME_BYTES"
    );
    for key in ["ATOMOS_BUSY_POLL_US", "ATOMOS_ANSWER_POLL_US"] {
        for bad in ["-1", "2000000", "fast"] {
            assert_eq!(key_of(load(None, env(&[(key, bad)])).unwrap_err()), key);
        }
    }
    let off = load(None, env(&[("ATOMOS_BUSY_POLL_US", "0")])).unwrap();
    assert!(off.busy_poll.is_zero());
    let off = load(None, env(&[("ATOMOS_ANSWER_POLL_US", "0")])).unwrap();
    assert!(off.answer_poll.is_zero() && !off.busy_poll.is_zero());
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_CONTENTION", "polite")])).unwrap_err()),
        "ATOMOS_CONTENTION"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_OSS_COMMIT", "lottery")])).unwrap_err()),
        "ATOMOS_OSS_COMMIT"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_OSS_DOMAINS", "acct/,,x/")])).unwrap_err()),
        "ATOMOS_OSS_DOMAINS"
    );
    let path = file("dup-domains.toml", "oss_domains = [\"a/\", \"a/\"]\n");
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "oss_domains"
    );
    let path = file("bad-listen.toml", "listen = \"localhost\"\n");
    let err = load(Some(&path), env(&[])).unwrap_err();
    assert!(
        err.to_string().contains("listen") && err.to_string().contains("localhost"),
        "{err}"
    );
    let path = file(
        "bad-peer.toml",
        "secret = \"0123456789abcdef0123456789abcdef\"\n[[peers]]\nid = 2\naddress = \"x\"\n",
    );
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "peers[0].address"
    );
}

#[test]
fn inconsistent_membership_and_missing_secrets_are_refused() {
    assert_eq!(
        key_of(
            load(
                None,
                env(&[
                    ("ATOMOS_NODE_ID", "1"),
                    ("ATOMOS_PEERS", "2=127.0.0.1:7402")
                ])
            )
            .unwrap_err()
        ),
        "secret"
    );
    let dup = env(&[
        ("ATOMOS_NODE_ID", "1"),
        ("ATOMOS_SECRET", SECRET),
        ("ATOMOS_PEERS", "2=127.0.0.1:7402,2=127.0.0.1:7403"),
    ]);
    assert_eq!(key_of(load(None, dup).unwrap_err()), "peers");
    let wrong_self = env(&[
        ("ATOMOS_SECRET", SECRET),
        ("ATOMOS_PEERS", "0=127.0.0.1:9999"),
    ]);
    assert_eq!(key_of(load(None, wrong_self).unwrap_err()), "peers");
    let short = env(&[
        ("ATOMOS_NODE_ID", "1"),
        ("ATOMOS_SECRET", "only 31 bytes long, too short!!"),
        ("ATOMOS_PEERS", "2=127.0.0.1:7402"),
    ]);
    let err = load(None, short).unwrap_err();
    assert!(err.to_string().contains("at least 32 bytes"), "{err}");
    assert_eq!(key_of(err), "ATOMOS_SECRET");
}

/// A secret long enough to be accepted.
const SECRET: &str = "0123456789abcdef0123456789abcdef";

#[test]
fn unknown_keys_and_broken_files_are_errors() {
    let path = file("unknown.toml", "node_id = 3\nclusterr = \"typo\"\n");
    let err = load(Some(&path), env(&[])).unwrap_err();
    assert!(
        matches!(err, ConfigError::Parse { .. })
            && err.to_string().contains("line 2: unknown key `clusterr`")
            && err.to_string().contains("did you mean `cluster`?"),
        "{err}"
    );
    let path = file("broken.toml", "cluster = \n");
    assert!(matches!(
        load(Some(&path), env(&[])),
        Err(ConfigError::Parse { .. })
    ));
    let missing = std::env::temp_dir().join("atomos-no-such-config.toml");
    assert!(matches!(
        load(Some(&missing), env(&[])),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn a_configuration_that_would_shrink_a_cluster_is_refused() {
    let peers = format!("2=127.0.0.1:7402/{},3=127.0.0.1:7403/{}", pk(2), pk(3));
    let own_key = key_file(1);
    let three = env(&[
        ("ATOMOS_NODE_ID", "1"),
        ("ATOMOS_SECRET", SECRET),
        ("ATOMOS_KEY_FILE", &own_key),
        ("ATOMOS_LISTEN", "127.0.0.1:7401"),
        ("ATOMOS_PEERS", &peers),
    ]);
    assert_eq!(load(None, three).unwrap().peers.len(), 2);
    // An empty peer list from the environment.
    let empty = env(&[("ATOMOS_NODE_ID", "1"), ("ATOMOS_PEERS", " ")]);
    assert_eq!(key_of(load(None, empty).unwrap_err()), "ATOMOS_PEERS");
    // A peer at this node's own address, and two peers at one address.
    for list in [
        "2=127.0.0.1:7401,3=127.0.0.1:7403",
        "2=127.0.0.1:7402,3=127.0.0.1:7402",
    ] {
        let vars = env(&[
            ("ATOMOS_NODE_ID", "1"),
            ("ATOMOS_SECRET", SECRET),
            ("ATOMOS_LISTEN", "127.0.0.1:7401"),
            ("ATOMOS_PEERS", list),
        ]);
        assert_eq!(key_of(load(None, vars).unwrap_err()), "peers", "{list}");
    }
    // Peers and no node id (under tfa, which needs no order replica, it used to become 0).
    let anonymous = env(&[
        ("ATOMOS_PROTOCOL", "tfa"),
        ("ATOMOS_SECRET", SECRET),
        ("ATOMOS_PEERS", "2=127.0.0.1:7402"),
    ]);
    assert_eq!(key_of(load(None, anonymous).unwrap_err()), "node_id");
}

#[test]
fn unknown_variables_are_refused_naming_the_one_meant() {
    let err =
        atomos::config::check_variables(["PATH", "ATOMOS_SIM_SEED", "ATOMOS_PROTOCL"]).unwrap_err();
    assert_eq!(key_of(err.clone()), "ATOMOS_PROTOCL");
    assert!(err.to_string().contains("ATOMOS_PROTOCOL"), "{err}");
    let known = atomos::config::config_variables();
    assert!(atomos::config::check_variables(known.iter().map(String::as_str)).is_ok());
}

#[test]
fn keys_the_protocol_does_not_read_are_listed() {
    let path = file("unused.toml", "oss_commit = \"distributed-token\"\n");
    let s = load(
        Some(&path),
        env(&[
            ("ATOMOS_COMMIT_TIMEOUT_MS", "100"),
            ("ATOMOS_ANSWER_POLL_US", "5"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.unused,
        [
            "ATOMOS_ANSWER_POLL_US",
            "ATOMOS_COMMIT_TIMEOUT_MS",
            "oss_commit"
        ]
    );
    assert!(
        !s.metrics_hot_spot_keys,
        "keys are application data: off unless asked"
    );
    let shown = load(None, env(&[("ATOMOS_METRICS_HOT_SPOT_KEYS", "true")])).unwrap();
    assert!(shown.metrics_hot_spot_keys);
    let oss = load(
        Some(&path),
        env(&[("ATOMOS_PROTOCOL", "oss"), ("ATOMOS_NODE_ID", "1")]),
    )
    .unwrap();
    assert!(oss.unused.is_empty(), "{:?}", oss.unused);
    // The fsync policy is tfa's log's too, the commit timeout oss's commits' too; oss's
    // control log is never compacted.
    let tfa = load(
        None,
        env(&[("ATOMOS_PROTOCOL", "tfa"), ("ATOMOS_ORDER_FSYNC", "never")]),
    )
    .unwrap();
    assert!(tfa.unused.is_empty(), "{:?}", tfa.unused);
    let oss = load(
        None,
        env(&[
            ("ATOMOS_PROTOCOL", "oss"),
            ("ATOMOS_NODE_ID", "1"),
            ("ATOMOS_COMMIT_TIMEOUT_MS", "100"),
            ("ATOMOS_ORDER_SNAPSHOT_EVERY", "100"),
        ]),
    )
    .unwrap();
    assert_eq!(oss.unused, ["ATOMOS_ORDER_SNAPSHOT_EVERY"]);
}

#[test]
fn client_request_limits_are_read_and_checked() {
    let d = load(None, env(&[])).unwrap();
    assert_eq!(d.client_requests_max, 64);
    assert_eq!(d.client_request_timeout, Duration::from_secs(10));
    let s = load(
        None,
        env(&[
            ("ATOMOS_CLIENT_REQUESTS_MAX", "8"),
            ("ATOMOS_CLIENT_REQUEST_TIMEOUT_MS", "250"),
        ]),
    )
    .unwrap();
    assert_eq!(s.client_requests_max, 8);
    assert_eq!(s.client_request_timeout, Duration::from_millis(250));
    for (var, value) in [
        ("ATOMOS_CLIENT_REQUESTS_MAX", "0"),
        ("ATOMOS_CLIENT_REQUESTS_MAX", "100000"),
        ("ATOMOS_CLIENT_REQUEST_TIMEOUT_MS", "0"),
    ] {
        assert_eq!(key_of(load(None, env(&[(var, value)])).unwrap_err()), var);
    }
}

#[test]
fn member_and_client_keys_are_read_and_checked() {
    let own = key_file(1);
    let base = |extra: &[(&'static str, String)]| {
        let mut vars = vec![
            ("ATOMOS_NODE_ID", "1".to_string()),
            ("ATOMOS_SECRET", SECRET.to_string()),
            ("ATOMOS_KEY_FILE", own.clone()),
            ("ATOMOS_LISTEN", "127.0.0.1:7401".to_string()),
            ("ATOMOS_PEERS", format!("2=127.0.0.1:7402/{}", pk(2))),
        ];
        for (k, v) in extra {
            vars.retain(|(key, _)| key != k);
            vars.push((k, v.clone()));
        }
        move |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
        }
    };
    assert!(load(None, base(&[])).is_ok());
    let refused = |extra: &[(&'static str, String)]| {
        let err = load(None, base(extra)).unwrap_err();
        (key_of(err.clone()), err.to_string())
    };
    // No key file, though the node has peers.
    let err = load(
        None,
        env(&[
            ("ATOMOS_NODE_ID", "1"),
            ("ATOMOS_SECRET", SECRET),
            ("ATOMOS_PEERS", &format!("2=127.0.0.1:7402/{}", pk(2))),
        ]),
    )
    .unwrap_err();
    assert_eq!(key_of(err), "key_file");
    // A key file others may read.
    let open = file("open.key", "");
    write_key_file(&open, &keys(1), "a test", true).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (key, text) = refused(&[("ATOMOS_KEY_FILE", open.display().to_string())]);
    assert_eq!(key, "ATOMOS_KEY_FILE");
    assert!(text.contains("chmod 600"), "{text}");
    // Not a key file; a key file whose public key is not its private key's.
    let junk = file("junk.key", "hello");
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        refused(&[("ATOMOS_KEY_FILE", junk.display().to_string())]).0,
        "ATOMOS_KEY_FILE"
    );
    let lying = file(
        "lying.key",
        &format!(
            "public_key = \"{}\"\nprivate_key = \"{}\"\n",
            pk(2),
            keys(1).private_hex().as_str()
        ),
    );
    std::fs::set_permissions(&lying, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (key, text) = refused(&[("ATOMOS_KEY_FILE", lying.display().to_string())]);
    assert_eq!(key, "ATOMOS_KEY_FILE");
    assert!(text.contains("does not belong"), "{text}");
    // A member without a key, a malformed key, one key for two members, this node listed
    // with a key that is not its own.
    let (key, text) = refused(&[("ATOMOS_PEERS", "2=127.0.0.1:7402".into())]);
    assert_eq!(key, "ATOMOS_PEERS");
    assert!(text.contains("member 2 has no public_key"), "{text}");
    assert_eq!(
        refused(&[("ATOMOS_PEERS", "2=127.0.0.1:7402/abc".into())]).0,
        "ATOMOS_PEERS"
    );
    let shared = format!("2=127.0.0.1:7402/{},3=127.0.0.1:7403/{}", pk(2), pk(2));
    assert_eq!(refused(&[("ATOMOS_PEERS", shared)]).0, "ATOMOS_PEERS");
    let not_mine = format!("1=127.0.0.1:7401/{},2=127.0.0.1:7402/{}", pk(5), pk(2));
    assert_eq!(refused(&[("ATOMOS_PEERS", not_mine)]).0, "ATOMOS_PEERS");
    let mine = format!("1=127.0.0.1:7401/{},2=127.0.0.1:7402/{}", pk(1), pk(2));
    assert!(load(None, base(&[("ATOMOS_PEERS", mine)])).is_ok());
    // Clients: a member's key, a name twice, malformed entries.
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", format!("app={}", pk(2)))]).0,
        "ATOMOS_CLIENTS"
    );
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", format!("app={},app={}", pk(8), pk(9)))]).0,
        "ATOMOS_CLIENTS"
    );
    // A node alone that lists clients needs its own key and the secret: otherwise it makes
    // random ones and no client could ever connect.
    let alone = env(&[("ATOMOS_CLIENTS", &format!("app={}", pk(8)))]);
    assert_eq!(key_of(load(None, alone).unwrap_err()), "key_file");
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", "app".into())]).0,
        "ATOMOS_CLIENTS"
    );
    assert_eq!(
        refused(&[("ATOMOS_CLIENTS", "app=12".into())]).0,
        "ATOMOS_CLIENTS"
    );
    let path = file(
        "bad-client.toml",
        "[[clients]]\nname = \"app\"\npublic_key = \"zz\"\n",
    );
    let twice = file(
        "twice-client.toml",
        &format!(
            "[[clients]]\nname = \"app\"\npublic_key = \"{}\"\n\
             [[clients]]\nname = \"app\"\npublic_key = \"{}\"\n",
            pk(8),
            pk(9)
        ),
    );
    assert_eq!(
        key_of(load(Some(&twice), base(&[])).unwrap_err()),
        "clients"
    );
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "clients[0].public_key"
    );
}

#[test]
fn a_client_configuration_file_is_read_and_checked() {
    let client_key = file("client.key", "");
    write_key_file(&client_key, &keys(30), "a test client", true).unwrap();
    let text = format!(
        "cluster = \"prod\"\nsecret = \"{SECRET}\"\nkey_file = \"client.key\"\nlimit_ms = 2500\n\
         [[members]]\nid = 1\naddress = \"127.0.0.1:7401\"\npublic_key = \"{}\"\n\
         [[members]]\nid = 2\naddress = \"127.0.0.1:7402\"\npublic_key = [\"{}\", \"{}\"]\n",
        pk(1),
        pk(2),
        pk(22)
    );
    let cfg = load_client(&file("client.toml", &text)).unwrap();
    assert_eq!(cfg.cluster, "prod");
    assert_eq!(
        cfg.key.public(),
        keys(30).public(),
        "key_file is beside the file"
    );
    assert_eq!(cfg.members.len(), 2);
    assert_eq!(
        cfg.member_keys[&2],
        vec![keys(2).public(), keys(22).public()]
    );
    assert_eq!(cfg.limit, Duration::from_millis(2500));
    let bad = |text: String| key_of(load_client(&file("bad-client-cfg.toml", &text)).unwrap_err());
    assert_eq!(bad(text.replace(&pk(1), "nothex")), "members[0].public_key");
    assert_eq!(bad(text.replace("client.key", "missing.key")), "key_file");
    assert_eq!(bad(text.replace(SECRET, "short")), "secret");
    assert_eq!(bad(text.replace("2500", "0")), "limit_ms");
}

/// Logging: a level or filter directives, text or JSON; anything else names its key.
#[test]
fn log_filters_and_formats_are_read_and_checked() {
    use atomos::config::LogFormat;
    let s = load(None, env(&[])).unwrap();
    assert_eq!(
        (s.log_level.as_str(), s.log_format),
        ("info", LogFormat::Text)
    );
    let s = load(
        None,
        env(&[
            ("ATOMOS_LOG_LEVEL", "info,atomos_order=debug"),
            ("ATOMOS_LOG_FORMAT", "json"),
        ]),
    )
    .unwrap();
    assert_eq!(s.log_level, "info,atomos_order=debug");
    assert_eq!(s.log_format, LogFormat::Json);
    let bad = load(None, env(&[("ATOMOS_LOG_LEVEL", "loud=[")])).unwrap_err();
    assert_eq!(key_of(bad), "ATOMOS_LOG_LEVEL");
    let path = file("bad-format.toml", "log_format = \"xml\"\n");
    assert_eq!(
        key_of(load(Some(&path), env(&[])).unwrap_err()),
        "log_format"
    );
}

#[test]
fn a_file_value_of_the_wrong_type_names_its_key_and_line() {
    for (text, key, wanted) in [
        (
            "node_id = \"one\"\n",
            "node_id",
            "must be an integer (line 1), not string",
        ),
        (
            "cluster = \"x\"\norder = 1\n",
            "order",
            "must be a boolean (line 2), not integer",
        ),
        (
            "oss_domains = \"a/\"\n",
            "oss_domains",
            "must be an array of strings",
        ),
        (
            "oss_domains = [\"a/\", 3]\n",
            "oss_domains",
            "must be an array of strings",
        ),
        (
            "listen = 7401\n",
            "listen",
            "must be a string (line 1), not integer",
        ),
        ("peers = [1, 2]\n", "peers", "must be an array of tables"),
        ("[[peers]]\nid = 2\nadress = \"x\"\n", "peers[0]", "adress"),
    ] {
        let path = file("wrong-type.toml", text);
        let err = load(Some(&path), env(&[])).unwrap_err();
        let shown = err.to_string();
        assert_eq!(key_of(err), key, "{text}");
        assert!(shown.contains(wanted), "{text}: {shown}");
    }
}

#[test]
fn the_configuration_reference_in_the_guide_is_the_code_s() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/guide/configuration.md"
    );
    let committed = std::fs::read_to_string(path).unwrap();
    let generated = atomos::config::reference_markdown();
    assert!(
        committed == generated,
        "docs/guide/configuration.md differs from the settings table: regenerate it with \
         `cargo run -p atomos-cli -- config-reference > docs/guide/configuration.md`"
    );
    for row in atomos::config::SETTINGS.iter() {
        assert!(
            generated.contains(&format!("### {}\n", row.key)),
            "{}",
            row.key
        );
        assert!(generated.contains(&row.variable()), "{}", row.key);
    }
}

#[test]
fn the_effective_configuration_loads_back_to_the_same_settings() {
    // A key file of its own: other tests rewrite `key_file(1)`'s while they run.
    let own_key = file("round-trip-1.key", "");
    write_key_file(&own_key, &keys(1), "a test", true).unwrap();
    let own_key = own_key.display().to_string();
    let text = format!(
        "cluster = \"prod\"\nnode_id = 1\nlisten = \"127.0.0.1:7501\"\ndata_dir = \"/tmp/x\"\n\
         key_file = {own_key:?}\nprotocol = \"oss\"\ncontention = \"priority\"\n\
         log_level = \"info,atomos_order=debug\"\nlog_format = \"json\"\nmetrics = \"9501\"\n\
         metrics_hot_spot_keys = true\nmax_frame_bytes = 4096\nbusy_poll_us = 0\n\
         answer_poll_us = 7\norder_fsync = \"10ms\"\norder_load_clients = 2\n\
         order_snapshot_every = 50\nbank_load_threads = 3\ncommit_timeout_ms = 1234\n\
         order_rejoin = true\noss_commit = \"coordinator-token\"\noss_domains = [\"a/\", \"b/\"]\n\
         sched = \"lazy:8\"\nsched_workers = 3\nruntime_threads = 2\nclient_requests_max = 9\n\
         client_request_timeout_ms = 250\n\
         [[peers]]\nid = 2\naddress = \"127.0.0.1:7502\"\npublic_key = [\"{}\", \"{}\"]\n\
         [[clients]]\nname = \"app\"\npublic_key = \"{}\"\n",
        pk(2),
        pk(4),
        pk(3)
    );
    let first = load(
        Some(&file("full.toml", &text)),
        env(&[("ATOMOS_SECRET", SECRET)]),
    )
    .unwrap();
    let shown = atomos::config::effective_toml(&first);
    assert!(!shown.contains(SECRET), "the secret is never written");
    for row in atomos::config::SETTINGS
        .iter()
        .filter(|r| r.key != "secret")
    {
        assert!(
            shown.contains(&format!("{} = ", row.key))
                || shown.contains(&format!("[[{}]]", row.key)),
            "{} missing:\n{shown}",
            row.key
        );
    }
    let again = load(
        Some(&file("effective.toml", &shown)),
        env(&[("ATOMOS_SECRET", SECRET)]),
    )
    .unwrap();
    assert_eq!(first, again);
}
