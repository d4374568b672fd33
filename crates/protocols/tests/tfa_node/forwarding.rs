//! Reads of objects that moved: passed on to the owner, found through a redirect without
//! forwarding, dropped when from an earlier run of their origin; local reads; aborts that
//! reach where a read was passed on.

use atomos_core::Key;
use atomos_protocols::tfa::{Action, Body, Reply, TfaConfig, TfaMsg, TfaNode};
use atomos_seam::Output;

use super::net::*;

/// Node 2 writes `k` and node 1 reads it (so node 1 remembers node 2 as its owner); then node
/// 3 writes it, which moves it there.
fn move_behind_a_readers_back(net: &mut Net, k: &Key) {
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(k), 1),
        Reply::Commit(Ok(()))
    );
    assert_eq!(read_value(net, 1, 2, k), Some(vec![1]));
    assert_eq!(
        net.write_all(3, 3, std::slice::from_ref(k), 2),
        Reply::Commit(Ok(()))
    );
    assert_eq!(net.owners(k), vec![3]);
}

#[test]
fn a_read_of_an_object_that_moved_is_passed_on_and_answered_by_its_owner() {
    let mut net = Net::new(3);
    let k = Key::from("passed-on");
    move_behind_a_readers_back(&mut net, &k);
    let before = (
        net.node(1).counters().clone(),
        net.node(2).counters().clone(),
    );
    assert_eq!(read_value(&mut net, 1, 4, &k), Some(vec![2]));
    // Node 2 passed the read on rather than redirect node 1.
    assert_eq!(
        net.node(2).counters().reads_forwarded,
        before.1.reads_forwarded + 1
    );
    assert_eq!(net.node(1).counters().redirects, before.0.redirects);

    // Node 2 takes it back: node 1 still believes node 3 has it. A read for a write is passed
    // on the same way; the owner locks its copy for the reader, which commits without asking
    // for the lock and is heard by the owner.
    assert_eq!(
        net.write_all(2, 7, std::slice::from_ref(&k), 2),
        Reply::Commit(Ok(()))
    );
    assert_eq!(net.owners(&k), vec![2]);
    let passed = net.node(3).counters().reads_forwarded;
    net.node(1).begin(5);
    assert_eq!(net.read_for_write(1, 5, &k), Reply::Read(Ok(Some(vec![2]))));
    assert_eq!(net.node(3).counters().reads_forwarded, passed + 1);
    assert_eq!(
        net.node(2)
            .objects()
            .get(&k)
            .and_then(|h| h.locked_by)
            .map(|t| t.node),
        Some(1)
    );
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1)
        .commit(now, 5, vec![(k.clone(), Some(vec![3]))], &mut acts);
    net.absorb(1, acts);
    assert_eq!(queued(&net, |b| matches!(b, Body::Lock { .. })), 0);
    assert_eq!(net.take_reply(1, 5), Some(Reply::Commit(Ok(()))));
    net.settle();
    assert_eq!(net.owners(&k), vec![1]);
    assert_eq!(net.locks(), 0);
    assert_eq!(read_value(&mut net, 2, 6, &k), Some(vec![3]));
}

#[test]
fn with_forwarding_off_a_moved_object_is_found_through_a_redirect() {
    let mut net = Net::new(3);
    for n in &mut net.nodes {
        *n = TfaNode::new(
            n.id(),
            vec![1, 2, 3],
            0,
            TfaConfig {
                forward_reads: false,
                ..cfg()
            },
        )
        .unwrap();
    }
    let k = Key::from("redirected");
    move_behind_a_readers_back(&mut net, &k);
    let redirects = net.node(1).counters().redirects;
    assert_eq!(read_value(&mut net, 1, 4, &k), Some(vec![2]));
    assert_eq!(net.node(1).counters().redirects, redirects + 1);
    assert_eq!(net.node(2).counters().reads_forwarded, 0);
}

#[test]
fn a_passed_on_read_of_an_earlier_run_of_its_origin_is_dropped() {
    let mut owner = TfaNode::new(3, vec![1, 2, 3], 0, cfg()).unwrap();
    // A key node 3 is home to: it answers a read of it itself (unless it drops the read).
    let k = (0..)
        .map(|i| Key::with_index("old-run/", i))
        .find(|k| owner.home(k) == 3)
        .expect("some key has node 3 as its home");
    let hello = |incarnation| TfaMsg {
        clock: 1,
        incarnation,
        body: Body::Hello,
    };
    let mut acts = Vec::new();
    owner.on_message(0, 1, hello(5), &mut acts);
    let forwarded = |origin_incarnation, tx_node| TfaMsg {
        clock: 1,
        incarnation: 0,
        body: Body::Forwarded(atomos_protocols::tfa::PassedRead {
            origin: 1,
            origin_incarnation,
            req: 9,
            lock: Some(atomos_protocols::tfa::TxId {
                node: tx_node,
                n: 1,
            }),
            key: k.clone(),
            hops: 1,
        }),
    };
    let answered = |acts: &[Action]| {
        acts.iter().any(|a| {
            matches!(
                a,
                Output::Send {
                    msg: TfaMsg {
                        body: Body::Fetched { .. },
                        ..
                    },
                    ..
                }
            )
        })
    };
    // From run 4 of node 1, after run 5 said hello: dropped.
    let mut acts = Vec::new();
    owner.on_message(1, 2, forwarded(4, 1), &mut acts);
    assert!(!answered(&acts), "{acts:?}");
    // A lock for another node's transaction: dropped.
    let mut acts = Vec::new();
    owner.on_message(1, 2, forwarded(5, 2), &mut acts);
    assert!(!answered(&acts), "{acts:?}");
    // From the current run: answered to the origin.
    let mut acts = Vec::new();
    owner.on_message(1, 2, forwarded(5, 1), &mut acts);
    assert!(acts.iter().any(|a| matches!(
        a,
        Output::Send {
            to: 1,
            msg: TfaMsg {
                body: Body::Fetched { req: 9, .. },
                ..
            }
        }
    )));
}

#[test]
fn a_node_reads_an_object_it_holds_without_a_message() {
    let mut net = Net::new(3);
    // A key another node is home to, so a read that asked the home would send a message.
    let k = (0..)
        .map(|i| Key::with_index("held/", i))
        .find(|k| net.node(1).home(k) != 2)
        .expect("some key has another home");
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(&k), 4),
        Reply::Commit(Ok(()))
    );
    net.ticks(5);
    assert_eq!(net.owners(&k), vec![2]);
    net.node(2).begin(2);
    let mut acts = Vec::new();
    let now = net.now;
    net.node(2).read_for_write(now, 2, k.clone(), &mut acts);
    assert!(
        !acts.iter().any(|a| matches!(a, Output::Send { .. })),
        "{acts:?}"
    );
    net.absorb(2, acts);
    assert_eq!(net.take_reply(2, 2), Some(Reply::Read(Ok(Some(vec![4])))));
    assert_eq!(
        net.commit(2, 2, vec![(k.clone(), Some(vec![5]))]),
        Reply::Commit(Ok(()))
    );
    assert_eq!(read_value(&mut net, 3, 3, &k), Some(vec![5]));
}

#[test]
fn an_abort_reaches_the_node_a_read_for_a_write_was_passed_on_to() {
    let mut net = Net::new(3);
    let k = Key::from("passed-lock");
    // Node 1 believes node 2 has the object; node 3 has it.
    move_behind_a_readers_back(&mut net, &k);
    net.node(1).begin(4);
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1).read_for_write(now, 4, k.clone(), &mut acts);
    net.absorb(1, acts);
    // Node 2 passes the read on; node 3 locks its copy for node 1, and its answer is lost.
    while let Some((from, to, msg)) = net.queue.pop_front() {
        if from == 3 && to == 1 && matches!(msg.body, Body::Fetched { .. }) {
            continue;
        }
        let mut acts = Vec::new();
        let now = net.now;
        net.node(to).on_message(now, from, msg, &mut acts);
        net.absorb(to, acts);
    }
    assert_eq!(net.locks(), 1, "node 3 locked for node 1");
    // Node 1 gives up without having heard from node 3: node 2 passes its abort on, and node 3
    // lets go at once, not a lease later.
    net.abort(1, 4);
    assert_eq!(net.locks(), 0);
    assert_eq!(read_value(&mut net, 2, 5, &k), Some(vec![2]));
}
