//! What the TCP transport tests share: a node that answers pings and reports notes and links.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atomos_net::handshake::{Handshake, Identity, Progress, Refusal};
use atomos_net::keys::KeyPair;
use atomos_net::roster::Roster;
use atomos_net::rpc::{Envelope, Inbound, Rpc};
use atomos_net::secure::{Opener, Sealer};
use atomos_net::tcp::{TcpConfig, TcpTransport};
use atomos_net::transport::NodeId;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    Ping(u64),
    Pong(u64),
    Note(u64),
    /// A one-way note of a kind the newest wire version introduced.
    Fresh(u64),
}

impl atomos_net::wire::WireMessage for Msg {
    fn since(&self) -> u16 {
        match self {
            Msg::Fresh(_) => atomos_net::wire::WIRE_VERSION,
            _ => atomos_net::wire::OLDEST_WIRE_VERSION,
        }
    }
}

pub const SECRET: &str = "loopback secret";
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TestNode {
    pub rpc: Rpc<Msg>,
    pub transport: Arc<TcpTransport<Envelope<Msg>>>,
    pub notes: mpsc::UnboundedReceiver<u64>,
    pub links: mpsc::UnboundedReceiver<(NodeId, bool)>,
}

/// Member `id`'s key pair (derived from its id: tests only).
pub fn member_key(id: NodeId) -> KeyPair {
    let mut private = [b'm'; 32];
    private[..8].copy_from_slice(&id.to_be_bytes());
    KeyPair::from_private(private).unwrap()
}

/// Client `n`'s key pair (derived from `n`: tests only).
pub fn client_key(n: u64) -> KeyPair {
    let mut private = [b'c'; 32];
    private[..8].copy_from_slice(&n.to_be_bytes());
    KeyPair::from_private(private).unwrap()
}

/// Clients 1 to [`CLIENTS_ADMITTED`] are in every test roster, as "client-N".
pub const CLIENTS_ADMITTED: u64 = 4;

/// The roster of `members` (their keys from [`member_key`]) and the admitted clients.
pub fn roster(members: &[(NodeId, SocketAddr)]) -> Arc<Roster> {
    Arc::new(Roster::new(
        members
            .iter()
            .map(|&(id, _)| (id, vec![member_key(id).public()])),
        (1..=CLIENTS_ADMITTED).map(|n| (client_key(n).public(), format!("client-{n}"))),
    ))
}

/// Member `id` of cluster "test" with `secret`, among `peers`, its roster from [`roster`].
pub fn config(id: NodeId, secret: &str, peers: &[(NodeId, SocketAddr)]) -> TcpConfig {
    let identity = Identity::member("test", id, secret, member_key(id)).unwrap();
    let mut cfg = TcpConfig::new(identity, peers.to_vec(), roster(peers));
    cfg.reconnect_max = Duration::from_millis(200);
    cfg
}

/// Client `n` (its key from [`client_key`]) of cluster "test" with `secret`, reaching
/// `members`.
pub fn client_config(n: u64, secret: &str, members: &[(NodeId, SocketAddr)]) -> TcpConfig {
    let identity = Identity::client("test", secret, client_key(n)).unwrap();
    let mut cfg = TcpConfig::new(identity, members.to_vec(), roster(members));
    cfg.reconnect_max = Duration::from_millis(200);
    cfg
}

/// Starts a node that answers `Ping(n)` with `Pong(n)` and reports one-way notes and link changes.
pub fn start(cfg: TcpConfig, listener: TcpListener) -> TestNode {
    let (rpc, inbox) = Rpc::<Msg>::new();
    let transport = Arc::new(TcpTransport::start(cfg, listener, rpc.deliverer()).unwrap());
    serve(rpc, inbox, transport)
}

/// Starts a client (its id has the client bit) that answers and reports as [`start`]'s nodes.
pub fn start_client(cfg: TcpConfig) -> TestNode {
    let (rpc, inbox) = Rpc::<Msg>::new();
    let transport = Arc::new(TcpTransport::connect(cfg, rpc.deliverer()).unwrap());
    serve(rpc, inbox, transport)
}

fn serve(
    rpc: Rpc<Msg>,
    mut inbox: mpsc::UnboundedReceiver<Inbound<Msg>>,
    transport: Arc<TcpTransport<Envelope<Msg>>>,
) -> TestNode {
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
                    msg: Msg::Note(n) | Msg::Fresh(n),
                    ..
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

pub async fn listeners(n: usize) -> (Vec<TcpListener>, Vec<(NodeId, SocketAddr)>) {
    let mut ls = Vec::new();
    let mut members = Vec::new();
    for id in 1..=n as NodeId {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.push((id, l.local_addr().unwrap()));
        ls.push(l);
    }
    (ls, members)
}

pub async fn wait_link(node: &mut TestNode, peer: NodeId, up: bool) {
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

/// Dials `addr` as `me`, expecting member `to` (admitted by `roster`), and runs the handshake
/// on the raw socket; returns the socket and the sealed channel, or the refusal (a closed
/// connection counts as `BadProof`).
pub async fn raw_handshake(
    addr: SocketAddr,
    to: NodeId,
    me: Identity,
    roster: Arc<Roster>,
) -> Result<(TcpStream, Sealer, Opener), Refusal> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut out = Vec::new();
    let mut hs = Handshake::dial(me, roster, to, &mut out);
    s.write_all(&out).await.unwrap();
    let mut dec = atomos_net::frame::Decoder::new(atomos_net::frame::DEFAULT_MAX_FRAME);
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return Err(Refusal::BadProof);
        }
        dec.push(&buf[..n]);
        while let Some(p) = dec.next_frame().unwrap() {
            out.clear();
            let progress = hs.step(p, &mut out)?;
            s.write_all(&out).await.unwrap();
            if let Progress::Established { sealer, opener, .. } = progress {
                return Ok((s, sealer, opener));
            }
        }
    }
}
