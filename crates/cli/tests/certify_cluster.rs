//! Real processes running `certify` (and `active`): `atomos cluster up --nodes N --protocol
//! certify --bank-load 2`. Every node moves money between accounts every replica holds, counts each
//! transfer in the replicated state, and audits the total once a second (a local read-only
//! snapshot). The Raft leader is killed with SIGKILL and restarted from its log (compacted
//! every 200 entries), then a follower, then a replica whose data directory was wiped (restarted
//! with `order_rejoin`: it catches up by state transfer, and votes again only once caught up). Afterwards: every
//! audit on every replica found the total; no audit failed; every transfer a node saw
//! acknowledged is counted in the replicated state.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

mod common;

use common::bank::{audits, wait_audits};
use common::{cluster_up_with, kill_dead, leader, restart_with, signal, wait_exit, KillOnDrop};

const TOTAL: i64 = 64_000;

fn run_cluster(protocol: &str, nodes: usize, name: &str, extra: &[&str]) {
    let dir = std::env::temp_dir().join(format!("atomos-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(nodes);
    let mut args = vec!["--protocol", protocol, "--bank-load", "2"];
    args.extend_from_slice(extra);
    // Under oss: a short history and frequent compactions, so that the restarted nodes
    // replay compacted logs and the wiped one catches up from images.
    let env: &[(&str, &str)] = if protocol == "oss" {
        &[
            ("ATOMOS_OSS_HISTORY_MAX", "50"),
            ("ATOMOS_OSS_COMPACT_AFTER", "200"),
        ]
    } else {
        &[("ATOMOS_ORDER_SNAPSHOT_EVERY", "200")]
    };
    let (mut up, pids) = cluster_up_with(nodes, base_port, &dir, &args, env);
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    // The log each node writes now.
    let mut current: Vec<PathBuf> = (1..=nodes)
        .map(|n| dir.join(format!("node-{n}.log")))
        .collect();
    let mut all_logs = current.clone();
    let mut pids = pids;
    let mut restarted: Vec<Child> = Vec::new();
    for (n, log) in current.iter().enumerate() {
        wait_audits(log, 3, &format!("node {}", n + 1));
    }

    let logs: Vec<(usize, PathBuf)> = all_logs.iter().cloned().enumerate().collect();
    let (first, _) = leader(&logs).expect("some node became leader");
    let mut round = 0;
    let mut kill_and_restart = |victim: usize, wipe: bool, current: &mut Vec<PathBuf>| {
        round += 1;
        kill_dead(pids[victim]);
        if wipe {
            std::fs::remove_dir_all(dir.join("data").join((victim + 1).to_string())).unwrap();
        }
        // A replica whose data directory was lost is told so, as an operator would.
        let env: &[(&str, &str)] = if wipe {
            &[("ATOMOS_ORDER_REJOIN", "true")]
        } else {
            &[]
        };
        let (child, log) = restart_with(&dir, victim, round, env);
        pids[victim] = child.id();
        cleanup.0.push(child.id());
        restarted.push(child);
        current[victim] = log.clone();
        all_logs.push(log.clone());
        wait_audits(
            &log,
            3,
            &format!("node {} after restart {round}", victim + 1),
        );
    };

    if protocol == "oss" {
        // The first epoch's sequencer (the coordinator: node 1), then the control log's
        // leader (or node 2 if node 1 leads), then another node, whose data directory is
        // wiped (restarted with `order_rejoin`).
        kill_and_restart(0, false, &mut current);
        let logs: Vec<(usize, PathBuf)> = current.iter().cloned().enumerate().collect();
        let (leader_now, _) = leader(&logs).expect("some node became leader");
        // Each process is killed once (the restarted ones are stopped cleanly at the end).
        let second = if leader_now == 0 { 1 } else { leader_now };
        kill_and_restart(second, false, &mut current);
        // The third loses its data directory and rejoins.
        let third = (1..nodes).find(|&n| n != second).unwrap_or(2);
        kill_and_restart(third, true, &mut current);
    } else {
        // The leader, then a follower, then a replica whose data directory was wiped.
        kill_and_restart(first, false, &mut current);
        let follower = (first + 1) % nodes;
        kill_and_restart(follower, false, &mut current);
        let wiped = (first + 2) % nodes;
        kill_and_restart(wiped, true, &mut current);
        // It came back by state transfer (the others' logs no longer reach back to the
        // start), and voted again only once it had caught up.
        let text = std::fs::read_to_string(&current[wiped]).unwrap_or_default();
        assert!(
            text.contains("restored snapshot"),
            "the wiped replica did not install a snapshot"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&current[wiped])
            .unwrap_or_default()
            .contains("caught up after losing its log")
        {
            assert!(
                Instant::now() < deadline,
                "the wiped replica never caught up"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    // Everyone audits a few more times with everything restarted.
    for log in &current {
        let seen = audits(log).len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while audits(log).len() < seen + 3 {
            assert!(
                Instant::now() < deadline,
                "{} stopped auditing",
                log.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    common::bank::nothing_acknowledged_lost(&all_logs, &current, TOTAL, nodes + 3);

    if protocol == "oss" {
        // Commits went through the protocol as configured (metrics are published each second).
        std::thread::sleep(Duration::from_millis(1_100));
        let metrics: Vec<String> = (0..nodes)
            .map(|n| common::http_get(base_port + n as u16 + 100, "/metrics"))
            .collect();
        let sum = |name: &str| -> f64 { metrics.iter().map(|m| common::metric_sum(m, name)).sum() };
        assert!(
            sum("atomos_oss_commits_total") > 0.0,
            "no oss commits counted"
        );
        assert!(
            sum("atomos_oss_compactions_total") > 0.0,
            "no oss log was compacted"
        );
        assert!(
            sum("atomos_oss_images_installed_total") > 0.0,
            "the wiped node did not catch up from an image"
        );
        let passes = sum("atomos_oss_token_passes_total");
        if extra.contains(&"distributed-token") {
            assert!(passes > 0.0, "the token never moved");
        } else {
            assert_eq!(passes, 0.0, "a token moved under the ultra-peer");
        }
    }
    for mut child in restarted {
        signal(child.id(), libc::SIGTERM);
        assert!(wait_exit(&mut child, Duration::from_secs(30)).success());
    }
    signal(up.id(), libc::SIGINT);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn three_replicas_lose_nothing_acknowledged_through_kills_and_a_wiped_disk() {
    run_cluster("certify", 3, "certify-3", &[]);
}

#[test]
fn five_replicas_lose_nothing_acknowledged_through_kills_and_a_wiped_disk() {
    run_cluster("certify", 5, "certify-5", &[]);
}

/// `oss`: four processes; the first epoch's sequencer (the ultra-peer coordinator) is killed
/// with SIGKILL and restarted, then the control log's leader, then another node: a new epoch
/// starts each time the sequencer is lost, and nothing acknowledged is lost.
#[test]
fn oss_nodes_lose_nothing_acknowledged_through_kills_of_the_coordinator() {
    run_cluster("oss", 4, "oss-4", &[]);
}

/// `oss` with distributed token passing: the token moves between the four processes with
/// every transfer, so each SIGKILL takes a node that holds it, waits for it or has just
/// passed it; a node that took it in the current epoch has that epoch replaced when it
/// restarts, and nothing acknowledged is lost.
#[test]
fn oss_token_nodes_lose_nothing_acknowledged_through_kills_of_token_holders() {
    run_cluster(
        "oss",
        4,
        "oss-token-4",
        &["--oss-commit", "distributed-token"],
    );
}

/// `active` runs the same replicated store (with its executor, its digests every 5 s and its
/// own log, `active.wal`); the bank load's transfers are closures, certified between
/// procedures.
#[test]
fn active_replicas_lose_nothing_acknowledged_through_kills_and_a_wiped_disk() {
    run_cluster("active", 3, "active-3", &[]);
}
