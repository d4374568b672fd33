//! A rolling upgrade under load, with real processes: `atomos cluster up --nodes 3 --protocol
//! certify --bank-load 2` starts every node speaking the previous release's wire version
//! (`wire_version`, the old build behind a switch: its preamble and messages as that release
//! sent them). Then each node in turn is killed with SIGKILL and restarted speaking this build's
//! version, while the others keep moving money. After each step every link speaks the newest
//! version both of its ends do (the metric `atomos_link_wire_version`); at the end all speak
//! the new one. Every audit found the total, no replica diverged, and every transfer a node saw
//! acknowledged is counted in the replicated state.

use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use atomos::net::wire::{OLDEST_WIRE_VERSION, WIRE_VERSION};
use common::bank::{nothing_acknowledged_lost, wait_audits};
use common::{cluster_up_with, kill_dead, restart_with, signal, wait_exit, KillOnDrop};

const TOTAL: i64 = 64_000;
const NODES: usize = 3;

/// The wire version of each of node `node`'s links to the other members, by peer id, as its
/// metrics endpoint reports them (absent: no connection has opened since it started).
fn link_versions(base_port: u16, node: usize) -> Vec<(u64, u16)> {
    let text = common::http_get(base_port + node as u16 + 100, "/metrics");
    let mut versions: Vec<(u64, u16)> = text
        .lines()
        .filter(|l| l.starts_with("atomos_link_wire_version{"))
        .filter_map(|l| {
            let peer = l.split("peer=\"").nth(1)?.split('"').next()?.parse().ok()?;
            let version = l.rsplit(' ').next()?.parse::<f64>().ok()? as u16;
            Some((peer, version))
        })
        .collect();
    versions.sort_unstable();
    versions
}

/// Waits until every node's links speak, to each peer, what `speaks` says both ends do.
fn wait_link_versions(base_port: u16, speaks: &[u16], what: &str) {
    let want = |node: usize| -> Vec<(u64, u16)> {
        (0..NODES)
            .filter(|&p| p != node)
            .map(|p| (p as u64 + 1, speaks[node].min(speaks[p])))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen: Vec<Vec<(u64, u16)>> = (0..NODES).map(|n| link_versions(base_port, n)).collect();
        if (0..NODES).all(|n| seen[n] == want(n)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: links speak {seen:?}, expected {:?}",
            (0..NODES).map(want).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_cluster_upgraded_one_member_at_a_time_under_load_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("atomos-rolling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(NODES);
    let old = OLDEST_WIRE_VERSION.to_string();
    let (mut up, mut pids) = cluster_up_with(
        NODES,
        base_port,
        &dir,
        &["--protocol", "certify", "--bank-load", "2"],
        &[
            ("ATOMOS_WIRE_VERSION", old.as_str()),
            ("ATOMOS_ORDER_SNAPSHOT_EVERY", "200"),
        ],
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let mut current: Vec<PathBuf> = (1..=NODES)
        .map(|n| dir.join(format!("node-{n}.log")))
        .collect();
    let mut all_logs = current.clone();
    for (n, log) in current.iter().enumerate() {
        wait_audits(log, 3, &format!("node {} on the old version", n + 1));
    }
    let mut speaks = vec![OLDEST_WIRE_VERSION; NODES];
    wait_link_versions(base_port, &speaks, "before the upgrade");

    let mut restarted = Vec::new();
    for victim in 0..NODES {
        kill_dead(pids[victim]);
        // Restarted from its data directory without the switch: this build's version.
        let (child, log) = restart_with(
            &dir,
            victim,
            victim + 1,
            &[("ATOMOS_ORDER_SNAPSHOT_EVERY", "200")],
        );
        pids[victim] = child.id();
        cleanup.0.push(child.id());
        restarted.push(child);
        current[victim] = log.clone();
        all_logs.push(log.clone());
        speaks[victim] = WIRE_VERSION;
        let what = format!("node {} upgraded", victim + 1);
        wait_audits(&log, 3, &what);
        wait_link_versions(base_port, &speaks, &what);
        // The members not upgraded yet keep committing beside it.
        for log in &current {
            let seen = common::bank::audits(log).len();
            wait_audits(log, seen + 2, &what);
        }
    }
    nothing_acknowledged_lost(&all_logs, &current, TOTAL, NODES + NODES);

    for mut child in restarted {
        signal(child.id(), libc::SIGTERM);
        assert!(wait_exit(&mut child, Duration::from_secs(30)).success());
    }
    signal(up.id(), libc::SIGINT);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(&dir);
}
