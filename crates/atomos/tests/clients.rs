//! Remote clients over TCP: a program outside the cluster, holding its secret and a client key
//! the members list, invokes update
//! procedures (ordered, run once on every replica) and read-only ones (run on one member),
//! fails over when its reference replica stops, and gets each result exactly once.

// A procedure's body takes its arguments as `&A`: `&String` for a string argument.
#![allow(clippy::ptr_arg)]

mod tcp_members;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use atomos::config::{load, write_key_file, NodeSettings};
use atomos::{
    BlockingClient, Client, ClientConfig, ClientError, NodeRuntime, ProcedureKind, Procedures,
};
use atomos::{TRef, Tx, TxError};
use tcp_members::{client_key, free_addresses, member_key, SECRET};

const CLUSTER: &str = "clients-test";

fn counter(name: &str) -> TRef<u64> {
    TRef::new(format!("counter/{name}"))
}

/// Adds one to the counter `name` and returns its new value.
fn count(tx: &mut Tx<'_>, name: &String) -> Result<u64, TxError> {
    let c = counter(name);
    let next = if tx.exists(&c)? { *tx.read(&c)? + 1 } else { 1 };
    tx.write(&c, next).or_else(|_| tx.create(&c, next))?;
    Ok(next)
}

fn read(tx: &mut Tx<'_>, name: &String) -> Result<u64, TxError> {
    let c = counter(name);
    Ok(if tx.exists(&c)? { *tx.read(&c)? } else { 0 })
}

fn refuse(_: &mut Tx<'_>, why: &String) -> Result<(), TxError> {
    Err(TxError::abort(why.clone()))
}

/// Sleeps `ms` milliseconds in its transaction (a long request).
fn nap(_: &mut Tx<'_>, ms: &u64) -> Result<(), TxError> {
    std::thread::sleep(Duration::from_millis(*ms));
    Ok(())
}

fn procedures() -> Procedures {
    let p = Procedures::new();
    p.register("nap", ProcedureKind::Update, nap).unwrap();
    p.register("count", ProcedureKind::Update, count).unwrap();
    p.register("read", ProcedureKind::ReadOnly, read).unwrap();
    p.register("refuse", ProcedureKind::Update, refuse).unwrap();
    p
}

fn settings(id: u64, addrs: &[SocketAddr], protocol: &str, dir: &Path) -> NodeSettings {
    let peers: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}/{}", i + 1, member_key(i as u64 + 1).public()))
        .collect();
    std::fs::create_dir_all(dir).unwrap();
    let key_file = dir.join(format!("node-{id}.key"));
    write_key_file(&key_file, &member_key(id), "a test member", true).unwrap();
    let vars = [
        ("ATOMOS_CLUSTER", CLUSTER.to_string()),
        ("ATOMOS_NODE_ID", id.to_string()),
        ("ATOMOS_LISTEN", addrs[id as usize - 1].to_string()),
        ("ATOMOS_PEERS", peers.join(",")),
        ("ATOMOS_SECRET", SECRET.to_string()),
        ("ATOMOS_KEY_FILE", key_file.display().to_string()),
        ("ATOMOS_CLIENTS", format!("test={}", client_key().public())),
        ("ATOMOS_PROTOCOL", protocol.to_string()),
        (
            "ATOMOS_DATA_DIR",
            dir.join(format!("node-{id}")).display().to_string(),
        ),
        ("ATOMOS_ORDER_FSYNC", "never".to_string()),
    ];
    load(None, |k| {
        vars.iter()
            .find(|(key, _)| *key == k)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
}

fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("atomos-clients-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn cluster(
    n: usize,
    protocol: &str,
    name: &str,
) -> (Vec<Option<NodeRuntime>>, Vec<(u64, SocketAddr)>) {
    let addrs = free_addresses(n);
    let dir = data_dir(name);
    let mut nodes = Vec::new();
    for id in 1..=n as u64 {
        let s = settings(id, &addrs, protocol, &dir);
        nodes.push(Some(
            NodeRuntime::start_tcp_with(&s, procedures()).await.unwrap(),
        ));
    }
    let members = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, *a))
        .collect();
    (nodes, members)
}

fn client_config(members: &[(u64, SocketAddr)], reference: u64) -> ClientConfig {
    let members = members
        .iter()
        .map(|&(id, addr)| (id, addr, member_key(id).public()))
        .collect();
    let mut cfg = ClientConfig::new(CLUSTER, SECRET.as_bytes().to_vec(), client_key(), members);
    cfg.reference = Some(reference);
    cfg.resend_after = Duration::from_millis(300);
    cfg.limit = Duration::from_secs(20);
    cfg
}

/// Invokes `count` on the client's own counter `n` times; each answer must be the next number.
async fn count_to(client: &Client, name: &str, from: u64, to: u64) {
    for expected in from..=to {
        let got: u64 = client.invoke("count", &name.to_string()).await.unwrap();
        assert_eq!(got, expected, "{name}: an invocation lost or applied twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_fail_over_when_their_reference_stops_and_nothing_runs_twice() {
    let (mut nodes, members) = cluster(3, "active", "failover").await;
    let a = Client::connect(client_config(&members, 1)).await.unwrap();
    let b = Client::connect(client_config(&members, 2)).await.unwrap();
    assert_eq!(a.protocol(), "active");
    assert_eq!(a.reference(), 1);
    count_to(&a, "a", 1, 20).await;
    // Client a's reference replica stops while invocations are in flight: a re-sends its
    // outstanding one to the next member, which answers it once, whether or not it had run.
    let first = nodes[0].take().unwrap();
    let stop_first = async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        first.shutdown();
        drop(first);
    };
    tokio::join!(
        count_to(&a, "a", 21, 80),
        count_to(&b, "b", 1, 80),
        stop_first
    );
    assert!(a.resends() > 0, "client a never re-sent");
    assert_ne!(a.reference(), 1, "client a still names the stopped member");
    // Read-only procedures run on a live member and see every acknowledged invocation.
    for client in [&a, &b] {
        for name in ["a", "b"] {
            let n: u64 = client.invoke("read", &name.to_string()).await.unwrap();
            assert_eq!(n, 80, "{name} as a member sees it");
        }
    }
    // The surviving replicas hold the same counts.
    for node in nodes.iter().flatten() {
        node.node().sync().unwrap();
        let n = node
            .node()
            .atomically_read(|tx| Ok((read(tx, &"a".into())?, read(tx, &"b".into())?)))
            .unwrap();
        assert_eq!(n, (80, 80), "node {}", node.id());
    }
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

/// A program without an async runtime: the blocking client's calls wait on the calling
/// thread, from several threads at once; a call from inside a runtime and a call after
/// `close` get typed errors.
#[test]
fn a_blocking_client_serves_threads_without_a_runtime() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (nodes, members) = rt.block_on(cluster(3, "active", "blocking"));
    let client = BlockingClient::connect(client_config(&members, 1)).unwrap();
    std::thread::scope(|s| {
        for t in 0..3 {
            let client = &client;
            s.spawn(move || {
                let name = format!("blocking-{t}");
                for expected in 1..=10u64 {
                    let got: u64 = client.invoke("count", &name).unwrap();
                    assert_eq!(got, expected, "{name}");
                }
            });
        }
    });
    let n: u64 = client.invoke("read", &"blocking-2".to_string()).unwrap();
    assert_eq!(n, 10);
    // Inside a runtime the call is refused rather than blocking a worker.
    let inside = rt.block_on(async { client.invoke::<_, u64>("read", &"blocking-2".to_string()) });
    assert!(matches!(inside, Err(ClientError::Config(_))), "{inside:?}");
    client.close();
    assert!(matches!(
        client.invoke::<_, u64>("read", &"blocking-2".to_string()),
        Err(ClientError::Closed)
    ));
    drop(client);
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_get_typed_errors_and_wrong_secrets_get_nothing() {
    let (nodes, members) = cluster(3, "active", "errors").await;
    let client = Client::connect(client_config(&members, 2)).await.unwrap();
    let err = client.invoke::<_, u64>("no-such", &1u8).await.unwrap_err();
    assert_eq!(
        err,
        ClientError::NoSuchProcedure {
            name: "no-such".into()
        }
    );
    let err = client
        .invoke::<_, ()>("refuse", &"not today".to_string())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Failed { reason, .. } if reason.contains("not today")),
        "{err:?}"
    );
    // Arguments of the wrong type are refused by the procedure and change nothing.
    let err = client.invoke::<_, u64>("count", &7u64).await.unwrap_err();
    assert!(
        matches!(err, ClientError::Failed { .. } | ClientError::Types { .. }),
        "{err:?}"
    );
    let n: u64 = client.invoke("read", &"x".to_string()).await.unwrap();
    assert_eq!(n, 0);
    // A result of the wrong type is a typed error on the client.
    let err = client
        .invoke::<_, (u64, u64)>("read", &"x".to_string())
        .await;
    assert!(matches!(err, Err(ClientError::Types { .. })), "{err:?}");

    let mut wrong = client_config(&members, 1);
    wrong.secret = b"not the secret".to_vec();
    wrong.limit = Duration::from_secs(2);
    assert_eq!(
        Client::connect(wrong).await.err(),
        Some(ClientError::Unreachable(Duration::from_secs(2)))
    );
    let mut empty = client_config(&members, 1);
    empty.members.clear();
    assert!(matches!(
        Client::connect(empty).await,
        Err(ClientError::Config(_))
    ));
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_procedures_from_clients_need_active() {
    let (nodes, members) = cluster(3, "certify", "certify").await;
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    assert_eq!(client.protocol(), "certify");
    let err = client
        .invoke::<_, u64>("count", &"c".to_string())
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Refused { .. }), "{err:?}");
    // Read-only procedures run under any protocol.
    let n: u64 = client.invoke("read", &"c".to_string()).await.unwrap();
    assert_eq!(n, 0);
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

/// A client that sends what the `Client` never would: the members refuse it, answer what can
/// be answered with a refusal, and go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_client_requests_change_nothing() {
    use atomos::net::handshake::Identity;
    use atomos::net::roster::Roster;
    use atomos::net::rpc::{Inbound, Rpc};
    use atomos::net::tcp::{TcpConfig, TcpTransport};
    use atomos::net::transport::CLIENT_BIT;
    use atomos::order::{OrderMsg, Request};
    use atomos::protocols::replicated::{Answer, Entry};
    use atomos::NodeMsg;
    use std::sync::Arc;

    let (nodes, members) = cluster(3, "active", "malformed").await;
    let identity = Identity::client(CLUSTER, SECRET, client_key()).unwrap();
    let me = identity.node();
    let (rpc, mut inbox) = Rpc::<NodeMsg>::new();
    let roster = Arc::new(Roster::new(
        members
            .iter()
            .map(|&(id, _)| (id, vec![member_key(id).public()])),
        [],
    ));
    let transport = TcpTransport::connect(
        TcpConfig::new(identity, members.clone(), roster),
        rpc.deliverer(),
    );
    rpc.attach(Arc::new(transport.unwrap()));
    // Wait for the link to member 1.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rpc
        .request(1, NodeMsg::Describe, Duration::from_millis(300))
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "never linked");
    }
    let request = |seq, payload: Vec<u8>| {
        NodeMsg::Order(OrderMsg::Request(Request {
            client: me,
            seq,
            payload,
            deadline_ms: atomos::order::NO_DEADLINE,
        }))
    };
    let certify = Entry::Certify {
        reads: vec![],
        writes: vec![],
    };
    let unknown = Entry::Invoke {
        procedure: "no-such".into(),
        arguments: vec![],
    };
    let read_only = Entry::Invoke {
        procedure: "read".into(),
        arguments: vec![],
    };
    // Requests that no member orders are refused, which proves they never run. A procedure
    // this member lacks, or holds as read-only, may be another member's update procedure: a
    // refusal here could not say whether a copy sent elsewhere runs, so none comes (the
    // client re-sends to the next member with the same number).
    for seq in [3, 4] {
        let payload = if seq == 3 { &unknown } else { &read_only }.encode();
        rpc.send(1, request(seq, payload)).unwrap();
    }
    for (seq, payload) in [(1, vec![0xff, 0x00, 0x13]), (2, certify.encode())] {
        rpc.send(1, request(seq, payload)).unwrap();
        let reply = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Some(Inbound::Message {
                    msg:
                        NodeMsg::Order(OrderMsg::Reply {
                            seq: s, response, ..
                        }),
                    ..
                }) = inbox.recv().await
                {
                    assert!(
                        s != 3 && s != 4,
                        "request {s} was refused by a member that cannot know it never runs"
                    );
                    if s == seq {
                        return response;
                    }
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("request {seq} was not answered"));
        assert!(
            matches!(
                Answer::decode(&reply),
                Ok(Answer::Refused { position: 0, .. })
            ),
            "request {seq}: {:?}",
            Answer::decode(&reply)
        );
    }
    // Under another client's id, or not a request at all: dropped without an answer.
    let stolen = NodeMsg::Order(OrderMsg::Request(Request {
        client: CLIENT_BIT | 78,
        seq: 1,
        payload: Entry::Invoke {
            procedure: "count".into(),
            arguments: atomos::encode_arguments("count", &"stolen".to_string()).unwrap(),
        }
        .encode(),
        deadline_ms: atomos::order::NO_DEADLINE,
    }));
    rpc.send(1, stolen).unwrap();
    rpc.send(1, NodeMsg::Order(OrderMsg::Raft(vec![1, 2, 3])))
        .unwrap();
    rpc.send(1, NodeMsg::Order(OrderMsg::FetchState { after: 1 }))
        .unwrap();
    // A query with arguments of the wrong shape is a typed refusal.
    let answer = rpc
        .request(
            2,
            NodeMsg::Query {
                procedure: "read".into(),
                arguments: vec![0xff; 3],
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(
        matches!(answer, NodeMsg::QueryAnswer(Err(atomos::Refusal::Types(_)))),
        "{answer:?}"
    );
    // The cluster still serves a proper client, and nothing ran under the stolen id.
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    count_to(&client, "after", 1, 5).await;
    let stolen: u64 = client.invoke("read", &"stolen".to_string()).await.unwrap();
    assert_eq!(stolen, 0);
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_submit_procedures_with_a_priority_to_a_nodes_transaction_service() {
    use atomos::service::{Policy, ServiceConfig};
    let (nodes, members) = cluster(3, "certify", "submit").await;
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    // Without a service the node says so, and nothing runs.
    let refused = client.submit::<_, u64>("count", &"s".to_string(), 3).await;
    assert!(
        matches!(&refused, Err(ClientError::Refused { reason, .. }) if reason.contains("no transaction service")),
        "{refused:?}"
    );
    let service = nodes[0]
        .as_ref()
        .unwrap()
        .start_service(ServiceConfig {
            workers: 2,
            policy: Policy::Preemptive,
            ..ServiceConfig::default()
        })
        .unwrap();
    for (expected, priority) in (1..=20).zip([1u8, 3, 5].into_iter().cycle()) {
        let got: u64 = client
            .submit("count", &"s".to_string(), priority)
            .await
            .unwrap();
        assert_eq!(got, expected);
    }
    // A worker counts a request completed just after it answers it: wait for the count.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while service.stats().completed < 20 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(service.stats().completed, 20);
    // Read-only procedures run there too; a priority outside the levels, an unknown
    // procedure and a failing one come back as typed errors.
    let n: u64 = client.submit("read", &"s".to_string(), 2).await.unwrap();
    assert_eq!(n, 20);
    let bad = client.submit::<_, u64>("count", &"s".to_string(), 9).await;
    assert!(matches!(bad, Err(ClientError::Refused { .. })), "{bad:?}");
    let missing = client.submit::<_, u64>("nope", &"s".to_string(), 2).await;
    assert!(
        matches!(missing, Err(ClientError::NoSuchProcedure { .. })),
        "{missing:?}"
    );
    let failed = client.submit::<_, ()>("refuse", &"no".to_string(), 2).await;
    assert!(
        matches!(failed, Err(ClientError::Failed { .. })),
        "{failed:?}"
    );
    // Every replica applied the twenty submissions.
    for node in nodes.iter().flatten() {
        node.node().sync().unwrap();
        let n = node
            .node()
            .atomically_read(|tx| read(tx, &"s".into()))
            .unwrap();
        assert_eq!(n, 20, "node {}", node.id());
    }
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
    drop(service);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_active_submissions_are_refused_in_favour_of_ordered_invocations() {
    use atomos::service::ServiceConfig;
    let (nodes, members) = cluster(3, "active", "submit-active").await;
    nodes[0]
        .as_ref()
        .unwrap()
        .start_service(ServiceConfig::default())
        .unwrap();
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    let refused = client.submit::<_, u64>("count", &"s".to_string(), 3).await;
    assert!(
        matches!(&refused, Err(ClientError::Refused { reason, .. }) if reason.contains("ordered")),
        "{refused:?}"
    );
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}

/// The threads of this process.
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// 2,000 submissions to a node whose transaction service has one worker: the node works on
/// at most its limit at once and refuses the rest with `Busy` at once, so its threads stay
/// few (each submission waiting for its turn used to hold a blocking thread of its own, up to
/// the runtime's 512), and queries are still answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_submissions_gets_busy_answers_and_no_thread_each() {
    use atomos::service::ServiceConfig;
    use std::sync::Arc;
    let (nodes, members) = cluster(1, "local", "flood").await;
    let node = nodes[0].as_ref().unwrap();
    let _service = node
        .start_service(ServiceConfig {
            workers: 1,
            ..ServiceConfig::default()
        })
        .unwrap();
    node.set_client_limits(16, Duration::from_secs(5));
    let client = Arc::new(Client::connect(client_config(&members, 1)).await.unwrap());
    let before = threads();
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..2_000 {
        let client = client.clone();
        flood.spawn(async move { client.submit::<_, ()>("nap", &20u64, 2).await });
    }
    // While the flood is served: sample the threads and run queries.
    let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watch = {
        let (client, watching) = (client.clone(), watching.clone());
        tokio::spawn(async move {
            let (mut most, mut queries) = (0, 0);
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(threads());
                let n: u64 = client.invoke("read", &"flood".to_string()).await.unwrap();
                assert_eq!(n, 0);
                queries += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (most, queries)
        })
    };
    let (mut done, mut busy) = (0, 0);
    while let Some(joined) = flood.join_next().await {
        match joined.unwrap() {
            Ok(()) => done += 1,
            Err(ClientError::Busy { .. }) => busy += 1,
            Err(other) => panic!("a submission failed otherwise: {other}"),
        }
    }
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let (most, queries) = watch.await.unwrap();
    assert_eq!(done + busy, 2_000);
    assert!(done > 0 && busy > 0, "{done} done, {busy} busy");
    assert!(queries > 1, "queries were not answered during the flood");
    // At most 16 submissions and 16 queries hold a thread at once; a little slack for the
    // runtime's own.
    assert!(
        most <= before + 40,
        "threads grew from {before} to {most} under the flood"
    );
    println!("{done} done, {busy} busy, {queries} queries; threads {before} -> at most {most}");
    node.shutdown();
}

/// `Client::status` (what `atomos status` prints): every member answers with its role, term
/// and positions; one leader, followed by all in one term; the positions cover what was
/// committed; a stopped member is reported unreachable and the rest can still commit; under
/// a protocol without replicas the members say so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_one_leader_the_positions_and_the_members_that_do_not_answer() {
    use atomos::status::ClusterSummary;
    let (mut nodes, members) = cluster(3, "active", "status").await;
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    count_to(&client, "s", 1, 20).await;
    // Every replica applies what was acknowledged; a follower learns of the last commit with
    // the leader's next message.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let reports = loop {
        let reports = client.status(Duration::from_secs(3)).await;
        let caught_up = reports.iter().all(|r| {
            r.status.as_ref().is_ok_and(|s| {
                s.not_ready.is_none() && s.replica.as_ref().is_some_and(|p| p.applied >= 20)
            })
        });
        if caught_up || tokio::time::Instant::now() > deadline {
            break reports;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ids: Vec<u64> = reports.iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![1, 2, 3]);
    let summary = ClusterSummary::of(&reports);
    assert!(summary.can_commit, "{summary:?}");
    assert_eq!((summary.answered, summary.with_leader), (3, 3));
    let (leader, term) = summary.leader.unwrap();
    for r in &reports {
        let s = r.status.as_ref().unwrap();
        assert_eq!((s.id, s.protocol.as_str()), (r.id, "active"));
        assert_eq!(s.failure, None);
        assert_eq!(s.not_ready, None, "member {} not ready", s.id);
        let replica = s.replica.as_ref().unwrap();
        assert_eq!((replica.leader, replica.term), (Some(leader), term));
        assert_eq!(s.role(), if s.id == leader { "leader" } else { "follower" });
        // Twenty invocations took at least twenty positions, each applied where committed.
        assert!(
            replica.applied >= 20 && replica.applied <= replica.commit,
            "{replica:?}"
        );
    }
    // A follower stops: it is reported unreachable, and the other two still commit.
    let follower = reports.iter().find(|r| r.id != leader).unwrap().id;
    let stopped = nodes[follower as usize - 1].take().unwrap();
    stopped.shutdown();
    drop(stopped);
    let reports = client.status(Duration::from_millis(800)).await;
    let summary = ClusterSummary::of(&reports);
    assert_eq!(summary.answered, 2, "{reports:?}");
    assert!(reports[follower as usize - 1].status.is_err());
    assert!(summary.can_commit, "{summary:?}");
    client.close();
    for node in nodes.iter().flatten() {
        node.shutdown();
    }

    // Without replicas, each member answers for itself.
    let (nodes, members) = cluster(2, "tfa", "status-tfa").await;
    let client = Client::connect(client_config(&members, 1)).await.unwrap();
    let reports = client.status(Duration::from_secs(3)).await;
    for r in &reports {
        let s = r.status.as_ref().unwrap();
        assert_eq!((s.protocol.as_str(), s.role()), ("tfa", "not replicated"));
    }
    let summary = ClusterSummary::of(&reports);
    assert!(summary.can_commit && summary.verdict.starts_with("not replicated (tfa)"));
    client.close();
    for node in nodes.iter().flatten() {
        node.shutdown();
    }
}
