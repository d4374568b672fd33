//! Members of two wire versions side by side, as in a rolling upgrade: each connection speaks
//! the newest version both ends do, and a message of a kind the older end lacks is refused at
//! the sender, never sent to confuse it.

mod common;

use std::time::Duration;

use atomos_net::rpc::Envelope;
use atomos_net::transport::{SendError, Transport};
use atomos_net::wire::{OLDEST_WIRE_VERSION, WIRE_VERSION};
use common::{config, listeners, start, Msg, TestNode, SECRET, WAIT};
use tokio::time::timeout;

async fn wait_version(node: &TestNode, peer: u64) -> u16 {
    timeout(WAIT, async {
        loop {
            if let Some(v) = node.transport.wire_version(peer) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the link came up")
}

async fn note(node: &mut TestNode) -> u64 {
    timeout(WAIT, node.notes.recv())
        .await
        .expect("a note arrived")
        .expect("the node runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_member_and_new_ones_each_speak_what_both_ends_do() {
    let (ls, members) = listeners(3).await;
    let mut ls = ls.into_iter();
    let new = |id, l| start(config(id, SECRET, &members), l);
    let mut a = new(1, ls.next().unwrap());
    // Sent before any connection: stamped with the oldest version, read by either build.
    a.transport.send(2, Envelope::OneWay(Msg::Note(1))).unwrap();
    a.transport.send(3, Envelope::OneWay(Msg::Note(2))).unwrap();
    // Member 2 runs as the previous release would.
    let mut old_cfg = config(2, SECRET, &members);
    old_cfg.identity = old_cfg
        .identity
        .speaking_up_to(OLDEST_WIRE_VERSION)
        .unwrap();
    let mut b = start(old_cfg, ls.next().unwrap());
    let mut c = new(3, ls.next().unwrap());

    assert_eq!(note(&mut b).await, 1);
    assert_eq!(note(&mut c).await, 2);
    assert_eq!(wait_version(&a, 2).await, OLDEST_WIRE_VERSION);
    assert_eq!(wait_version(&b, 1).await, OLDEST_WIRE_VERSION);
    assert_eq!(wait_version(&a, 3).await, WIRE_VERSION);
    assert_eq!(wait_version(&c, 1).await, WIRE_VERSION);
    assert_eq!(wait_version(&c, 2).await, OLDEST_WIRE_VERSION);

    // Requests, answers and one-way messages cross every link, whatever its version.
    for (from, to) in [(&a, 2), (&b, 1), (&b, 3), (&c, 1), (&a, 3)] {
        let answer = from
            .rpc
            .request(to, Msg::Ping(to), WAIT)
            .await
            .expect("an answer");
        assert_eq!(answer, Msg::Pong(to));
    }
    a.transport.send(2, Envelope::OneWay(Msg::Note(5))).unwrap();
    assert_eq!(note(&mut b).await, 5);
    b.transport.send(1, Envelope::OneWay(Msg::Note(6))).unwrap();
    assert_eq!(note(&mut a).await, 6);

    // The newer kind of message goes to the new member and is refused for the old one.
    a.transport
        .send(3, Envelope::OneWay(Msg::Fresh(7)))
        .unwrap();
    assert_eq!(note(&mut c).await, 7);
    assert_eq!(
        a.transport.send(2, Envelope::OneWay(Msg::Fresh(8))),
        Err(SendError::TooNew {
            peer: 2,
            since: WIRE_VERSION,
            speaks: OLDEST_WIRE_VERSION
        })
    );
    // The old member's link still works: nothing it could not read reached it.
    a.transport.send(2, Envelope::OneWay(Msg::Note(9))).unwrap();
    assert_eq!(note(&mut b).await, 9);
    assert_eq!(a.transport.wire_version(2), Some(OLDEST_WIRE_VERSION));
}
