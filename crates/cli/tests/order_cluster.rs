//! The order layer in real processes: `atomos cluster up --nodes 3 --order` under generated
//! load; kill -9 of the leader, then of a follower, each restarted from its log. Afterwards
//! every replica's log is read back offline: no acknowledged request may be missing, none may
//! be applied twice, and all replicas must agree on the order.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use atomos::disk::read_log;
use atomos::order::{decode_log, Register, Replica, ReplicaConfig};

mod common;

use common::{cluster_up, leader, restart, signal, wait_exit};

/// Acknowledged request ids recorded by every node (all incarnations).
fn acked(dir: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for n in 1..=3 {
        let bytes = std::fs::read(dir.join(format!("data/{n}/acked.log"))).unwrap_or_default();
        // A kill -9 can cut the last record short: whole records only.
        ids.extend(
            bytes
                .chunks_exact(8)
                .map(|c| u64::from_be_bytes(c.try_into().unwrap())),
        );
    }
    ids
}

fn wait_for_more_acks(dir: &Path, more: usize) {
    let start = acked(dir).len();
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked(dir).len() < start + more {
        assert!(
            Instant::now() < deadline,
            "requests stopped being acknowledged"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kill_9_of_leader_and_follower_loses_and_duplicates_nothing_acknowledged() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("order-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(3);
    let (mut up, pids) = cluster_up(3, base_port, &dir, &["--order", "--order-load", "8"]);
    let mut logs: Vec<(usize, PathBuf)> = (0..3)
        .map(|n| (n, dir.join(format!("node-{}.log", n + 1))))
        .collect();
    wait_for_more_acks(&dir, 2_000);

    // kill -9 the leader; another takes over; the old one comes back from its log.
    let (old_leader, term) = leader(&logs).expect("a leader was elected");
    signal(pids[old_leader], libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader(&logs).is_none_or(|(_, t)| t <= term) {
        assert!(Instant::now() < deadline, "no new leader after the kill");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for_more_acks(&dir, 1_000);
    let (mut first, log) = restart(&dir, old_leader, 1);
    logs.push((old_leader, log));
    wait_for_more_acks(&dir, 2_000);

    // kill -9 a follower; it comes back too.
    let (now_leader, _) = leader(&logs).expect("a leader");
    let follower = (0..3)
        .find(|&n| n != now_leader && n != old_leader)
        .unwrap();
    signal(pids[follower], libc::SIGKILL);
    wait_for_more_acks(&dir, 1_000);
    let (mut second, log) = restart(&dir, follower, 2);
    logs.push((follower, log));
    wait_for_more_acks(&dir, 2_000);

    // Stop everything, then read every replica's log back.
    signal(up.id(), libc::SIGINT);
    wait_exit(&mut up, Duration::from_secs(15));
    for c in [&mut first, &mut second] {
        signal(c.id(), libc::SIGTERM);
        wait_exit(c, Duration::from_secs(15));
    }
    let mut lists = Vec::new();
    for n in 1..=3u64 {
        let log = read_log(&dir.join(format!("data/{n}/order.wal")), false).unwrap();
        let log = decode_log(&log).unwrap();
        let (register, _) =
            Replica::recover(ReplicaConfig::new(n, vec![1, 2, 3]), log, Register::new()).unwrap();
        let values: Vec<u64> = register
            .get("load")
            .unwrap_or_default()
            .chunks_exact(8)
            .map(|c| u64::from_be_bytes(c.try_into().unwrap()))
            .collect();
        lists.push(values);
    }
    lists.sort_by_key(|l| l.len());
    for w in lists.windows(2) {
        assert!(w[1].starts_with(&w[0]), "replicas disagree on the order");
    }
    let longest = &lists[2];
    let mut distinct = longest.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), longest.len(), "a request was applied twice");
    let acked = acked(&dir);
    assert!(acked.len() > 8_000, "only {} acknowledged", acked.len());
    println!(
        "{} acknowledged, {} ordered; killed leader node {} (term {term}) and follower node {}",
        acked.len(),
        longest.len(),
        old_leader + 1,
        follower + 1
    );
    for id in &acked {
        assert!(
            distinct.binary_search(id).is_ok(),
            "acknowledged request {id:#x} is missing"
        );
    }
}
