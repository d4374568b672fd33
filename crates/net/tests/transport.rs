//! The TCP and in-memory transports with the request layer on top, on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use atomos_net::frame::DEFAULT_MAX_FRAME;
use atomos_net::handshake::Identity;
use atomos_net::memory::MemoryNetwork;
use atomos_net::rpc::{Envelope, Inbound, Rpc, RpcError};
use atomos_net::secure::Sealer;
use atomos_net::transport::{LinkRule, NodeId, SendError, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

mod common;

use common::*;

async fn ping(rpc: &Rpc<Msg>, to: NodeId, n: u64) -> Result<Msg, RpcError> {
    rpc.request(to, Msg::Ping(n), Duration::from_millis(500))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_answers_and_ordered_one_way_messages() {
    let (mut ls, members) = listeners(3).await;
    let mut nodes: Vec<TestNode> = Vec::new();
    for (id, l) in (1..=3).zip(ls.drain(..)) {
        nodes.push(start(config(id, SECRET, &members), l));
    }
    for (i, node) in nodes.iter().enumerate() {
        for peer in 1..=3u64 {
            if peer != i as u64 + 1 {
                let n = i as u64 * 10 + peer;
                let answer = tokio::time::timeout(WAIT, async {
                    loop {
                        if let Ok(a) = ping(&node.rpc, peer, n).await {
                            return a;
                        }
                    }
                })
                .await
                .unwrap();
                assert_eq!(answer, Msg::Pong(n));
            }
        }
    }
    // One-way messages from node 2 arrive at node 1 in order, all of them.
    for n in 0..10_000 {
        nodes[1].rpc.send(1, Msg::Note(n)).unwrap();
    }
    for n in 0..10_000 {
        let got = tokio::time::timeout(WAIT, nodes[0].notes.recv()).await;
        assert_eq!(got.unwrap(), Some(n));
    }
    assert_eq!(
        nodes[0].rpc.send(9, Msg::Note(0)),
        Err(SendError::UnknownPeer(9))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_never_links_up() {
    let (mut ls, members) = listeners(2).await;
    let good = start(config(1, SECRET, &members), ls.remove(0));
    let mut bad = start(config(2, "not the secret", &members), ls.remove(0));
    for n in 0..3 {
        assert!(ping(&good.rpc, 2, n).await.is_err());
    }
    assert!(
        bad.links.try_recv().is_err(),
        "no link came up with the wrong secret"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reconnected() {
    let (mut ls, members) = listeners(2).await;
    let mut one = start(config(1, SECRET, &members), ls.remove(0));
    let two = start(config(2, SECRET, &members), ls.remove(0));
    wait_link(&mut one, 2, true).await;
    assert_eq!(ping(&one.rpc, 2, 1).await, Ok(Msg::Pong(1)));

    // Node 2 goes away: node 1 sees the link go down and requests fail fast.
    two.transport.shutdown();
    drop(two);
    wait_link(&mut one, 2, false).await;
    assert!(ping(&one.rpc, 2, 2).await.is_err());

    // Node 2 comes back on the same address; node 1 re-dials it.
    let listener = loop {
        match TcpListener::bind(members[1].1).await {
            Ok(l) => break l,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let _two = start(config(2, SECRET, &members), listener);
    wait_link(&mut one, 2, true).await;
    assert_eq!(ping(&one.rpc, 2, 3).await, Ok(Msg::Pong(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_cut_and_delay_links() {
    let (mut ls, members) = listeners(2).await;
    let mut one = start(config(1, SECRET, &members), ls.remove(0));
    let _two = start(config(2, SECRET, &members), ls.remove(0));
    wait_link(&mut one, 2, true).await;

    one.transport.faults().set_peer(
        2,
        LinkRule {
            cut: true,
            ..LinkRule::default()
        },
    );
    assert!(matches!(
        ping(&one.rpc, 2, 1).await,
        Err(RpcError::Timeout { peer: 2, .. })
    ));

    one.transport.faults().set_all(LinkRule {
        delay: Duration::from_millis(30),
        ..LinkRule::default()
    });
    one.transport.faults().set_peer(2, LinkRule::default());
    // set_peer(default) overrides `all` for peer 2: no delay.
    let started = std::time::Instant::now();
    assert_eq!(ping(&one.rpc, 2, 2).await, Ok(Msg::Pong(2)));
    assert!(started.elapsed() < Duration::from_millis(30));

    one.transport.faults().clear();
    one.transport.faults().set_all(LinkRule {
        delay: Duration::from_millis(30),
        ..LinkRule::default()
    });
    let started = std::time::Instant::now();
    assert_eq!(ping(&one.rpc, 2, 3).await, Ok(Msg::Pong(3)));
    assert!(started.elapsed() >= Duration::from_millis(30));
}

/// Completes a real handshake as member `id` with node 3 at `addr` on a raw socket; returns
/// the socket and what seals the records it sends.
async fn raw_peer(addr: SocketAddr, id: NodeId) -> (TcpStream, Sealer) {
    let members: Vec<(NodeId, SocketAddr)> = (1..=3).map(|n| (n, addr)).collect();
    let me = Identity::member("test", id, SECRET, member_key(id)).unwrap();
    let (s, sealer, _) = raw_handshake(addr, 3, me, roster(&members)).await.unwrap();
    (s, sealer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_frames_and_silent_peers_close_only_their_connection() {
    let (mut ls, members) = listeners(3).await;
    let mut cfg = config(3, SECRET, &members);
    cfg.keepalive = Duration::from_millis(50);
    cfg.dead_after = Duration::from_millis(300);
    let mut three = start(cfg, ls.remove(2));
    let addr = members[2].1;

    // Garbage before any handshake: refused, the node keeps serving.
    let mut junk = TcpStream::connect(addr).await.unwrap();
    junk.write_all(&[0xff; 64]).await.unwrap();
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match junk.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a garbage connection is closed");

    // An authenticated peer that sends a damaged message: link down, nothing delivered.
    let (mut s, mut sealer) = raw_peer(addr, 1).await;
    wait_link(&mut three, 1, true).await;
    let mut bad = Vec::new();
    atomos_net::frame::encode(&[2, 0, 2, 0xff, 0xff], DEFAULT_MAX_FRAME, &mut bad).unwrap();
    let mut sealed = Vec::new();
    sealer.seal(&bad, &mut sealed).unwrap();
    s.write_all(&sealed).await.unwrap();
    wait_link(&mut three, 1, false).await;
    assert!(three.notes.try_recv().is_err());

    // An authenticated peer that goes silent is declared dead.
    let _silent = raw_peer(addr, 2).await;
    wait_link(&mut three, 2, true).await;
    let started = std::time::Instant::now();
    wait_link(&mut three, 2, false).await;
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_network_answers_and_applies_rules() {
    let network = MemoryNetwork::<Envelope<Msg>>::new();
    let mut rpcs = Vec::new();
    for id in 1..=3 {
        let (rpc, mut inbox) = Rpc::<Msg>::new();
        rpc.attach(network.join(id, rpc.deliverer()));
        tokio::spawn(async move {
            while let Some(inbound) = inbox.recv().await {
                if let Inbound::Request {
                    msg: Msg::Ping(n),
                    reply,
                    ..
                } = inbound
                {
                    let _ = reply.send(Msg::Pong(n));
                }
            }
        });
        rpcs.push(rpc);
    }
    assert_eq!(ping(&rpcs[0], 3, 5).await, Ok(Msg::Pong(5)));
    assert_eq!(rpcs[0].transport().unwrap().peers(), vec![2, 3]);
    // Node 3 cuts node 1 off: node 1's requests to it go unanswered, node 2's still work.
    rpcs[2].transport().unwrap().faults().set_peer(
        1,
        LinkRule {
            cut: true,
            ..LinkRule::default()
        },
    );
    assert!(matches!(
        ping(&rpcs[0], 3, 6).await,
        Err(RpcError::Timeout { .. })
    ));
    assert_eq!(ping(&rpcs[1], 3, 7).await, Ok(Msg::Pong(7)));
    // Node 3 leaves: requests to it fail at once.
    rpcs[2].transport().unwrap().shutdown();
    assert_eq!(
        ping(&rpcs[0], 3, 8).await,
        Err(RpcError::Send(SendError::UnknownPeer(3)))
    );
}

/// Whether the node closes `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 512];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_connections_are_bounded_and_timed_out() {
    let (mut ls, members) = listeners(2).await;
    let mut cfg = config(2, SECRET, &members);
    cfg.max_pending_handshakes = 4;
    cfg.handshake_timeout = Duration::from_millis(1500);
    let mut two = start(cfg, ls.remove(1));
    let addr = members[1].1;

    // Ten connections that never prove anything: four are let in to handshake, the rest are
    // closed at once.
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut shed = 0;
    for s in &mut idle {
        if closed_within(s, Duration::from_millis(300)).await {
            shed += 1;
        }
    }
    assert_eq!(shed, 6, "connections beyond the bound are closed at once");
    // The four handshaking ones reach their deadline and are closed too.
    for s in &mut idle {
        assert!(
            closed_within(s, Duration::from_secs(5)).await,
            "no deadline"
        );
    }
    // A real member still gets in.
    let _one = start(config(1, SECRET, &members), ls.remove(0));
    wait_link(&mut two, 1, true).await;
}
