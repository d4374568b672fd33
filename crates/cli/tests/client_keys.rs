//! Client keys on real processes: `atomos cluster up` admits the client key it generated; the
//! client reads the cluster through a member. Its key is then removed from every member's
//! configuration and the members get SIGHUP: its connections close at once and it cannot
//! connect again. Listed again and reloaded, it connects again. The members never restart.

use std::path::Path;
use std::time::{Duration, Instant};

use atomos::{Client, ClientError};

mod common;

use common::{cluster_up, signal, wait_exit, KillOnDrop};

const CLIENT_COUNT: &str = "bank-load.client-count";

/// The client configuration `cluster up` wrote, with short limits.
fn client_config(dir: &Path) -> atomos::ClientConfig {
    let mut cfg = atomos::config::load_client(&dir.join("client.toml")).unwrap();
    cfg.resend_after = Duration::from_millis(300);
    cfg.limit = Duration::from_secs(2);
    cfg
}

/// Rewrites every member's configuration through `edit`, then sends each SIGHUP.
fn reload(dir: &Path, pids: &[u32], edit: impl Fn(String) -> String) {
    for (i, pid) in pids.iter().enumerate() {
        let path = dir.join(format!("node-{}.toml", i + 1));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, edit(text)).unwrap();
        signal(*pid, libc::SIGHUP);
    }
}

/// Waits until every member's log says `needle` `times` times.
fn wait_logged(dir: &Path, nodes: usize, needle: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for n in 1..=nodes {
        let log = dir.join(format!("node-{n}.log"));
        while std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches(needle)
            .count()
            < times
        {
            assert!(
                Instant::now() < deadline,
                "node {n} never logged {needle:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn a_revoked_client_is_refused_within_one_reload_and_readmitted_by_the_next() {
    let nodes = 3;
    let dir = std::env::temp_dir().join(format!("atomos-client-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(nodes);
    let (mut up, pids) = cluster_up(nodes, base_port, &dir, &[]);
    let _cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // Admitted: the client connects and reads through a member.
    let client = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match Client::connect(client_config(&dir)).await {
                Ok(client) => break client,
                Err(e) => assert!(Instant::now() < deadline, "never connected: {e}"),
            }
        }
    });
    let count: u64 = runtime
        .block_on(client.invoke(CLIENT_COUNT, &7u64))
        .unwrap();
    assert_eq!(count, 0);

    // Every member watches SIGHUP once it logged its start (before that, the signal's default
    // action would end it).
    wait_logged(&dir, nodes, "node started", 1);
    // Revoked: the members' configurations lose the [[clients]] entry and are reloaded.
    let original: Vec<String> = (1..=nodes)
        .map(|n| std::fs::read_to_string(dir.join(format!("node-{n}.toml"))).unwrap())
        .collect();
    reload(&dir, &pids, |text| {
        let cut = text
            .find("\n[[clients]]")
            .expect("cluster up lists its client");
        text[..cut].to_string() + "\n"
    });
    wait_logged(&dir, nodes, "SIGHUP: keys reloaded", 1);
    // The connected client lost its links: its reads fail.
    let refused = runtime.block_on(client.invoke::<_, u64>(CLIENT_COUNT, &7u64));
    assert!(
        refused.is_err(),
        "a revoked client still reads: {refused:?}"
    );
    // And it cannot connect again.
    let again = runtime.block_on(Client::connect(client_config(&dir)));
    assert!(
        matches!(again, Err(ClientError::Unreachable(_))),
        "a revoked client connected: {:?}",
        again.as_ref().map(|_| ())
    );
    let log = std::fs::read_to_string(dir.join("node-1.log")).unwrap();
    assert!(
        log.contains("not a client key of this cluster"),
        "node 1 did not say why it refused the client"
    );

    // Listed again and reloaded: it connects.
    for (n, text) in original.iter().enumerate() {
        std::fs::write(dir.join(format!("node-{}.toml", n + 1)), text).unwrap();
    }
    for pid in &pids {
        signal(*pid, libc::SIGHUP);
    }
    wait_logged(&dir, nodes, "SIGHUP: keys reloaded", 2);
    let readmitted = runtime
        .block_on(Client::connect(client_config(&dir)))
        .expect("the client was not admitted again");

    // A reload that does not load changes nothing and says so: the client still reads.
    std::fs::write(dir.join("node-1.toml"), "this is not toml").unwrap();
    signal(pids[0], libc::SIGHUP);
    wait_logged(
        &dir,
        1,
        "the configuration does not load, nothing changed",
        1,
    );
    std::fs::write(dir.join("node-1.toml"), &original[0]).unwrap();
    let mut cfg = client_config(&dir);
    cfg.members.retain(|(id, _)| *id == 1);
    let through_one = runtime
        .block_on(Client::connect(cfg))
        .expect("node 1 refused the client after a broken reload");
    let count: u64 = runtime
        .block_on(through_one.invoke(CLIENT_COUNT, &7u64))
        .unwrap();
    assert_eq!(count, 0);
    drop(readmitted);

    signal(up.id(), libc::SIGTERM);
    assert!(wait_exit(&mut up, Duration::from_secs(15)).success());
}
