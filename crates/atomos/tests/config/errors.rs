//! Bad values, inconsistent membership, unknown keys and variables, shrinking clusters, keys a
//! protocol does not read, values of the wrong type: each an error or a warning that names it.

use atomos::config::{load, ConfigError};

use super::helpers::*;

#[test]
fn bad_values_name_their_key() {
    // An operator must be one of the clients listed.
    let err = load(None, env(&[("ATOMOS_OPERATORS", "ops")])).unwrap_err();
    assert_eq!(key_of(err.clone()), "ATOMOS_OPERATORS");
    assert!(
        err.to_string().contains("\"ops\" is no client's name"),
        "{err}"
    );
    assert_eq!(
        key_of(load(None, env(&[("ATOMOS_ORDER_JOIN", "maybe")])).unwrap_err()),
        "ATOMOS_ORDER_JOIN"
    );
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
