//! What the TCP transport tests share: a node that answers pings and reports notes and links.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atomos_net::handshake::Identity;
use atomos_net::rpc::{Envelope, Inbound, Rpc};
use atomos_net::tcp::{TcpConfig, TcpTransport};
use atomos_net::transport::NodeId;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Msg {
    Ping(u64),
    Pong(u64),
    Note(u64),
}

pub const SECRET: &str = "loopback secret";
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TestNode {
    pub rpc: Rpc<Msg>,
    pub transport: Arc<TcpTransport<Envelope<Msg>>>,
    pub notes: mpsc::UnboundedReceiver<u64>,
    pub links: mpsc::UnboundedReceiver<(NodeId, bool)>,
}

pub fn config(id: NodeId, secret: &str, peers: &[(NodeId, SocketAddr)]) -> TcpConfig {
    let mut cfg = TcpConfig::new(Identity::new("test", id, secret).unwrap(), peers.to_vec());
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
