//! A replica whose disk fails stops its process with a non-zero status and the cause in its
//! log, while the others go on serving; a healthy node answers `/health` with `ok`.
//!
//! The failure: a directory where the replica's log compaction must create its new log file,
//! so the compaction fails (`Is a directory`), which no permission bit can do for a root user.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{cluster_up, http_get, kill_dead, signal, wait_exit, ATOMOS};

/// Port offset of each node's metrics endpoint from its listening port (as `cluster up` sets).
const METRICS_OFFSET: u16 = 100;

fn acked(dir: &Path) -> usize {
    (1..=3)
        .map(|n| {
            std::fs::metadata(dir.join(format!("data/{n}/acked.log"))).map_or(0, |m| m.len())
                as usize
                / 8
        })
        .sum()
}

fn wait_for_more_acks(dir: &Path, more: usize) {
    let start = acked(dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked(dir) < start + more {
        assert!(
            Instant::now() < deadline,
            "requests stopped being acknowledged"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_failing_disk_stops_its_node_with_the_cause_and_the_others_go_on() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("disk-failure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(3);
    let (mut up, pids) = cluster_up(3, base_port, &dir, &["--order", "--order-load", "8"]);
    wait_for_more_acks(&dir, 1_000);

    let health = http_get(base_port + METRICS_OFFSET, "/health");
    assert!(
        health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
        "{health}"
    );
    let metrics = http_get(base_port + METRICS_OFFSET, "/metrics");
    assert!(
        metrics.contains("atomos_order_opt_delivered_total"),
        "{metrics}"
    );
    assert!(http_get(base_port + METRICS_OFFSET, "/other").starts_with("HTTP/1.1 404"));

    // Node 3 goes down; its next compaction will fail.
    kill_dead(pids[2]);
    std::fs::create_dir_all(dir.join("data/3/order.compact")).unwrap();
    let log = dir.join("node-3-failing.log");
    let mut failing = Command::new(ATOMOS)
        .args(["node", "--config"])
        .arg(dir.join("node-3.toml"))
        .env("ATOMOS_ORDER_SNAPSHOT_EVERY", "20")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut failing, Duration::from_secs(60));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "the node exited cleanly:\n{text}");
    assert!(
        text.contains("ERROR") && text.contains("order.compact"),
        "the cause is not in the log:\n{text}"
    );

    // The two others still order and answer.
    wait_for_more_acks(&dir, 1_000);
    signal(up.id(), libc::SIGINT);
    wait_exit(&mut up, Duration::from_secs(15));
    let _ = std::fs::remove_dir_all(&dir);
}
