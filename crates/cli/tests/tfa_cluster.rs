//! Real processes running TFA: `atomos cluster up --nodes 4 --protocol tfa --bank-load 2`.
//! Every node moves money between accounts that migrate between the processes, and audits the
//! total once a second: every audit on every node must find the total unchanged. Then one node
//! is killed with SIGKILL: TFA keeps one copy of each object, so the others' audits fail
//! naming the lost node instead of hanging or reporting a wrong total. A node killed and
//! restarted (the one that creates the accounts, which it tries again at start) forks none:
//! it reads its home records back, and what it held is reported lost, never re-created.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{cluster_up, signal, wait_exit, KillOnDrop};

const EXPECTED: &str = "expected=64000";

/// The audit lines of a node's log: (total, transfers so far).
fn audits(log: &Path) -> Vec<(i64, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(&format!("{name}="))
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    text.lines()
        .filter(|l| l.contains("bank audit") && !l.contains("failed"))
        .map(|l| {
            assert!(l.contains(EXPECTED), "unexpected audit line {l}");
            (
                field(l, "total").expect("a total") as i64,
                field(l, "transfers").expect("a transfer count"),
            )
        })
        .collect()
}

#[test]
fn money_is_conserved_across_processes_and_a_lost_node_is_named() {
    let dir = std::env::temp_dir().join(format!("atomos-tfa-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(4);
    let (mut up, pids) = cluster_up(
        4,
        base_port,
        &dir,
        &["--protocol", "tfa", "--bank-load", "2"],
    );
    let _cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let log = |n: usize| dir.join(format!("node-{n}.log"));
    // Each node audits at least five times after its transfers started.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = (1..=4).all(|n| {
            let a = audits(&log(n));
            a.iter().filter(|(_, transfers)| *transfers > 0).count() >= 5
        });
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the nodes did not audit a running bank in time; node 1 logged:\n{}",
            std::fs::read_to_string(log(1)).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut total_transfers = 0;
    for n in 1..=4 {
        let a = audits(&log(n));
        for (total, _) in &a {
            assert_eq!(*total, 64_000, "node {n} audited a wrong total");
        }
        total_transfers += a.last().map_or(0, |(_, t)| *t);
    }
    assert!(total_transfers > 100, "only {total_transfers} transfers");

    // SIGKILL node 4: the objects it owned are gone, and the others say so.
    signal(pids[3], libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let named = (1..=3).any(|n| {
            std::fs::read_to_string(log(n))
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("failed") && l.contains("node 4 did not answer"))
        });
        if named {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no node reported node 4's objects unavailable"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for n in 1..=3 {
        for (total, _) in audits(&log(n)) {
            assert_eq!(total, 64_000, "node {n} audited a wrong total");
        }
    }
    signal(up.id(), libc::SIGINT);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The last lines of a node's log, named, for a failure's message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(20);
    format!("== {}\n{}", log.display(), lines[from..].join("\n"))
}

/// Whether any of `logs` has a line with every one of `needles`.
fn logged(logs: &[std::path::PathBuf], needles: &[&str]) -> bool {
    logs.iter().any(|log| {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .any(|l| needles.iter().all(|n| l.contains(n)))
    })
}

#[test]
fn a_restarted_node_forks_nothing_and_names_what_it_lost() {
    let dir = std::env::temp_dir().join(format!("atomos-tfa-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(3);
    let (mut up, pids) = cluster_up(
        3,
        base_port,
        &dir,
        &["--protocol", "tfa", "--bank-load", "2"],
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let log = |n: usize| dir.join(format!("node-{n}.log"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(1..=3).all(|n| audits(&log(n)).iter().filter(|(_, t)| *t > 0).count() >= 3) {
        assert!(
            Instant::now() < deadline,
            "the nodes did not audit a running bank in time; their logs end:\n{}",
            (1..=3)
                .map(|n| tail(&log(n)))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Kill node 1, which creates the accounts (when they do not exist) each time it starts,
    // and start it again on the same data directory.
    signal(pids[0], libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(500));
    let restarted_log = dir.join("node-1-restarted.log");
    let mut restarted = Command::new(env!("CARGO_BIN_EXE_atomos"))
        .args(["node", "--config"])
        .arg(dir.join("node-1.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&restarted_log).unwrap())
        .spawn()
        .unwrap();
    cleanup.0.push(restarted.id());
    // What node 1 owned is lost, and transactions that need it say so.
    let logs = [log(2), log(3), restarted_log.clone()];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !logged(&logs, &["lost with node 1"]) {
        assert!(
            Instant::now() < deadline,
            "nobody reported what node 1 lost; its new log:\n{}",
            std::fs::read_to_string(&restarted_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Give the restarted node's attempts to create the accounts, and everyone's audits, time.
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        !logged(
            std::slice::from_ref(&restarted_log),
            &["bank load: accounts created"]
        ),
        "the restarted node created accounts again"
    );
    for path in &logs {
        for (total, _) in audits(path) {
            assert_eq!(total, 64_000, "{} audited a wrong total", path.display());
        }
    }
    signal(restarted.id(), libc::SIGTERM);
    assert!(wait_exit(&mut restarted, Duration::from_secs(30)).success());
    signal(up.id(), libc::SIGINT);
    assert!(wait_exit(&mut up, Duration::from_secs(30)).success());
    let _ = std::fs::remove_dir_all(&dir);
}
