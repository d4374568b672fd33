//! `atomos demo`, the README's first command: three replicas, the leader killed and brought
//! back, and the invariant checked on every replica.

use std::process::Command;

const ATOMOS: &str = env!("CARGO_BIN_EXE_atomos");

#[test]
fn the_demo_kills_the_leader_brings_it_back_and_every_replica_holds_the_money() {
    let out = Command::new(ATOMOS)
        .args(["demo", "--duration", "4"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("the leader: its log is gone"), "{text}");
    assert!(text.contains("restarted with an empty log"), "{text}");
    for node in 1..=3 {
        assert!(
            text.contains(&format!("node {node}: total 64000 (expected 64000)")),
            "{text}"
        );
    }
    assert!(text.contains("invariant: OK"), "{text}");
    assert!(!text.contains("VIOLATED"), "{text}");
}
