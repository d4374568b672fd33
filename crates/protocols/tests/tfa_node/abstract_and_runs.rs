//! Abstract locks on their home; clocks near the end of u64; answers of an earlier run.

use atomos_core::{AbortCause, Key};
use atomos_protocols::tfa::{Action, Answer, Body, Failure, Reply, TfaMsg, TfaNode};
use atomos_seam::Output;

use super::net::*;

fn take_abstract(net: &mut Net, node: u64, h: u64, family: u64, name: &str) -> Reply {
    let name = name.to_string();
    net.answer(node, h, |n, now, out| {
        n.abstract_lock(now, h, family, name, out)
    })
}

#[test]
fn abstract_locks_live_on_their_home_and_die_with_their_family() {
    let mut net = Net::new(3);
    let name = (0..)
        .map(|i| format!("lock/{i}"))
        .find(|n| net.node(1).home(&Key::from(n.as_str())) == 2)
        .unwrap();
    let held = |net: &mut Net| net.node(2).abstract_locks_held();
    net.node(1).begin(1);
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &name),
        Reply::Abstract(Ok(true))
    );
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &name),
        Reply::Abstract(Ok(false))
    );
    net.node(3).begin(1);
    assert_eq!(
        take_abstract(&mut net, 3, 1, 7, &name),
        Reply::Abstract(Err(Failure::Conflict(AbortCause::AbstractLock))),
        "another node's family 7 is another family"
    );
    assert_eq!(held(&mut net), 1);
    let mut acts = Vec::new();
    net.node(1)
        .release_abstract(7, vec![name.clone()], &mut acts);
    net.absorb(1, acts);
    net.settle();
    assert_eq!(held(&mut net), 0);
    // A family that dies holding a lock (its node restarts): the home asks after the lease and
    // frees it.
    assert_eq!(
        take_abstract(&mut net, 3, 1, 9, &name),
        Reply::Abstract(Ok(true))
    );
    net.ticks(10);
    assert_eq!(held(&mut net), 1, "kept while the family runs");
    net.nodes[2] = TfaNode::new(3, vec![1, 2, 3], 1, cfg()).unwrap();
    net.ticks(10);
    assert_eq!(held(&mut net), 0);
}

#[test]
fn a_clock_near_the_end_of_u64_is_dropped_and_changes_nothing() {
    let mut net = Net::new(2);
    let k = Key::from("k");
    assert!(matches!(
        net.write_all(1, 1, std::slice::from_ref(&k), 1),
        Reply::Commit(Ok(()))
    ));
    let before = net.node(2).clock();
    let mut acts = Vec::new();
    let now = net.now;
    let forged = TfaMsg {
        clock: u64::MAX,
        incarnation: 0,
        body: Body::Track {
            entries: vec![(k.clone(), u64::MAX)],
        },
    };
    net.node(2).on_message(now, 1, forged, &mut acts);
    assert!(matches!(acts.as_slice(), [Output::Warn(_)]), "{acts:?}");
    assert_eq!(net.node(2).clock(), before);
    // The nodes go on committing with versions that still grow.
    assert!(matches!(
        net.write_all(2, 2, std::slice::from_ref(&k), 2),
        Reply::Commit(Ok(()))
    ));
    assert!(net.node(2).clock() > before && net.node(2).clock() < 1 << 62);
    assert_eq!(read_value(&mut net, 1, 3, &k), Some(vec![2]));
}

/// A read's answer is taken from whichever node serves it (the read may have been passed on),
/// and request numbers of different runs never meet: an answer meant for an earlier run of a
/// node (still in a queue when it restarted) is not taken for one of the new run's requests.
#[test]
fn answers_for_an_earlier_run_are_ignored_and_a_read_is_answered_by_whoever_serves_it() {
    use atomos_protocols::tfa::msg::FetchAnswer;
    let fetch_of = |acts: &[Action]| {
        acts.iter()
            .find_map(|a| match a {
                Output::Send {
                    to,
                    msg:
                        TfaMsg {
                            body: Body::Fetch { req, .. },
                            ..
                        },
                } => Some((*to, *req)),
                _ => None,
            })
            .expect("a fetch was sent")
    };
    let answer = |req, value: u8| TfaMsg {
        clock: 1,
        incarnation: 0,
        body: Body::Fetched {
            req,
            answer: FetchAnswer::Found {
                value: Some(vec![value]),
                version: 1,
            },
        },
    };
    let replied = |acts: &[Action]| acts.iter().any(|a| matches!(a, Output::Deliver(_)));

    let mut first = TfaNode::new(1, vec![1, 2, 3], 0, cfg()).unwrap();
    // A key another node is home to, so reading it asks that node.
    let k = (0..)
        .map(|i| Key::with_index("asked/", i))
        .find(|k| first.home(k) != 1)
        .expect("some key has another home");
    let mut acts = Vec::new();
    first.begin(1);
    first.read(0, 1, k.clone(), &mut acts);
    let (asked, old_req) = fetch_of(&acts);

    // A third node answering in the asked node's place is heard: the asked node may have
    // passed the read on to it.
    let other = if asked == 2 { 3 } else { 2 };
    let mut acts = Vec::new();
    first.on_message(1, other, answer(old_req, 7), &mut acts);
    assert!(replied(&acts), "{acts:?}");

    // The node restarts and asks again: the answer to the earlier run's request does not
    // answer the new one.
    let mut second = TfaNode::new(1, vec![1, 2, 3], 1, cfg()).unwrap();
    let mut acts = Vec::new();
    second.begin(1);
    second.read(0, 1, k.clone(), &mut acts);
    let (_, new_req) = fetch_of(&acts);
    assert_ne!(new_req, old_req);
    let mut acts = Vec::new();
    second.on_message(1, asked, answer(old_req, 7), &mut acts);
    assert!(!replied(&acts), "{acts:?}");
    let mut acts = Vec::new();
    second.on_message(2, asked, answer(new_req, 8), &mut acts);
    assert!(acts.iter().any(|a| matches!(
        a,
        Output::Deliver(Answer {
            reply: Reply::Read(Ok(Some(v))),
            ..
        }) if v == &vec![8]
    )));
}

/// An open-nested block that aborts gives back only the locks it took: its family runs on and
/// keeps the others. The home that asks after the lease whether the family still runs must
/// hear that it does, or another family could take a lock the first still relies on (its
/// compensation would then undo the other's work).
#[test]
fn a_family_that_gives_back_one_lock_keeps_the_others() {
    let mut net = Net::new(3);
    let mut on_two = (0..)
        .map(|i| format!("lock/{i}"))
        .filter(|n| net.node(1).home(&Key::from(n.as_str())) == 2);
    let (kept, given_back) = (on_two.next().unwrap(), on_two.next().unwrap());
    net.node(1).begin(1);
    for name in [&kept, &given_back] {
        assert_eq!(
            take_abstract(&mut net, 1, 1, 7, name),
            Reply::Abstract(Ok(true))
        );
    }
    let mut acts = Vec::new();
    net.node(1)
        .release_abstract(7, vec![given_back.clone()], &mut acts);
    net.absorb(1, acts);
    net.settle();
    net.ticks(10);
    assert_eq!(
        net.node(2).abstract_locks_held(),
        1,
        "the family still holds {kept}"
    );
    net.node(3).begin(1);
    assert_eq!(
        take_abstract(&mut net, 3, 1, 8, &kept),
        Reply::Abstract(Err(Failure::Conflict(AbortCause::AbstractLock))),
    );
    assert_eq!(
        take_abstract(&mut net, 3, 1, 8, &given_back),
        Reply::Abstract(Ok(true))
    );
}

/// A grant whose answer is lost: the re-sent ask finds the lock held by the same family and
/// the home says "held already", but the family never heard of the first grant. It is new to
/// the family, which must give it back when it ends (a family told "held already" releases
/// nothing, and the lock would stay until its home gave up on it).
#[test]
fn a_lock_granted_to_a_re_sent_ask_is_new_to_the_family() {
    let mut net = Net::new(2);
    let name = (0..)
        .map(|i| format!("lock/{i}"))
        .find(|n| net.node(1).home(&Key::from(n.as_str())) == 2)
        .unwrap();
    net.node(1).begin(1);
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1)
        .abstract_lock(now, 1, 7, name.clone(), &mut acts);
    net.absorb(1, acts);
    // The ask reaches the home; its answer is lost.
    let (from, to, ask) = net.queue.pop_front().expect("the ask");
    let mut acts = Vec::new();
    net.node(to).on_message(now, from, ask, &mut acts);
    assert_eq!(net.node(2).abstract_locks_held(), 1);
    // Re-sent after the re-send time; this time the answer arrives.
    let mut reply = None;
    for _ in 0..10 {
        net.ticks(1);
        if let Some(r) = net.take_reply(1, 1) {
            reply = Some(r);
            break;
        }
    }
    assert_eq!(reply, Some(Reply::Abstract(Ok(true))));
    let mut acts = Vec::new();
    net.node(1).release_abstract(7, vec![name], &mut acts);
    net.absorb(1, acts);
    net.settle();
    assert_eq!(net.node(2).abstract_locks_held(), 0);
}

/// Takes the queued messages whose body `is` out of the network (to deliver later, or never).
fn hold_back(net: &mut Net, is: impl Fn(&Body) -> bool) -> Vec<(u64, u64, TfaMsg)> {
    let mut held = Vec::new();
    for m in std::mem::take(&mut net.queue) {
        if is(&m.2.body) {
            held.push(m);
        } else {
            net.queue.push_back(m);
        }
    }
    held
}

/// Delivers messages taken out with [`hold_back`], late.
fn deliver_late(net: &mut Net, late: Vec<(u64, u64, TfaMsg)>) {
    net.queue.extend(late);
    net.settle();
}

/// A name node 2 is home to, as seen from node 1.
fn homed_on_two(net: &mut Net) -> String {
    (0..)
        .map(|i| format!("lock/{i}"))
        .find(|n| net.node(1).home(&Key::from(n.as_str())) == 2)
        .unwrap()
}

/// Messages between two nodes may arrive out of order: a family that gives a lock back and at
/// once asks for it again (an open-nested block that aborted and runs again) keeps it when
/// the ask overtakes the release.
#[test]
fn a_release_overtaken_by_the_next_ask_frees_nothing() {
    let mut net = Net::new(2);
    let name = homed_on_two(&mut net);
    net.node(1).begin(1);
    let take = |net: &mut Net| take_abstract(net, 1, 1, 7, &name);
    assert_eq!(take(&mut net), Reply::Abstract(Ok(true)));
    let mut acts = Vec::new();
    net.node(1)
        .release_abstract(7, vec![name.clone()], &mut acts);
    net.absorb(1, acts);
    let release = hold_back(&mut net, |b| matches!(b, Body::AbstractRelease { .. }));
    assert_eq!(release.len(), 1);
    assert_eq!(
        take(&mut net),
        Reply::Abstract(Ok(true)),
        "new to the family"
    );
    deliver_late(&mut net, release);
    assert_eq!(
        net.node(2).abstract_locks_held(),
        1,
        "the late release freed the new grant"
    );
    net.node(2).begin(1);
    assert_eq!(
        take_abstract(&mut net, 2, 1, 8, &name),
        Reply::Abstract(Err(Failure::Conflict(AbortCause::AbstractLock))),
    );
}

/// A home asks whether a family runs while it holds nothing (its release was lost); the answer
/// "no" is late, and arrives after the family asked for the lock again and got it: the grant
/// stays.
#[test]
fn a_late_answer_that_the_family_stopped_frees_no_later_grant() {
    let mut net = Net::new(2);
    let name = homed_on_two(&mut net);
    net.node(1).begin(1);
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &name),
        Reply::Abstract(Ok(true))
    );
    let mut acts = Vec::new();
    net.node(1)
        .release_abstract(7, vec![name.clone()], &mut acts);
    net.absorb(1, acts);
    let lost = hold_back(&mut net, |b| matches!(b, Body::AbstractRelease { .. }));
    assert_eq!(lost.len(), 1);
    // Past the lease the home asks; the answer "not running" is held back.
    let mut stale = Vec::new();
    for _ in 0..10 {
        net.now += 1;
        for id in 1..=2 {
            let mut acts = Vec::new();
            let now = net.now;
            net.node(id).tick(now, &mut acts);
            net.absorb(id, acts);
        }
        while let Some((from, to, msg)) = net.queue.pop_front() {
            if matches!(msg.body, Body::FamilyState { alive: false, .. }) {
                stale.push((from, to, msg));
                continue;
            }
            let mut acts = Vec::new();
            let now = net.now;
            net.node(to).on_message(now, from, msg, &mut acts);
            net.absorb(to, acts);
        }
        if !stale.is_empty() {
            break;
        }
    }
    assert!(!stale.is_empty(), "the home asked and node 1 answered");
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &name),
        Reply::Abstract(Ok(true))
    );
    deliver_late(&mut net, stale);
    assert_eq!(
        net.node(2).abstract_locks_held(),
        1,
        "the late answer freed the new grant"
    );
}

/// A name whose home is the family's own node: the home asks the family directly, so a family
/// that runs keeps it however long it holds it (past the abandon time).
#[test]
fn a_family_keeps_a_lock_of_its_own_node_past_the_abandon_time() {
    let mut net = Net::new(2);
    let name = (0..)
        .map(|i| format!("lock/{i}"))
        .find(|n| net.node(1).home(&Key::from(n.as_str())) == 1)
        .unwrap();
    net.node(1).begin(1);
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &name),
        Reply::Abstract(Ok(true))
    );
    net.ticks(3 * cfg().abandon);
    assert_eq!(net.node(1).abstract_locks_held(), 1);
    net.node(2).begin(1);
    assert_eq!(
        take_abstract(&mut net, 2, 1, 8, &name),
        Reply::Abstract(Err(Failure::Conflict(AbortCause::AbstractLock))),
    );
}

/// A family whose ask times out (its home unreachable) holds nothing and asks for nothing: its
/// node no longer counts it as running.
#[test]
fn a_family_whose_ask_timed_out_no_longer_runs() {
    let mut net = Net::new(2);
    let name = homed_on_two(&mut net);
    net.node(1).begin(1);
    net.cut = Some(2);
    let reply = take_abstract(&mut net, 1, 1, 7, &name);
    assert!(
        matches!(reply, Reply::Commit(Err(Failure::Unavailable { .. }))),
        "{reply:?}"
    );
    assert_eq!(net.node(1).abstract_families(), 0);
}

/// An ask is news from the holder for every lock it holds at that home: a lock it has been
/// silent about (its node unreachable) for nearly the abandon time is kept along with the new
/// one.
#[test]
fn an_ask_keeps_the_holders_other_locks_at_that_home() {
    let mut net = Net::new(2);
    let mut on_two = (0..)
        .map(|i| format!("lock/{i}"))
        .filter(|n| net.node(1).home(&Key::from(n.as_str())) == 2);
    let (first, second) = (on_two.next().unwrap(), on_two.next().unwrap());
    net.node(1).begin(1);
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &first),
        Reply::Abstract(Ok(true))
    );
    // Silent (cut off) for nearly the abandon time, then back.
    net.cut = Some(1);
    net.ticks(cfg().abandon - 10);
    net.cut = None;
    assert_eq!(
        take_abstract(&mut net, 1, 1, 7, &second),
        Reply::Abstract(Ok(true))
    );
    net.cut = Some(1);
    net.ticks(20);
    assert_eq!(net.node(2).abstract_locks_held(), 2, "both kept");
}
