//! Commit locks taken with a read for a write, released when the write did not happen, given
//! up before waiting for another, and ignored when answered by a node not asked.

use atomos_core::{AbortCause, Key};
use atomos_protocols::tfa::{Body, Failure, Reply, TfaMsg};
use atomos_seam::Output;

use super::net::*;

#[test]
fn a_read_for_a_write_locks_and_the_commit_asks_no_lock() {
    let mut net = Net::new(3);
    let k = Key::from("pre");
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(&k), 1),
        Reply::Commit(Ok(()))
    );
    net.node(1).begin(2);
    assert_eq!(net.read_for_write(1, 2, &k), Reply::Read(Ok(Some(vec![1]))));
    let holder = net.node(2).objects().get(&k).and_then(|h| h.locked_by);
    assert_eq!(holder.map(|t| t.node), Some(1), "locked with the read");
    // Another reader waits out its retries and gives up: the object is taken.
    net.node(3).begin(3);
    assert_eq!(
        net.read(3, 3, &k),
        Reply::Read(Err(Failure::Conflict(AbortCause::ReadLocked)))
    );
    // The same transaction reads it again and gets it.
    assert_eq!(net.read(1, 2, &k), Reply::Read(Ok(Some(vec![1]))));
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1)
        .commit(now, 2, vec![(k.clone(), Some(vec![5]))], &mut acts);
    net.absorb(1, acts);
    assert_eq!(queued(&net, |b| matches!(b, Body::Lock { .. })), 0);
    assert_eq!(net.take_reply(1, 2), Some(Reply::Commit(Ok(()))), "at once");
    net.settle();
    assert_eq!(net.owners(&k), vec![1]);
    assert_eq!(read_value(&mut net, 3, 4, &k), Some(vec![5]));
    assert_eq!(net.locks(), 0);
}

#[test]
fn objects_locked_for_writes_that_did_not_happen_are_released_unmoved() {
    let mut net = Net::new(3);
    let (a, b) = (Key::from("kept"), Key::from("taken"));
    assert_eq!(
        net.write_all(2, 1, &[a.clone(), b.clone()], 1),
        Reply::Commit(Ok(()))
    );
    // A commit that writes b only: a stays with its owner, unlocked and unchanged.
    net.node(1).begin(2);
    assert!(matches!(net.read_for_write(1, 2, &a), Reply::Read(Ok(_))));
    assert!(matches!(net.read_for_write(1, 2, &b), Reply::Read(Ok(_))));
    assert_eq!(net.locks(), 2);
    assert_eq!(
        net.commit(1, 2, vec![(b.clone(), Some(vec![2]))]),
        Reply::Commit(Ok(()))
    );
    net.ticks(2);
    assert_eq!((net.owners(&a), net.owners(&b)), (vec![2], vec![1]));
    assert_eq!(read_value(&mut net, 3, 3, &a), Some(vec![1]));
    assert_eq!(net.locks(), 0);
    // One that writes nothing, and one abandoned: both release what they locked.
    net.node(3).begin(4);
    assert!(matches!(net.read_for_write(3, 4, &a), Reply::Read(Ok(_))));
    assert_eq!(net.commit(3, 4, vec![]), Reply::Commit(Ok(())));
    assert_eq!(net.locks(), 0);
    net.node(3).begin(5);
    assert!(matches!(net.read_for_write(3, 5, &b), Reply::Read(Ok(_))));
    assert_eq!(net.locks(), 1);
    net.abort(3, 5);
    assert_eq!(net.locks(), 0);
    assert_eq!((net.owners(&a), net.owners(&b)), (vec![2], vec![1]));
    net.ticks(2);
    assert_eq!(
        net.node(3).in_flight(),
        (0, 0, 0),
        "every decision confirmed"
    );
}

/// A transaction never waits holding a lock: meeting another's lock, it gives its own up (so
/// two that each locked one object and want the other's cannot wait for each other) and goes
/// on as a transaction that took none.
#[test]
fn a_transaction_gives_its_locks_up_before_it_waits_for_one() {
    let mut net = Net::new(3);
    let (a, b) = (Key::from("left"), Key::from("right"));
    assert_eq!(
        net.write_all(3, 1, &[a.clone(), b.clone()], 1),
        Reply::Commit(Ok(()))
    );
    net.node(1).begin(2);
    net.node(2).begin(3);
    assert!(matches!(net.read_for_write(1, 2, &a), Reply::Read(Ok(_))));
    assert!(matches!(net.read_for_write(2, 3, &b), Reply::Read(Ok(_))));
    // Node 1 wants b: it releases a and waits.
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1).read_for_write(now, 2, b.clone(), &mut acts);
    net.absorb(1, acts);
    net.settle();
    assert_eq!(net.node(3).objects().get(&a).unwrap().locked_by, None);
    assert_eq!(net.node(1).counters().locks_given_up, 1);
    // So node 2 gets a and commits; node 1's wait ends with b changed under it.
    assert_eq!(net.read_for_write(2, 3, &a), Reply::Read(Ok(Some(vec![1]))));
    assert_eq!(
        net.commit(
            2,
            3,
            vec![(a.clone(), Some(vec![7])), (b.clone(), Some(vec![7]))]
        ),
        Reply::Commit(Ok(()))
    );
    let mut answer = None;
    for _ in 0..20 {
        net.ticks(1);
        if let Some(r) = net.take_reply(1, 2) {
            answer = Some(r);
            break;
        }
    }
    assert_eq!(
        answer,
        Some(Reply::Read(Err(Failure::Stale(vec![a.clone()]))))
    );
    net.abort(1, 2);
    net.ticks(2);
    assert_eq!((net.owners(&a), net.owners(&b)), (vec![2], vec![2]));
    assert_eq!(net.locks(), 0);
}

/// An owner that asks about a lock taken with a read, held past the lease, gets it back; the
/// transaction is not aborted for it: it goes on without the lock and commits.
#[test]
fn a_long_transaction_gives_up_its_read_locks_when_asked_and_still_commits() {
    let mut net = Net::new(3);
    let k = Key::from("slow");
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(&k), 1),
        Reply::Commit(Ok(()))
    );
    net.node(1).begin(2);
    assert!(matches!(net.read_for_write(1, 2, &k), Reply::Read(Ok(_))));
    assert_eq!(net.locks(), 1);
    net.ticks(cfg().lease + 2);
    assert_eq!(net.locks(), 0, "given back when asked");
    assert_eq!(net.node(1).counters().locks_given_up, 1);
    assert_eq!(net.take_reply(1, 2), None, "not aborted");
    assert_eq!(
        net.commit(1, 2, vec![(k.clone(), Some(vec![3]))]),
        Reply::Commit(Ok(()))
    );
    net.ticks(2);
    assert_eq!(net.owners(&k), vec![1]);
    assert_eq!(read_value(&mut net, 3, 3, &k), Some(vec![3]));
}

/// A lock taken with a read of an object the transaction's own node owns, held past the lease
/// while the transaction does nothing (its application is busy, or its task was preempted by
/// a more urgent one), is given up as one an owner elsewhere asks about: readers of the object
/// are not refused until the holder runs again (which, behind them, it may never do).
#[test]
fn a_read_lock_on_an_object_of_its_own_node_is_given_up_after_the_lease() {
    let mut net = Net::new(3);
    let k = Key::from("mine");
    assert_eq!(
        net.write_all(1, 1, std::slice::from_ref(&k), 1),
        Reply::Commit(Ok(()))
    );
    assert_eq!(net.owners(&k), vec![1]);
    net.node(1).begin(2);
    assert!(matches!(net.read_for_write(1, 2, &k), Reply::Read(Ok(_))));
    assert_eq!(net.locks(), 1);
    net.ticks(cfg().lease + 2);
    assert_eq!(net.locks(), 0, "given up after the lease");
    assert_eq!(net.node(1).counters().locks_given_up, 1);
    assert_eq!(net.take_reply(1, 2), None, "not aborted");
    // A reader on the same node gets the object instead of being refused.
    net.node(1).begin(3);
    assert_eq!(net.read(1, 3, &k), Reply::Read(Ok(Some(vec![1]))));
    assert_eq!(
        net.commit(1, 2, vec![(k.clone(), Some(vec![3]))]),
        Reply::Commit(Ok(()))
    );
    assert_eq!(read_value(&mut net, 3, 4, &k), Some(vec![3]));
}

#[test]
fn a_lock_answered_by_a_node_not_asked_is_ignored() {
    let mut net = Net::new(3);
    let k = Key::from("lock-asked");
    commit_pending(&mut net, &k);
    let (to, req) = net
        .queue
        .iter()
        .find_map(|(_, to, m)| match m.body {
            Body::Lock { req, .. } => Some((*to, req)),
            _ => None,
        })
        .expect("a lock request is queued");
    assert_eq!(to, 2);
    let forged = TfaMsg {
        clock: 1,
        incarnation: 0,
        body: Body::Locked {
            req,
            result: Ok(()),
        },
    };
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1).on_message(now, 3, forged, &mut acts);
    assert!(
        !acts.iter().any(|a| matches!(a, Output::Deliver(_))),
        "{acts:?}"
    );
    // The owner's own answer commits it.
    net.settle();
    assert_eq!(net.take_reply(1, 2), Some(Reply::Commit(Ok(()))));
    assert_eq!(net.owners(&k), vec![1]);
}
