//! TFA nodes driven by hand through chosen message losses: objects move to their writer, the
//! directory follows, locks of a committer that crashed or was cut off are not held forever,
//! and an unreachable owner fails a transaction with a clear error instead of hanging.

use std::collections::VecDeque;

use atomos_core::{AbortCause, Key};
use atomos_protocols::tfa::{Action, Answer, Body, Failure, Reply, TfaConfig, TfaMsg, TfaNode};
use atomos_seam::Output;

fn cfg() -> TfaConfig {
    TfaConfig {
        lease: 5,
        abandon: 100,
        resend: 3,
        request_timeout: 20,
        max_hops: 8,
        busy_delay: 1,
        busy_retries: 2,
        lock_writes_at_read: true,
        contention_quiet: 0,
        forward_reads: true,
        planted_bug: None,
    }
}

/// Nodes 1..=n and the messages between them; `cut` drops every message to or from a node.
struct Net {
    nodes: Vec<TfaNode>,
    queue: VecDeque<(u64, u64, TfaMsg)>,
    replies: Vec<(u64, u64, Reply)>,
    cut: Option<u64>,
    now: u64,
}

impl Net {
    fn new(n: u64) -> Net {
        let members: Vec<u64> = (1..=n).collect();
        Net {
            nodes: members
                .iter()
                .map(|&me| TfaNode::new(me, members.clone(), 0, cfg()).unwrap())
                .collect(),
            queue: VecDeque::new(),
            replies: Vec::new(),
            cut: None,
            now: 0,
        }
    }

    fn node(&mut self, id: u64) -> &mut TfaNode {
        &mut self.nodes[id as usize - 1]
    }

    fn absorb(&mut self, from: u64, acts: Vec<Action>) {
        for a in acts {
            match a {
                Output::Send { to, msg } => {
                    if self.cut != Some(to) && self.cut != Some(from) {
                        self.queue.push_back((from, to, msg));
                    }
                }
                Output::Deliver(Answer { h, reply }) => self.replies.push((from, h, reply)),
                Output::Warn(_) => {}
                // Home records; what a restart reads back is the simulation's business.
                Output::Persist(_) => {}
            }
        }
    }

    /// Delivers messages until none is left.
    fn settle(&mut self) {
        while let Some((from, to, msg)) = self.queue.pop_front() {
            let mut acts = Vec::new();
            let now = self.now;
            self.node(to).on_message(now, from, msg, &mut acts);
            self.absorb(to, acts);
        }
    }

    /// Advances time by `n` ticks, settling after each.
    fn ticks(&mut self, n: u64) {
        for _ in 0..n {
            self.now += 1;
            for id in 1..=self.nodes.len() as u64 {
                let mut acts = Vec::new();
                let now = self.now;
                self.node(id).tick(now, &mut acts);
                self.absorb(id, acts);
            }
            self.settle();
        }
    }

    fn take_reply(&mut self, node: u64, h: u64) -> Option<Reply> {
        let i = self
            .replies
            .iter()
            .position(|(n, rh, _)| *n == node && *rh == h)?;
        Some(self.replies.remove(i).2)
    }

    /// Hands `op` to `node` for transaction `h` and runs the network until it is answered.
    fn answer(
        &mut self,
        node: u64,
        h: u64,
        op: impl FnOnce(&mut TfaNode, u64, &mut Vec<Action>),
    ) -> Reply {
        let mut acts = Vec::new();
        let now = self.now;
        op(self.node(node), now, &mut acts);
        self.absorb(node, acts);
        self.settle();
        for _ in 0..100 {
            if let Some(r) = self.take_reply(node, h) {
                return r;
            }
            self.ticks(1);
        }
        panic!("transaction {h} on node {node} got no answer");
    }

    /// Runs a read on `node` to its answer.
    fn read(&mut self, node: u64, h: u64, key: &Key) -> Reply {
        let key = key.clone();
        self.answer(node, h, |n, now, out| n.read(now, h, key, out))
    }

    /// Runs a read made for a write on `node` to its answer.
    fn read_for_write(&mut self, node: u64, h: u64, key: &Key) -> Reply {
        let key = key.clone();
        self.answer(node, h, |n, now, out| n.read_for_write(now, h, key, out))
    }

    /// Abandons transaction `h` of `node` and delivers what that sends.
    fn abort(&mut self, node: u64, h: u64) {
        let mut acts = Vec::new();
        let now = self.now;
        self.node(node).abort(now, h, &mut acts);
        self.absorb(node, acts);
        self.settle();
    }

    fn commit(&mut self, node: u64, h: u64, writes: Vec<(Key, Option<Vec<u8>>)>) -> Reply {
        self.answer(node, h, |n, now, out| n.commit(now, h, writes, out))
    }

    /// A whole transaction on `node`: read every key, write `value` to each.
    fn write_all(&mut self, node: u64, h: u64, keys: &[Key], value: u8) -> Reply {
        self.node(node).begin(h);
        for k in keys {
            if let r @ Reply::Read(Err(_)) = self.read(node, h, k) {
                return r;
            }
        }
        let writes = keys
            .iter()
            .map(|k| (k.clone(), Some(vec![value])))
            .collect();
        self.commit(node, h, writes)
    }

    fn owners(&self, key: &Key) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.objects().get(key).is_some_and(|h| h.version > 0))
            .map(TfaNode::id)
            .collect()
    }

    fn locks(&self) -> usize {
        self.nodes.iter().map(|n| n.objects().locks_held()).sum()
    }
}

fn read_value(net: &mut Net, node: u64, h: u64, key: &Key) -> Option<Vec<u8>> {
    net.node(node).begin(h);
    match net.read(node, h, key) {
        Reply::Read(Ok(v)) => {
            net.abort(node, h);
            v
        }
        other => panic!("read failed: {other:?}"),
    }
}

/// Node 2 owns `k`; node 1 reads it and sends its commit (the lock request is queued, not yet
/// delivered), as transaction handle 2.
fn commit_pending(net: &mut Net, k: &Key) {
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(k), 1),
        Reply::Commit(Ok(()))
    );
    net.node(1).begin(2);
    assert!(matches!(net.read(1, 2, k), Reply::Read(Ok(_))));
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1)
        .commit(now, 2, vec![(k.clone(), Some(vec![9]))], &mut acts);
    net.absorb(1, acts);
}

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

/// Counts the queued messages whose body `is`.
fn queued(net: &Net, is: impl Fn(&Body) -> bool) -> usize {
    net.queue.iter().filter(|(_, _, m)| is(&m.body)).count()
}

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
