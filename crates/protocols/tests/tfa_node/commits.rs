//! Commits move objects to their writer; a read of a newer version forwards or aborts; an
//! unreachable owner fails the transaction; locks of a committer that restarted, vanished or
//! was cut off are neither held forever nor forked.

use atomos_core::Key;
use atomos_protocols::tfa::{Body, Failure, Reply, TfaNode};

use super::net::*;

#[test]
fn objects_move_to_their_writer_and_deletes_read_as_missing() {
    let mut net = Net::new(3);
    let k = Key::from("moving");
    assert_eq!(read_value(&mut net, 2, 1, &k), None, "never created");
    assert_eq!(
        net.write_all(1, 2, std::slice::from_ref(&k), 7),
        Reply::Commit(Ok(()))
    );
    assert_eq!(net.owners(&k), vec![1]);
    assert_eq!(
        net.write_all(3, 3, std::slice::from_ref(&k), 8),
        Reply::Commit(Ok(()))
    );
    assert_eq!(net.owners(&k), vec![3], "moved to the writer");
    assert_eq!(read_value(&mut net, 2, 4, &k), Some(vec![8]));
    // Delete: the deleter keeps the object's "missing" state; every node reads it missing.
    net.node(2).begin(5);
    assert!(matches!(net.read(2, 5, &k), Reply::Read(Ok(Some(_)))));
    assert_eq!(
        net.commit(2, 5, vec![(k.clone(), None)]),
        Reply::Commit(Ok(()))
    );
    for node in 1..=3 {
        assert_eq!(read_value(&mut net, node, 10 + node, &k), None);
    }
    let home = net.node(1).home(&k);
    assert_eq!(net.node(home).home_record(&k).map(|r| r.owner), Some(2));
    assert_eq!(net.locks(), 0);
}

#[test]
fn a_read_of_a_newer_version_forwards_or_aborts() {
    let mut net = Net::new(3);
    let (a, b) = (Key::from("fa"), Key::from("fb"));
    assert_eq!(
        net.write_all(1, 1, std::slice::from_ref(&a), 1),
        Reply::Commit(Ok(()))
    );
    assert_eq!(
        net.write_all(2, 2, std::slice::from_ref(&b), 1),
        Reply::Commit(Ok(()))
    );
    // Transaction 10 on node 3 reads a, then a and b are written together elsewhere.
    net.node(3).begin(10);
    assert_eq!(net.read(3, 10, &a), Reply::Read(Ok(Some(vec![1]))));
    assert_eq!(
        net.write_all(2, 3, &[a.clone(), b.clone()], 2),
        Reply::Commit(Ok(()))
    );
    // Reading b now meets a newer version: a changed, so forwarding fails, naming a; the
    // transaction stays open for a nested block to roll back, or to be aborted.
    assert_eq!(
        net.read(3, 10, &b),
        Reply::Read(Err(Failure::Stale(vec![a.clone()])))
    );
    net.node(3).forget(10, std::slice::from_ref(&a));
    assert_eq!(net.read(3, 10, &b), Reply::Read(Ok(Some(vec![2]))));
    assert_eq!(net.read(3, 10, &a), Reply::Read(Ok(Some(vec![2]))));
    net.abort(3, 10);
    assert_eq!(net.node(3).counters().aborts_forward, 1);
    // A fresh transaction that read something still current is forwarded instead.
    net.node(3).begin(11);
    let c = Key::from("fc");
    assert_eq!(net.read(3, 11, &c), Reply::Read(Ok(None)));
    assert_eq!(
        net.write_all(1, 4, std::slice::from_ref(&b), 3),
        Reply::Commit(Ok(()))
    );
    let before = net.node(3).counters().forwards;
    assert_eq!(net.read(3, 11, &b), Reply::Read(Ok(Some(vec![3]))));
    assert_eq!(net.node(3).counters().forwards, before + 1);
}

#[test]
fn an_unreachable_owner_fails_the_transaction_naming_node_and_key() {
    let mut net = Net::new(3);
    let k = Key::from("far");
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(&k), 1),
        Reply::Commit(Ok(()))
    );
    net.cut = Some(2);
    net.node(1).begin(2);
    match net.read(1, 2, &k) {
        Reply::Read(Err(Failure::Unavailable { key, node })) => {
            assert_eq!(key, k);
            // The home may answer (redirecting to 2) or be node 2 itself.
            assert_eq!(node, 2);
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}

#[test]
fn locks_of_a_restarted_committer_make_their_objects_lost_not_forked() {
    let mut net = Net::new(3);
    let k = Key::from("locked");
    // Node 1 reads k and asks owner 2 for its lock, then crashes: whether it decided to commit
    // (and took k with it) nobody can tell any more.
    commit_pending(&mut net, &k);
    net.cut = Some(1);
    net.settle();
    assert_eq!(net.locks(), 1, "owner 2 holds the lock");
    // While the committer is away the lock is kept (it might have committed).
    net.ticks(50);
    assert_eq!(net.locks(), 1);
    // It restarts with a new incarnation, knowing nothing: the object is in doubt, so it is
    // dropped as lost rather than kept (a committed copy may have died with node 1, and others
    // may have read it).
    net.nodes[0] = TfaNode::new(1, vec![1, 2, 3], 1, cfg()).unwrap();
    net.cut = None;
    net.ticks(10);
    assert_eq!(net.locks(), 0);
    assert!(
        net.owners(&k).is_empty(),
        "nobody owns it: {:?}",
        net.owners(&k)
    );
    assert_eq!(
        net.write_all(3, 3, std::slice::from_ref(&k), 4),
        Reply::Read(Err(Failure::Lost {
            key: k.clone(),
            node: 1
        })),
        "a lost object is not re-created"
    );
    // Not even by a write that does not read it first.
    net.node(3).begin(6);
    assert_eq!(
        net.commit(3, 6, vec![(k.clone(), Some(vec![5]))]),
        Reply::Commit(Err(Failure::Lost {
            key: k.clone(),
            node: 1
        }))
    );
    net.node(3).begin(5);
    assert_eq!(
        net.read(3, 5, &k),
        Reply::Read(Err(Failure::Lost {
            key: k.clone(),
            node: 1
        }))
    );
}

#[test]
fn locks_of_a_committer_that_never_returns_are_abandoned_after_the_abandon_time() {
    let mut net = Net::new(3);
    let k = Key::from("abandoned");
    commit_pending(&mut net, &k);
    net.cut = Some(1);
    net.settle();
    net.ticks(90);
    assert_eq!(net.locks(), 1);
    net.ticks(20);
    assert_eq!(net.locks(), 0);
    assert_eq!(net.node(2).counters().abandoned_locks, 1);
    // Given up on, the object is lost, not released: node 1 may have committed it.
    assert!(net.owners(&k).is_empty());
    net.node(3).begin(7);
    assert_eq!(
        net.read(3, 7, &k),
        Reply::Read(Err(Failure::Lost {
            key: k.clone(),
            node: 1
        }))
    );
}

#[test]
fn a_committer_cut_off_after_deciding_hands_over_when_the_partition_heals() {
    let mut net = Net::new(3);
    let k = Key::from("decided");
    commit_pending(&mut net, &k);
    // Deliver the lock request and the grant, then cut node 1 off: its decision (commit) is
    // lost, and the old owner must not give the object to anyone else meanwhile.
    while let Some((from, to, msg)) = net.queue.pop_front() {
        let is_decision = matches!(msg.body, Body::Decided { .. });
        let mut acts = Vec::new();
        let now = net.now;
        net.node(to).on_message(now, from, msg, &mut acts);
        net.absorb(to, acts);
        if is_decision {
            break;
        }
        if net.take_reply(1, 2) == Some(Reply::Commit(Ok(()))) {
            net.cut = Some(1);
            net.queue.clear();
            break;
        }
    }
    assert_eq!(net.owners(&k), vec![1, 2], "old copy still locked at 2");
    net.ticks(30);
    assert_eq!(net.locks(), 1, "kept while the committer is unreachable");
    assert!(
        matches!(
            net.write_all(3, 3, std::slice::from_ref(&k), 5),
            Reply::Read(Err(_)) | Reply::Commit(Err(_))
        ),
        "nobody else can take the object from the old owner"
    );
    net.cut = None;
    net.ticks(10);
    assert_eq!(net.locks(), 0);
    assert_eq!(net.owners(&k), vec![1], "handed over after the heal");
    assert_eq!(read_value(&mut net, 3, 4, &k), Some(vec![9]));
}
