//! Backup and restore with real processes: `atomos cluster up --protocol certify --bank-load 2`
//! moves money on three nodes; `atomos backup` takes a backup while it runs; `--verify` accepts
//! it and refuses a damaged copy; the cluster is killed; `atomos restore` seeds three new data
//! directories, which refuse a second seeding; the members start from them, and their audits
//! find the money whole and every transfer acknowledged before the backup counted.

use std::collections::BTreeMap;

mod common;

use common::bank::{audits, wait_audits};
use common::members::atomos;
use common::{cluster_up_with, kill_dead, restart_with, KillOnDrop};

const TOTAL: i64 = 64_000;
const NODES: usize = 3;

/// What each run acknowledged at the last audit its node logged (the runs of every log).
fn acknowledged(logs: &[std::path::PathBuf]) -> BTreeMap<u64, u64> {
    let mut acked = BTreeMap::new();
    for log in logs {
        if let Some(last) = audits(log).last() {
            acked.insert(last.run, last.transfers);
        }
    }
    acked
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_backup_of_a_loaded_cluster_restores_with_every_acknowledged_transfer() {
    let dir = std::env::temp_dir().join(format!("atomos-backup-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(NODES);
    let (mut up, pids) = cluster_up_with(
        NODES,
        base_port,
        &dir,
        &["--protocol", "certify", "--bank-load", "2"],
        &[("ATOMOS_ORDER_SNAPSHOT_EVERY", "200")],
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let logs: Vec<_> = (1..=NODES)
        .map(|n| dir.join(format!("node-{n}.log")))
        .collect();
    for (n, log) in logs.iter().enumerate() {
        wait_audits(log, 3, &format!("node {}", n + 1));
    }

    // The backup, while the load runs.
    let before = acknowledged(&logs);
    let file = dir.join("cluster.backup");
    let client = dir.join("client.toml");
    let out = atomos(&[
        "backup",
        "--client",
        client.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "backup: {}", text(&out));
    // A second one never replaces the file.
    let again = atomos(&[
        "backup",
        "--client",
        client.to_str().unwrap(),
        "--out",
        file.to_str().unwrap(),
    ]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again));
    assert!(text(&again).contains("exists"), "{}", text(&again));

    let verified = atomos(&["backup", "--verify", file.to_str().unwrap()]);
    assert!(verified.status.success(), "verify: {}", text(&verified));
    assert!(text(&verified).contains("protocol certify"));
    let damaged = dir.join("damaged.backup");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&damaged, bytes).unwrap();
    let refused = atomos(&["backup", "--verify", damaged.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(text(&refused).contains("checksum"), "{}", text(&refused));

    // The old cluster goes away for good.
    for &pid in &pids {
        kill_dead(pid);
    }
    let _ = up.kill();
    let _ = up.wait();

    // Each member's new data directory is seeded from the file, once.
    let seeded = |n: usize| dir.join("restored").join(n.to_string());
    for n in 1..=NODES {
        let out = atomos(&[
            "restore",
            file.to_str().unwrap(),
            "--dir",
            seeded(n).to_str().unwrap(),
            "--members",
            "1,2,3",
        ]);
        assert!(out.status.success(), "restore {n}: {}", text(&out));
    }
    let twice = atomos(&[
        "restore",
        file.to_str().unwrap(),
        "--dir",
        seeded(1).to_str().unwrap(),
        "--members",
        "1,2,3",
    ]);
    assert_eq!(twice.status.code(), Some(2), "{}", text(&twice));

    // The members start from their seeded directories.
    let mut children = Vec::new();
    let mut new_logs = Vec::new();
    for n in 0..NODES {
        let data = seeded(n + 1);
        let env = [("ATOMOS_DATA_DIR", data.to_str().unwrap())];
        let (child, log) = restart_with(&dir, n, 1, &env);
        cleanup.0.push(child.id());
        children.push(child);
        new_logs.push(log);
    }
    for (n, log) in new_logs.iter().enumerate() {
        wait_audits(log, 2, &format!("restored node {}", n + 1));
    }
    for log in &new_logs {
        let audit = audits(log).into_iter().next_back().expect("an audit");
        assert_eq!(audit.total, TOTAL, "{}: the money adds up", log.display());
        for (run, acked) in &before {
            let counted = audit.counted.get(run).copied().unwrap_or(0);
            assert!(
                counted >= *acked,
                "{}: run {run} had {acked} transfers acknowledged before the backup, {counted} \
                 in the restored cluster",
                log.display()
            );
        }
    }
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_backup_and_restore_flags_are_refused_by_name() {
    let notes = std::env::temp_dir().join(format!("atomos-notes-{}.txt", std::process::id()));
    std::fs::write(&notes, b"shopping list").unwrap();
    let notes = notes.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["backup", "--verify", "/nonexistent/backup"],
            "/nonexistent/backup",
        ),
        (
            &["backup", "--wait", "5", "--verify", notes],
            "not an atomos backup",
        ),
        (
            &["restore", notes, "--dir", "/tmp/x", "--members", "1,x"],
            "--members",
        ),
        (
            &[
                "restore",
                "/nonexistent",
                "--dir",
                "/tmp/x",
                "--members",
                "1",
            ],
            "/nonexistent",
        ),
    ];
    for (args, says) in cases {
        let out = atomos(args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out).contains(says), "{args:?}: {}", text(&out));
    }
}
