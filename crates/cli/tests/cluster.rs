//! Real processes on loopback: `atomos cluster up`, kill -9 and restart of a node, an impostor
//! with the wrong secret, clean shutdown on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

mod common;

use common::{cluster_up, signal, wait_exit, wait_for_line, ATOMOS};

fn start_node(config: &Path, log: &Path, env: &[(&str, &str)]) -> Child {
    Command::new(ATOMOS)
        .args(["node", "--config"])
        .arg(config)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn stop(mut child: Child) -> std::process::ExitStatus {
    signal(child.id(), libc::SIGTERM);
    wait_exit(&mut child, Duration::from_secs(10))
}

#[test]
fn cluster_survives_kill_9_refuses_a_wrong_secret_and_stops_cleanly() {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(3);
    let (mut up, pids) = cluster_up(3, base_port, &dir, &[]);
    let log = |n: usize| dir.join(format!("node-{n}.log"));

    // Every node exchanges requests with the others.
    for (a, b) in [(1, 2), (1, 3), (2, 3), (3, 1)] {
        wait_for_line(&log(a), 0, &["peer answers", &format!("peer={b}")]);
    }

    // `atomos status` reaches every member with the generated client's key.
    let status = |wait: &str| {
        let out = Command::new(ATOMOS)
            .args(["status", "--wait", wait, "--client"])
            .arg(dir.join("client.toml"))
            .output()
            .expect("atomos status runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, table) = status("5");
    assert_eq!(code, Some(0), "{table}");
    assert_eq!(table.matches("not replicated").count(), 4, "{table}");
    assert!(
        table.contains("not replicated (local): 3 of 3 members answered"),
        "{table}"
    );

    // kill -9 node 3: the others notice.
    signal(pids[2], libc::SIGKILL);
    let down = wait_for_line(&log(1), 0, &["peer does not answer", "peer=3"]);
    wait_for_line(&log(2), 0, &["peer does not answer", "peer=3"]);
    let (code, table) = status("1");
    assert_eq!(code, Some(1), "{table}");
    let third = table
        .lines()
        .find(|l| l.starts_with('3'))
        .unwrap_or_default();
    assert!(third.contains("unreachable"), "{table}");

    // An impostor with node 3's configuration but the wrong secret is refused, and both sides
    // say why.
    let impostor_log = dir.join("impostor.log");
    let impostor = start_node(
        &dir.join("node-3.toml"),
        &impostor_log,
        &[(
            "ATOMOS_SECRET",
            "not the cluster secret, but as long as one",
        )],
    );
    wait_for_line(
        &log(1),
        down,
        &["connection refused", "peer=3", "cluster secret"],
    );
    wait_for_line(
        &impostor_log,
        0,
        &["refused", "does not open with the cluster secret"],
    );
    assert!(stop(impostor).success());

    // The real node 3 restarts: the others reconnect on their own.
    let restarted_log = dir.join("node-3-restarted.log");
    let restarted = start_node(&dir.join("node-3.toml"), &restarted_log, &[]);
    wait_for_line(&log(1), down, &["peer answers", "peer=3"]);
    wait_for_line(&log(2), down, &["peer answers", "peer=3"]);
    wait_for_line(&restarted_log, 0, &["peer answers", "peer=1"]);

    // Ctrl-C stops the cluster: each remaining node shuts down cleanly.
    signal(up.id(), libc::SIGINT);
    assert!(wait_exit(&mut up, Duration::from_secs(15)).success());
    for n in [1, 2] {
        wait_for_line(&log(n), 0, &["node stopped"]);
    }
    assert!(stop(restarted).success());
    wait_for_line(&restarted_log, 0, &["node stopped"]);
}

#[test]
fn a_bad_configuration_names_the_key_and_the_node_does_not_start() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let path = dir.join(format!("bad-{}.toml", std::process::id()));
    std::fs::write(&path, "node_id = 1\nlisten = \"nowhere\"\n").unwrap();
    let out = Command::new(ATOMOS)
        .args(["node", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("listen") && err.contains("nowhere"), "{err}");
}
