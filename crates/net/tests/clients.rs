//! Clients over TCP: programs that hold the cluster secret and a client key, and are no
//! members, connect to members, talk both ways, and are refused when they should be.

use std::time::Duration;

use atomos_net::rpc::{Envelope, Rpc};
use atomos_net::tcp::TcpTransport;
use atomos_net::transport::{is_client, SendError, Transport, CLIENT_BIT};

mod common;

use common::*;

async fn ping_until_answered(node: &TestNode, to: u64, n: u64) -> Msg {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Ok(a) = node
                .rpc
                .request(to, Msg::Ping(n), Duration::from_millis(300))
                .await
            {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{to} never answered"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_talks_with_every_member_both_ways_while_connected() {
    let (mut ls, members) = listeners(2).await;
    let mut nodes: Vec<TestNode> = Vec::new();
    for (id, l) in (1..=2).zip(ls.drain(..)) {
        nodes.push(start(config(id, SECRET, &members), l));
    }
    let mut client = start_client(client_config(1, SECRET, &members));
    let cid = client.transport.id();
    assert!(is_client(cid));
    assert_eq!(client.transport.peers(), vec![1, 2]);
    for member in 1..=2 {
        assert_eq!(
            ping_until_answered(&client, member, member).await,
            Msg::Pong(member)
        );
    }
    // Members reach the client while it is connected, in order.
    for node in &mut nodes {
        wait_link(node, cid, true).await;
    }
    assert_eq!(ping_until_answered(&nodes[0], cid, 7).await, Msg::Pong(7));
    for n in 0..1_000 {
        nodes[1].rpc.send(cid, Msg::Note(n)).unwrap();
    }
    for n in 0..1_000 {
        let got = tokio::time::timeout(WAIT, client.notes.recv()).await;
        assert_eq!(got.unwrap(), Some(n));
    }
    // Clients are not members: they are not among a member's peers.
    assert_eq!(nodes[0].transport.peers(), vec![2]);
    // Gone, the client is unknown again.
    client.transport.shutdown();
    drop(client);
    for node in &mut nodes {
        wait_link(node, cid, false).await;
    }
    assert_eq!(
        nodes[0].rpc.send(cid, Msg::Note(0)),
        Err(SendError::UnknownPeer(cid))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_refused_without_the_secret_or_when_members_do_not_accept_them() {
    let (mut ls, members) = listeners(2).await;
    let mut one = config(1, SECRET, &members);
    one.accept_clients = false;
    let mut member_without_clients = start(one, ls.remove(0));
    let mut member = start(config(2, SECRET, &members), ls.remove(0));
    let wrong = start_client(client_config(1, "another secret", &members));
    let right = start_client(client_config(2, SECRET, &members));
    let wrong_id = wrong.transport.id();
    assert_eq!(ping_until_answered(&right, 2, 1).await, Msg::Pong(1));
    // Long enough for several dial attempts: none of them links up.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(wrong
        .rpc
        .request(2, Msg::Ping(2), Duration::from_millis(200))
        .await
        .is_err());
    assert!(right
        .rpc
        .request(1, Msg::Ping(3), Duration::from_millis(200))
        .await
        .is_err());
    while let Ok((peer, up)) = member_without_clients.links.try_recv() {
        assert!(
            !is_client(peer) || !up,
            "a client linked up with a member refusing clients"
        );
    }
    while let Ok((peer, up)) = member.links.try_recv() {
        assert!(
            peer != wrong_id || !up,
            "a client without the secret linked up"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_must_say_which_side_they_are_on() {
    let (mut ls, members) = listeners(1).await;
    let (rpc, _inbox) = Rpc::<Msg>::new();
    let member_as_client =
        TcpTransport::<Envelope<Msg>>::connect(config(1, SECRET, &members), rpc.deliverer());
    assert!(
        member_as_client.is_err(),
        "a client id needs the client bit"
    );
    let client_as_member = TcpTransport::<Envelope<Msg>>::start(
        client_config(1, SECRET, &members),
        ls.remove(0),
        rpc.deliverer(),
    );
    assert!(
        client_as_member.is_err(),
        "a member id must not have the client bit"
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peers = vec![(1, members[0].1), (CLIENT_BIT | 5, members[0].1)];
    let client_among_members =
        TcpTransport::<Envelope<Msg>>::start(config(1, SECRET, &peers), l, rpc.deliverer());
    assert!(
        client_among_members.is_err(),
        "a member list cannot name a client"
    );
}
