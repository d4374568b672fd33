//! `atomos check-config` refuses a configuration that would silently shrink a cluster or drop
//! a setting (each refusal names the key or variable), warns about keys the protocol does not
//! read, and prints the effective configuration as TOML.

use std::path::PathBuf;
use std::process::{Command, Output};

use atomos::net::keys::KeyPair;

const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");
const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// A three-replica `certify` file for node 1, with `extra` lines, in a directory of its own.
fn three_replica_file(name: &str, extra: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("atomos-check-config-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("node.toml");
    // Keys derived from the ids: tests only.
    let key = |id: u8| KeyPair::from_private([id; 32]).unwrap();
    let key_file = dir.join("node-1.key");
    atomos::config::write_key_file(&key_file, &key(1), "member 1", true).unwrap();
    let text = format!(
        "cluster = \"test\"\nlisten = \"127.0.0.1:7401\"\nprotocol = \"certify\"\n{extra}\n\
         key_file = {:?}\n\
         [[peers]]\nid = 1\naddress = \"127.0.0.1:7401\"\npublic_key = \"{}\"\n\
         [[peers]]\nid = 2\naddress = \"127.0.0.1:7402\"\npublic_key = \"{}\"\n\
         [[peers]]\nid = 3\naddress = \"127.0.0.1:7403\"\npublic_key = \"{}\"\n",
        key_file.display().to_string(),
        key(1).public(),
        key(2).public(),
        key(3).public()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn check(path: &PathBuf, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(ATOMOS);
    cmd.args(["check-config", "--config"]).arg(path);
    for (name, _) in std::env::vars() {
        if name.starts_with("ATOMOS_") {
            cmd.env_remove(name);
        }
    }
    cmd.env("ATOMOS_SECRET", SECRET);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn refused_naming(out: &Output, key: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "accepted: {out:?}");
    assert!(
        stderr.contains(key),
        "the refusal does not name {key}: {stderr}"
    );
}

#[test]
fn a_configuration_that_would_shrink_the_cluster_is_refused_naming_the_key() {
    let good = three_replica_file("good", "node_id = 1");
    assert!(check(&good, &[]).status.success());
    // An empty peer list from the environment would leave node 1 committing alone.
    refused_naming(&check(&good, &[("ATOMOS_PEERS", "")]), "ATOMOS_PEERS");
    // A peer at this node's own address.
    refused_naming(
        &check(
            &good,
            &[("ATOMOS_PEERS", "1=127.0.0.1:7401,2=127.0.0.1:7401")],
        ),
        "own address",
    );
    // Peers and no node id: the node would be node 0.
    let anonymous = three_replica_file("anonymous", "");
    refused_naming(&check(&anonymous, &[("ATOMOS_PROTOCOL", "tfa")]), "node_id");
    // A misspelt variable is refused, with the one meant.
    let out = check(&good, &[("ATOMOS_PROTOCL", "tfa")]);
    refused_naming(&out, "ATOMOS_PROTOCL");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ATOMOS_PROTOCOL"));
    for path in [good, anonymous] {
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }
}

#[test]
fn keys_the_protocol_does_not_read_are_warned_about_and_the_output_is_toml() {
    let path = three_replica_file("unused", "node_id = 1\noss_commit = \"distributed-token\"");
    let out = check(&path, &[("ATOMOS_ANSWER_POLL_US", "10")]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("oss_commit is set but means nothing"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ATOMOS_ANSWER_POLL_US is set but means nothing"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let effective: toml::Table = toml::from_str(&stdout).expect("the output is TOML");
    assert_eq!(effective["node_id"].as_integer(), Some(1));
    assert_eq!(effective["protocol"].as_str(), Some("certify"));
    assert_eq!(effective["peers"].as_array().map(Vec::len), Some(2));
    assert!(effective["peers"][0]["public_key"].as_str().is_some());
    assert!(effective["key_file"].as_str().is_some());
    assert!(!stdout.contains(SECRET), "the secret was printed");
    let private = KeyPair::from_private([1; 32]).unwrap().private_hex();
    assert!(
        !stdout.contains(private.as_str()),
        "the private key was printed"
    );
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
