//! The TCP and in-memory transports with the request layer on top, on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atomos_net::frame::DEFAULT_MAX_FRAME;
use atomos_net::handshake::{Handshake, HandshakeMsg, Identity, Outcome};
use atomos_net::memory::MemoryNetwork;
use atomos_net::rpc::{Envelope, Inbound, Rpc, RpcError};
use atomos_net::tcp::{LinkFrame, TcpConfig, TcpTransport};
use atomos_net::transport::{LinkRule, NodeId, SendError, Transport};
use atomos_net::wire;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Msg {
    Ping(u64),
    Pong(u64),
    Note(u64),
}

const SECRET: &str = "loopback secret";
const WAIT: Duration = Duration::from_secs(10);

struct TestNode {
    rpc: Rpc<Msg>,
    transport: Arc<TcpTransport<Envelope<Msg>>>,
    notes: mpsc::UnboundedReceiver<u64>,
    links: mpsc::UnboundedReceiver<(NodeId, bool)>,
}

fn config(id: NodeId, secret: &str, peers: &[(NodeId, SocketAddr)]) -> TcpConfig {
    let mut cfg = TcpConfig::new(Identity::new("test", id, secret).unwrap(), peers.to_vec());
    cfg.reconnect_max = Duration::from_millis(200);
    cfg
}

/// Starts a node that answers `Ping(n)` with `Pong(n)` and reports one-way notes and link changes.
fn start(cfg: TcpConfig, listener: TcpListener) -> TestNode {
    let (rpc, mut inbox) = Rpc::<Msg>::new();
    let transport = Arc::new(TcpTransport::start(cfg, listener, rpc.deliverer()).unwrap());
    rpc.attach(transport.clone());
    let (notes_tx, notes) = mpsc::unbounded_channel();
    let (links_tx, links) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(inbound) = inbox.recv().await {
            match inbound {
                Inbound::Request {
                    msg: Msg::Ping(n),
                    reply,
                    ..
                } => {
                    let _ = reply.send(Msg::Pong(n));
                }
                Inbound::Message {
                    msg: Msg::Note(n), ..
                } => {
                    let _ = notes_tx.send(n);
                }
                Inbound::Link { peer, up } => {
                    let _ = links_tx.send((peer, up));
                }
                _ => {}
            }
        }
    });
    TestNode {
        rpc,
        transport,
        notes,
        links,
    }
}

async fn listeners(n: usize) -> (Vec<TcpListener>, Vec<(NodeId, SocketAddr)>) {
    let mut ls = Vec::new();
    let mut members = Vec::new();
    for id in 1..=n as NodeId {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.push((id, l.local_addr().unwrap()));
        ls.push(l);
    }
    (ls, members)
}

async fn wait_link(node: &mut TestNode, peer: NodeId, up: bool) {
    tokio::time::timeout(WAIT, async {
        while let Some((p, u)) = node.links.recv().await {
            if (p, u) == (peer, up) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("link to {peer} never became up={up}"));
}

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

/// Completes a real handshake as node `id` on a raw socket, returning the socket.
async fn raw_peer(addr: SocketAddr, id: NodeId) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut hs, hello) = Handshake::start(Identity::new("test", id, SECRET).unwrap(), [7; 32]);
    let frame = |m: HandshakeMsg| {
        let mut out = Vec::new();
        wire::encode(&LinkFrame::<()>::Handshake(m), DEFAULT_MAX_FRAME, &mut out).unwrap();
        out
    };
    s.write_all(&frame(hello)).await.unwrap();
    let mut dec = atomos_net::frame::Decoder::new(DEFAULT_MAX_FRAME);
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed during the handshake");
        dec.push(&buf[..n]);
        while let Some(p) = dec.next_frame().unwrap() {
            let LinkFrame::<()>::Handshake(m) = wire::decode(p).unwrap() else {
                panic!("not a handshake frame")
            };
            match hs.step(m).unwrap() {
                Outcome::Send(reply) => s.write_all(&frame(reply)).await.unwrap(),
                Outcome::Established { .. } => return s,
            }
        }
    }
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
    let mut s = raw_peer(addr, 1).await;
    wait_link(&mut three, 1, true).await;
    let mut bad = Vec::new();
    atomos_net::frame::encode(&[1, 0, 2, 0xff, 0xff], DEFAULT_MAX_FRAME, &mut bad).unwrap();
    s.write_all(&bad).await.unwrap();
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
