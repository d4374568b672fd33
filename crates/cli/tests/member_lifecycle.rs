//! A cluster's whole life of membership changes on real processes, under bank load, for
//! `certify` and `active`: three founders grow to five (two new nodes, each with its own key
//! and an empty disk, join as learners and are promoted; the first is killed with SIGKILL
//! before its first snapshot of the 16 MiB store is installed, and starts again from its
//! disk), a founder is killed with SIGKILL and replaced by a sixth node with a new id and an
//! empty disk, and the cluster shrinks back to three by removing its leader and then one more
//! voter. Afterwards every transfer a stopped
//! node saw acknowledged is counted in the state, every audit on every node saw the bank's
//! total (read-only audits never fail), and the three left keep committing.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;

use common::bank::{audits, wait_audits};
use common::members::{
    add_learner, change_until, restart_member, start_joiner, wait_leader, wait_members,
};
use common::{cluster_up_with, kill_dead, signal, wait_exit, KillOnDrop};

const TOTAL: i64 = 64_000;

/// The two clusters take turns: each runs up to six node processes on a two-core machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Waits until the node logging to `log` logged `more` more audits of a running load.
fn more_audits(log: &Path, more: usize, what: &str) {
    let seen = audits(log).len();
    let deadline = Instant::now() + Duration::from_secs(60);
    while audits(log).len() < seen + more {
        assert!(Instant::now() < deadline, "{what} stopped auditing");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn grow_replace_and_shrink(protocol: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!(
        "atomos-lifecycle-{protocol}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(6);
    // A store of some size (16 MiB of ballast), so that a snapshot takes a while to arrive.
    let env = [
        ("ATOMOS_OPERATORS", "client"),
        ("ATOMOS_ORDER_SNAPSHOT_EVERY", "200"),
        ("ATOMOS_BANK_LOAD_BALLAST_MIB", "16"),
    ];
    let (mut up, pids) = cluster_up_with(
        3,
        base_port,
        &dir,
        &["--protocol", protocol, "--bank-load", "2"],
        &env,
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let log = |n: u64| dir.join(format!("node-{n}.log"));
    let client = dir.join("client.toml");
    for n in 1..=3 {
        wait_audits(&log(n), 2, &format!("{protocol} node {n}"));
    }
    let mut pid: BTreeMap<u64, u32> = (1..=3).zip(pids.iter().copied()).collect();
    let mut joiners = Vec::new();
    let join = |id: u64| {
        let (child, address, public) = start_joiner(&dir, base_port, id, &env);
        add_learner(&client, id, &address, &public);
        child
    };
    let mut keep = |child: std::process::Child, id: u64| {
        cleanup.0.push(child.id());
        pid.insert(id, child.id());
        joiners.push(child);
    };

    // Grow from three to five: two learners, each promoted once caught up. Node 4 dies
    // (SIGKILL) right after it is added, before its first snapshot is installed (its metrics
    // say how many it had installed when killed), and starts again from what its disk kept.
    let four = join(4);
    std::thread::sleep(Duration::from_millis(300));
    let metrics = common::http_get(base_port + 103, "/metrics");
    let installed = common::metric_sum(&metrics, "atomos_order_replica_snapshots_installed_total");
    kill_dead(four.id());
    keep(four, 4);
    println!("{protocol}: node 4 killed with {installed} snapshots installed");
    keep(restart_member(&dir, 4, &env), 4);
    keep(join(5), 5);
    wait_members(
        &client,
        &[
            (1, "voter"),
            (2, "voter"),
            (3, "voter"),
            (4, "learner"),
            (5, "learner"),
        ],
    );
    for id in [4, 5] {
        let votes = |m: &BTreeMap<u64, String>| m.get(&id).is_some_and(|r| r == "voter");
        change_until(&client, &["promote", "--id", &id.to_string()], votes);
    }
    let five: Vec<(u64, &str)> = (1..=5).map(|id| (id, "voter")).collect();
    wait_members(&client, &five);
    for n in [4, 5] {
        wait_audits(&log(n), 2, &format!("{protocol} node {n}"));
    }

    // Founder 1 dies (SIGKILL) and node 6, a new id on an empty disk, takes its place.
    signal(pids[0], libc::SIGKILL);
    keep(join(6), 6);
    let replaced = |m: &BTreeMap<u64, String>| !m.contains_key(&1) && m.contains_key(&6);
    change_until(
        &client,
        &["replace", "--remove", "1", "--add", "6"],
        replaced,
    );
    let replaced: Vec<(u64, &str)> = (2..=6).map(|id| (id, "voter")).collect();
    wait_members(&client, &replaced);
    wait_audits(&log(6), 2, &format!("{protocol} node 6"));

    // Shrink to three: the leader goes first, then one more voter. Each removed node is
    // stopped, as an operator would.
    let mut stopped = vec![1];
    for _ in 0..2 {
        let leader = wait_leader(&client);
        println!("{protocol}: removing the leader, {leader}");
        let gone = |m: &BTreeMap<u64, String>| !m.is_empty() && !m.contains_key(&leader);
        change_until(&client, &["remove", "--id", &leader.to_string()], gone);
        stopped.push(leader);
        let left: Vec<(u64, &str)> = (2..=6)
            .filter(|id| !stopped.contains(id))
            .map(|id| (id, "voter"))
            .collect();
        wait_members(&client, &left);
        signal(pid[&leader], libc::SIGTERM);
    }
    let left: Vec<u64> = (2..=6).filter(|id| !stopped.contains(id)).collect();
    assert_eq!(left.len(), 3, "removed {stopped:?}");
    for &n in &left {
        more_audits(&log(n), 3, &format!("{protocol} node {n}"));
    }

    // Every audit saw the total; every transfer a stopped node's runs saw acknowledged is
    // counted in what the members left hold.
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    let mut runs_of_stopped = Vec::new();
    for n in 1..=6 {
        for a in audits(&log(n)) {
            assert_eq!(a.total, TOTAL, "{protocol} node {n} audited a wrong total");
            let e = acked.entry(a.run).or_default();
            *e = (*e).max(a.transfers);
            if stopped.contains(&n) {
                runs_of_stopped.push(a.run);
            }
        }
    }
    assert!(acked.values().sum::<u64>() > 50, "transfers ran: {acked:?}");
    for &n in &left {
        let last = audits(&log(n)).pop().expect("audits");
        for run in &runs_of_stopped {
            let counted = last.counted.get(run).copied().unwrap_or(0);
            assert!(
                counted >= acked[run],
                "{protocol}: run {run} saw {} transfers acknowledged, node {n} counts {counted}",
                acked[run]
            );
        }
    }
    for n in 1..=6 {
        let text = std::fs::read_to_string(log(n)).unwrap_or_default();
        assert!(!text.contains("replicas diverged"), "node {n} diverged");
    }

    for child in &mut joiners {
        signal(child.id(), libc::SIGTERM);
        let _ = wait_exit(child, Duration::from_secs(30));
    }
    signal(up.id(), libc::SIGINT);
    let _ = wait_exit(&mut up, Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_certify_cluster_grows_replaces_a_killed_member_and_shrinks_without_losing_a_transfer() {
    grow_replace_and_shrink("certify");
}

#[test]
fn an_active_cluster_grows_replaces_a_killed_member_and_shrinks_without_losing_a_transfer() {
    grow_replace_and_shrink("active");
}
