//! Remote clients of a real `active` cluster: `atomos cluster up --nodes 3 --protocol active
//! --bank-load 1` runs three node processes; this test's process connects with the client
//! configuration and key it wrote, and runs clients (`atomos::Client`) that invoke `bank-load.client-transfer` without pause,
//! each checking that every answer is its next count (an invocation lost or run twice would
//! skip or repeat one). The Raft leader is killed with SIGKILL and restarted, then the
//! clients' reference replica. Afterwards: every replica counts exactly what each client saw
//! acknowledged, every bank audit found the total, and no replica reported a divergence.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atomos::{Client, ClientConfig};

mod common;

use common::{
    cluster_up, http_get, kill_dead, leader, metric_sum, restart, signal, wait_exit, KillOnDrop,
};

const CLIENT_TRANSFER: &str = "bank-load.client-transfer";
const CLIENT_COUNT: &str = "bank-load.client-count";
const CLIENTS: u64 = 3;

/// The client configuration `cluster up` wrote, reaching every member first through
/// `reference`.
fn client_config(dir: &Path, reference: u64) -> ClientConfig {
    let mut cfg = atomos::config::load_client(&dir.join("client.toml")).unwrap();
    cfg.reference = Some(reference);
    cfg.resend_after = Duration::from_millis(400);
    cfg.limit = Duration::from_secs(60);
    cfg
}

/// Waits until `log` has `n` more bank audits than `seen`.
fn wait_audits(log: &Path, n: usize, what: &str) {
    let count = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .matches("bank audit")
            .count()
    };
    let target = count() + n;
    let deadline = Instant::now() + Duration::from_secs(60);
    while count() < target {
        assert!(Instant::now() < deadline, "{what} never audited");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn remote_clients_fail_over_through_kills_and_nothing_runs_twice_or_is_lost() {
    let nodes = 3;
    let dir = std::env::temp_dir().join(format!("atomos-active-clients-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(nodes);
    let (mut up, mut pids) = cluster_up(
        nodes,
        base_port,
        &dir,
        &["--protocol", "active", "--bank-load", "1"],
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let mut logs: Vec<PathBuf> = (1..=nodes)
        .map(|n| dir.join(format!("node-{n}.log")))
        .collect();
    for (n, log) in logs.iter().enumerate() {
        wait_audits(log, 2, &format!("node {}", n + 1));
    }
    let indexed: Vec<(usize, PathBuf)> = logs.iter().cloned().enumerate().collect();
    let (first_leader, _) = leader(&indexed).expect("some node became leader");
    // The clients' reference replica is a follower, so the two kills hit two processes.
    let reference = (first_leader + 1) % nodes;

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let cfg = client_config(&dir, reference as u64 + 1);
        let (stop, acked) = (stop.clone(), acked.clone());
        clients.push(runtime.spawn(async move {
            let client = Client::connect(cfg).await.expect("the client connects");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let from = (n % 64) as usize;
                let args = (from, (from + 1 + c as usize) % 64, 1i64, c);
                let count: u64 = client
                    .invoke(CLIENT_TRANSFER, &args)
                    .await
                    .unwrap_or_else(|e| panic!("client {c}: {e}"));
                n += 1;
                assert_eq!(count, n, "client {c}: an invocation was lost or ran twice");
                acked[c as usize].store(n, Ordering::Relaxed);
            }
            client.resends()
        }));
    }
    let progress = |what: &str| {
        let before: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Relaxed)).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked
            .iter()
            .zip(&before)
            .any(|(a, b)| a.load(Ordering::Relaxed) < b + 20)
        {
            assert!(Instant::now() < deadline, "clients stalled {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    progress("at the start");

    let mut restarted = Vec::new();
    for (round, victim) in [first_leader, reference].into_iter().enumerate() {
        kill_dead(pids[victim]);
        // The clients go on without it (a majority remains).
        progress(&format!("after node {} was killed", victim + 1));
        let (child, log) = restart(&dir, victim, round + 1);
        pids[victim] = child.id();
        cleanup.0.push(child.id());
        restarted.push(child);
        logs.push(log.clone());
        wait_audits(&log, 2, &format!("node {} after its restart", victim + 1));
        progress(&format!("after node {} came back", victim + 1));
    }
    stop.store(true, Ordering::Relaxed);
    let mut resends = 0;
    for c in clients {
        resends += runtime.block_on(c).expect("a client task panicked");
    }
    let counts: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    eprintln!("acknowledged per client: {counts:?}; re-sends: {resends}");
    assert!(
        resends > 0,
        "no client ever re-sent: the kills did not reach them"
    );

    // Every replica counts exactly what each client saw acknowledged.
    for member in 1..=nodes as u64 {
        let cfg = client_config(&dir, member);
        runtime.block_on(async {
            let reader = Client::connect(cfg).await.expect("a reader connects");
            for c in 0..CLIENTS {
                let want = acked[c as usize].load(Ordering::Relaxed);
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    // Read-only: it runs on the reference, which may still be catching up.
                    let got: u64 = reader.invoke(CLIENT_COUNT, &c).await.unwrap();
                    assert!(
                        got <= want,
                        "member {member} counts {got} for client {c}, acknowledged {want}"
                    );
                    if got == want {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "member {member} stays at {got} of {want} for client {c}"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
    }
    // Each replica's executor confirmed most speculations (its counters since its last start).
    for n in 0..nodes {
        let metrics = http_get(base_port + n as u16 + 100, "/metrics");
        let confirmed = metric_sum(&metrics, "atomos_replica_confirmed_total");
        let rerun = metric_sum(&metrics, "atomos_replica_rerun_total");
        let revoked = metric_sum(&metrics, "atomos_replica_speculations_revoked_total");
        eprintln!(
            "node {}: {confirmed} speculations confirmed, {rerun} invocations run again, \
             {revoked} speculations revoked",
            n + 1
        );
        assert!(confirmed > 0.0, "node {} confirmed no speculation", n + 1);
    }
    // Digests are ordered every 5 s: let one more round compare the replicas.
    std::thread::sleep(Duration::from_secs(6));
    for log in &logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            !text.contains("replicas diverged"),
            "{} reports a divergence",
            log.display()
        );
        assert!(
            !text.contains("bank audit failed"),
            "{} has a failed audit",
            log.display()
        );
        for line in text.lines().filter(|l| l.contains("bank audit")) {
            assert!(line.contains("total=64000"), "{}: {line}", log.display());
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
