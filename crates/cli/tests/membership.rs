//! Membership changes on real processes under bank load: a `certify` cluster of three grows to
//! four (a new node with its own key and an empty disk starts with `order_join = true`, an
//! operator adds it with `atomos member add` and promotes it), then a founder is killed with
//! SIGKILL and removed (`atomos member remove`). The three left keep auditing the full total,
//! the new member among them, and every transfer a run saw acknowledged is counted; the
//! metrics show one leader, the changes and the fsyncs. A client that is no operator is
//! refused, and malformed requests are refused before anything is sent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

mod common;

use common::bank::{audits, wait_audits};
use common::members::{add_learner, atomos, member_until_done, start_joiner, wait_members};
use common::{cluster_up_with, public_key_of, signal, wait_exit, wait_for_line, KillOnDrop};

const TOTAL: i64 = 64_000;

#[test]
fn a_cluster_grows_by_a_new_node_and_loses_a_killed_founder_without_losing_a_transfer() {
    let dir = std::env::temp_dir().join(format!("atomos-membership-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let base_port = common::free_base_port(4);
    let (mut up, pids) = cluster_up_with(
        3,
        base_port,
        &dir,
        &["--protocol", "certify", "--bank-load", "2"],
        &[
            ("ATOMOS_ORDER_SNAPSHOT_EVERY", "200"),
            ("ATOMOS_OPERATORS", "client"),
        ],
    );
    let mut cleanup = KillOnDrop(pids.iter().copied().chain([up.id()]).collect());
    let log = |n: usize| dir.join(format!("node-{n}.log"));
    for n in 1..=3 {
        wait_audits(&log(n), 2, &format!("node {n}"));
    }
    let client = dir.join("client.toml");
    wait_members(&client, &[(1, "voter"), (2, "voter"), (3, "voter")]);

    // Bad requests are refused before anything is sent.
    let bad = atomos(&[
        "member",
        "add",
        "--client",
        client.to_str().unwrap(),
        "--id",
        "4",
        "--address",
        "nowhere",
        "--public-key",
        "x",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--address"));

    // A client the members admit (added to their files, keys reloaded on SIGHUP) but do not
    // list as an operator is refused.
    let other_key = dir.join("other.key");
    let made = atomos(&[
        "keygen",
        "--client",
        "other",
        "--out",
        other_key.to_str().unwrap(),
    ]);
    assert!(made.status.success(), "{made:?}");
    let entry = format!(
        "\n[[clients]]\nname = \"other\"\npublic_key = \"{}\"\n",
        public_key_of(&other_key)
    );
    let mut reloaded = [0; 4];
    for n in 1..=3 {
        let path = dir.join(format!("node-{n}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}{entry}")).unwrap();
        signal(pids[n - 1], libc::SIGHUP);
        reloaded[n] = wait_for_line(&log(n), 0, &["SIGHUP: keys reloaded", "other"]);
    }
    let other = dir.join("other.toml");
    let text = std::fs::read_to_string(&client).unwrap();
    std::fs::write(&other, text.replace("client.key", "other.key")).unwrap();
    let refused = atomos(&[
        "member",
        "remove",
        "--id",
        "3",
        "--client",
        other.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not an operator"),
        "{refused:?}"
    );

    // Node 4: a key of its own, an empty data directory, the founders as peers. The operator
    // adds it and, once it caught up, promotes it.
    let env = [
        ("ATOMOS_OPERATORS", "client"),
        ("ATOMOS_ORDER_SNAPSHOT_EVERY", "200"),
    ];
    let (mut four, address, public) = start_joiner(&dir, base_port, 4, &env);
    cleanup.0.push(four.id());
    add_learner(&client, 4, &address, &public);
    wait_members(
        &client,
        &[(1, "voter"), (2, "voter"), (3, "voter"), (4, "learner")],
    );
    member_until_done(&client, &["promote", "--id", "4"]);
    wait_members(
        &client,
        &[(1, "voter"), (2, "voter"), (3, "voter"), (4, "voter")],
    );
    wait_audits(&log(4), 2, "node 4");

    // Founder 1 dies for good and is removed.
    signal(pids[0], libc::SIGKILL);
    member_until_done(&client, &["remove", "--id", "1"]);
    wait_members(&client, &[(2, "voter"), (3, "voter"), (4, "voter")]);
    for n in 2..=4 {
        let seen = audits(&log(n)).len();
        let deadline = Instant::now() + Duration::from_secs(30);
        while audits(&log(n)).len() < seen + 3 {
            assert!(Instant::now() < deadline, "node {n} stopped auditing");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // Every audit saw the total; every transfer a run saw acknowledged is counted, the
    // killed founder's included.
    let mut acked: BTreeMap<u64, u64> = BTreeMap::new();
    for n in 1..=4 {
        for a in audits(&log(n)) {
            assert_eq!(a.total, TOTAL, "node {n} audited a wrong total");
            let e = acked.entry(a.run).or_default();
            *e = (*e).max(a.transfers);
        }
    }
    let last = audits(&log(4)).pop().expect("node 4 audits");
    let first_run = audits(&log(1)).pop().expect("node 1 audited").run;
    let counted = last.counted.get(&first_run).copied().unwrap_or(0);
    assert!(
        counted >= acked[&first_run],
        "node 1's run saw {} transfers acknowledged, node 4 counts {counted}",
        acked[&first_run]
    );
    assert!(acked.values().sum::<u64>() > 50, "transfers ran: {acked:?}");
    for n in 1..=4 {
        let text = std::fs::read_to_string(log(n)).unwrap_or_default();
        assert!(!text.contains("replicas diverged"), "node {n} diverged");
    }

    // The metrics an operator watches: one leader among the members left, node 4 a voter
    // of three that applied the changes and commits transfers, the logs' fsyncs timed.
    std::thread::sleep(Duration::from_millis(1_100));
    let metrics = |port: u16| common::http_get(port + 100, "/metrics");
    let (m2, m3, m4) = (
        metrics(base_port + 1),
        metrics(base_port + 2),
        metrics(base_port + 3),
    );
    let sum = |name: &str| -> f64 {
        [&m2, &m3, &m4]
            .iter()
            .map(|m| common::metric_sum(m, name))
            .sum()
    };
    assert_eq!(sum("atomos_order_is_leader"), 1.0, "one leader");
    assert_eq!(common::metric_sum(&m4, "atomos_order_voters"), 3.0);
    assert!(common::metric_sum(&m4, "atomos_order_term") > 0.0);
    assert!(common::metric_sum(&m4, "atomos_order_replica_membership_changes_total") >= 2.0);
    assert!(common::metric_sum(&m4, "atomos_tx_commits_total") > 0.0);
    assert!(common::metric_sum(&m2, "atomos_wal_fsync_seconds_count") > 0.0);
    assert!(m2.contains("atomos_client_connections") && m2.contains("atomos_tx_aborts_total"));
    // Every metric the Grafana dashboard queries is published, with a `node` label where a
    // query selects by it (but those recorded only when something goes wrong).
    const ON_EVENTS: [&str; 3] = [
        "atomos_component_failed_total",
        "atomos_replica_alarms_total",
        "atomos_order_sends_refused_total",
    ];
    for (name, by_node) in common::dashboard::metrics() {
        let series: Vec<&str> = [&m2, &m3, &m4]
            .iter()
            .flat_map(|m| m.lines())
            .filter(|l| l.starts_with(name.as_str()) && !l.starts_with('#'))
            .collect();
        if ON_EVENTS.contains(&name.as_str()) {
            continue;
        }
        assert!(
            !series.is_empty(),
            "the dashboard queries {name}, which no node publishes"
        );
        if by_node {
            assert!(
                series.iter().all(|l| l.contains("node=\"")),
                "the dashboard selects {name} by node, which it lacks: {series:?}"
            );
        }
    }

    // Keys still reload on SIGHUP though the members are no longer the files' (the other
    // client is revoked again).
    let path = dir.join("node-2.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&entry, "")).unwrap();
    signal(pids[1], libc::SIGHUP);
    wait_for_line(
        &log(2),
        reloaded[2] + 1,
        &["SIGHUP: keys reloaded", "removed=[\"other\"]"],
    );

    signal(four.id(), libc::SIGTERM);
    assert!(wait_exit(&mut four, Duration::from_secs(30)).success());
    signal(up.id(), libc::SIGINT);
    let _ = wait_exit(&mut up, Duration::from_secs(30));
    let _ = std::fs::remove_dir_all(&dir);
}
