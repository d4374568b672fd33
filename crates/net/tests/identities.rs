//! Identities over TCP: a connection proves a key, and the key decides who it is. Holding the
//! cluster secret is not enough to pose as a member; revoked clients and retired member keys
//! lose their established connections at once; a member's key rotates while the cluster runs.

use std::net::SocketAddr;
use std::time::Duration;

use atomos_net::handshake::Identity;
use atomos_net::keys::KeyPair;
use atomos_net::rpc::Envelope;
use atomos_net::transport::{NodeId, Transport};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

mod common;

use common::*;

async fn answers(node: &TestNode, to: NodeId) -> bool {
    node.rpc
        .request(to, Msg::Ping(1), Duration::from_millis(300))
        .await
        .is_ok()
}

async fn until_answered(node: &TestNode, to: NodeId) {
    tokio::time::timeout(WAIT, async {
        while !answers(node, to).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{to} never answered"));
}

/// Whether member `to` at `addr` refuses `me`. The dialler's side of the handshake ends
/// (the acceptor proved the key pinned for `to`) before the acceptor checks the dialler's key,
/// so a refusal shows as the acceptor closing the connection within a second.
async fn refuses(
    addr: SocketAddr,
    to: NodeId,
    me: Identity,
    members: &[(NodeId, SocketAddr)],
) -> bool {
    let (mut stream, _, _) = raw_handshake(addr, to, me, roster(members))
        .await
        .expect("the dialler's side of the handshake completes");
    let mut buf = [0u8; 256];
    let closed = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    closed.await.is_ok()
}

/// The link changes `node` reported so far.
fn link_changes(node: &mut TestNode) -> Vec<(NodeId, bool)> {
    let mut seen = Vec::new();
    while let Ok(change) = node.links.try_recv() {
        seen.push(change);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_claiming_member_2_is_refused_and_member_2s_link_is_untouched() {
    let (mut ls, members) = listeners(2).await;
    let mut one = start(config(1, SECRET, &members), ls.remove(0));
    let two = start(config(2, SECRET, &members), ls.remove(0));
    until_answered(&one, 2).await;
    until_answered(&two, 1).await;
    link_changes(&mut one);

    // A program with the cluster secret and a client's key claims to be member 2, to member 1,
    // and so does one with a key nobody listed: neither gets in.
    let client_as_two = Identity::member("test", 2, SECRET, client_key(1)).unwrap();
    assert!(
        refuses(members[0].1, 1, client_as_two, &members).await,
        "a client's key passed as member 2"
    );
    let stranger = KeyPair::from_private([7; 32]).unwrap();
    let stranger_as_two = Identity::member("test", 2, SECRET, stranger).unwrap();
    assert!(
        refuses(members[0].1, 1, stranger_as_two, &members).await,
        "an unknown key passed as member 2"
    );

    // Member 2's link never went down and still carries requests both ways.
    assert!(answers(&one, 2).await && answers(&two, 1).await);
    assert_eq!(
        link_changes(&mut one),
        vec![],
        "member 2's link was touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_key_claiming_another_member_is_refused() {
    let (mut ls, members) = listeners(3).await;
    let mut one = start(config(1, SECRET, &members), ls.remove(0));
    // Member 2's key, claiming to be member 3.
    let two_as_three = Identity::member("test", 3, SECRET, member_key(2)).unwrap();
    assert!(
        refuses(members[0].1, 1, two_as_three, &members).await,
        "member 2's key passed as member 3"
    );
    assert!(
        !link_changes(&mut one).contains(&(3, true)),
        "member 3 linked up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_client_keys_are_refused_and_revoked_clients_lose_their_connection() {
    let (mut ls, members) = listeners(1).await;
    let cfg = config(1, SECRET, &members);
    let roster = cfg.roster.clone();
    let mut member = start(cfg, ls.remove(0));

    // A key the member does not list never links.
    let unknown = start_client(client_config(CLIENTS_ADMITTED + 1, SECRET, &members));
    let known = start_client(client_config(1, SECRET, &members));
    until_answered(&known, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!answers(&unknown, 1).await, "an unknown client key linked");
    let unknown_id = unknown.transport.id();
    assert!(!link_changes(&mut member).contains(&(unknown_id, true)));

    // Revoked (the client list reloaded without it): its connection closes at once and it
    // does not get back in.
    let known_id = known.transport.id();
    let kept: Vec<_> = roster
        .clients()
        .into_iter()
        .filter(|(_, name)| name != "client-1")
        .collect();
    roster.set_clients(kept);
    wait_link(&mut member, known_id, false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!answers(&known, 1).await, "a revoked client still talks");
    assert!(!link_changes(&mut member).contains(&(known_id, true)));

    // Admitted again, it reconnects by itself.
    roster.set_clients([(client_key(1).public(), "client-1".to_string())]);
    until_answered(&known, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_retired_key_loses_its_established_link() {
    let (mut ls, members) = listeners(2).await;
    let cfg = config(1, SECRET, &members);
    let roster = cfg.roster.clone();
    let mut one = start(cfg, ls.remove(0));
    let _two = start(config(2, SECRET, &members), ls.remove(0));
    until_answered(&one, 2).await;
    // Member 2's key is replaced in member 1's roster while their link runs: it closes, and
    // member 2, still holding the old key, does not get back in.
    roster.set_member_keys([(2, vec![KeyPair::generate().unwrap().public()])]);
    wait_link(&mut one, 2, false).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!answers(&one, 2).await, "the retired key still talks");
    assert!(!link_changes(&mut one).contains(&(2, true)));
}

/// Starts member `id` holding `key` on `addr` (re-bound after the member it replaces stopped).
async fn restart_with_key(
    id: NodeId,
    key: KeyPair,
    addr: SocketAddr,
    members: &[(NodeId, SocketAddr)],
) -> TestNode {
    let mut cfg = config(id, SECRET, members);
    cfg.identity = Identity::member("test", id, SECRET, key).unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "cannot re-bind: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    start(cfg, listener)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_key_rotates_while_the_others_keep_serving() {
    let (mut ls, members) = listeners(3).await;
    let cfgs: Vec<_> = (1..=3).map(|id| config(id, SECRET, &members)).collect();
    let rosters: Vec<_> = cfgs.iter().map(|c| c.roster.clone()).collect();
    let mut nodes: Vec<TestNode> = cfgs
        .into_iter()
        .zip(ls.drain(..))
        .map(|(cfg, l)| start(cfg, l))
        .collect();
    until_answered(&nodes[0], 2).await;
    until_answered(&nodes[2], 2).await;
    until_answered(&nodes[0], 3).await;

    // 1. Members 1 and 3 admit member 2's new key beside its old one (a reload each).
    let new_key = KeyPair::generate().unwrap();
    let both = vec![member_key(2).public(), new_key.public()];
    for i in [0, 2] {
        rosters[i].set_member_keys([(2, both.clone())]);
    }
    // Nothing closes: the old key is still listed.
    assert!(answers(&nodes[0], 2).await);

    // 2. Member 2 restarts with its new key; 1 and 3 serve each other throughout.
    let old_two = nodes.remove(1);
    old_two.transport.shutdown();
    drop(old_two);
    assert!(
        answers(&nodes[0], 3).await,
        "members 1 and 3 lost each other"
    );
    let two = restart_with_key(2, new_key.clone(), members[1].1, &members).await;
    until_answered(&two, 1).await;
    until_answered(&two, 3).await;
    until_answered(&nodes[0], 2).await;

    // 3. The old key is retired everywhere: the new links stay, the old key is refused.
    for roster in &rosters {
        roster.set_member_keys([(2, vec![new_key.public()])]);
    }
    link_changes(&mut nodes[0]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(answers(&nodes[0], 2).await && answers(&two, 3).await);
    assert!(
        !link_changes(&mut nodes[0]).contains(&(2, false)),
        "the new key's link closed"
    );
    let old = Identity::member("test", 2, SECRET, member_key(2)).unwrap();
    assert!(
        refuses(members[0].1, 1, old, &members).await,
        "the retired key still gets in"
    );
    assert!(answers(&nodes[0], 3).await);
}

/// Members join and leave while the transport runs: a member added with its address and key is
/// dialled (by the lower id) and answers both ways; one removed is refused, its connection
/// closes, and sends to it fail as to an unknown peer. Bad additions are errors naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_join_and_leave_while_the_transport_runs() {
    let (mut ls, members) = listeners(3).await;
    let founders = &members[..2];
    let one = start(config(1, SECRET, founders), ls.remove(0));
    let two = start(config(2, SECRET, founders), ls.remove(0));
    until_answered(&one, 2).await;
    // Member 3 starts knowing the founders; they learn of it later.
    let three = start(config(3, SECRET, &members), ls.remove(0));
    assert!(!answers(&one, 3).await, "3 is not a member of 1's yet");
    assert!(matches!(
        one.transport.send(3, Envelope::OneWay(Msg::Note(7))),
        Err(atomos_net::transport::SendError::UnknownPeer(3))
    ));
    for node in [&one, &two] {
        node.transport
            .add_member(3, members[2].1, vec![member_key(3).public()])
            .expect("added");
    }
    until_answered(&one, 3).await;
    until_answered(&three, 1).await;
    until_answered(&three, 2).await;
    assert_eq!(one.transport.peers(), vec![2, 3]);

    // Bad additions change nothing.
    for (id, keys) in [(1, vec![member_key(1).public()]), (9, Vec::new())] {
        let err = one
            .transport
            .add_member(id, members[2].1, keys)
            .expect_err("refused");
        assert!(err.to_string().contains(&format!("member {id}")), "{err}");
    }
    assert_eq!(one.transport.peers(), vec![2, 3]);

    // 3 leaves: 1 and 2 no longer talk with it, and it cannot come back in.
    for node in [&one, &two] {
        node.transport.remove_member(3);
    }
    assert_eq!(one.transport.peers(), vec![2]);
    tokio::time::timeout(WAIT, async {
        while answers(&three, 1).await || answers(&three, 2).await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("3's connections closed");
    assert!(!answers(&one, 3).await);
    until_answered(&one, 2).await;
}
