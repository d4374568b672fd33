//! A replica applies an entry (and so lets its local readers see it) only once the entry is on
//! its own disk: Raft counts a leader as holding what it has only queued for writing, so an
//! entry that one follower acknowledged is "committed" while the leader's copy may still be
//! lost in a crash, and an election can then replace it.
//!
//! Three replicas stepped by hand over an in-memory network; the leader's disk confirms
//! nothing until the test says so. Also here: what a replica keeps of requests that never run.

use std::collections::VecDeque;

use atomos_order::{
    Command, Input, OrderMsg, PlantedBug, Register, RegisterOp, Replica, ReplicaConfig, Request,
};
use atomos_seam::{Machine, Output};

struct Cluster {
    replicas: Vec<Replica<Register>>,
    /// Writes each replica emitted.
    written: Vec<u64>,
    /// The replica whose disk confirms nothing for now.
    stalled: Option<u64>,
    /// The replica no Raft message reaches for now (its peers' batches and acknowledgements
    /// still do).
    deaf: Option<u64>,
    queue: VecDeque<(u64, u64, OrderMsg)>,
}

impl Cluster {
    fn new(bug: Option<PlantedBug>) -> Cluster {
        Cluster::with(bug, ReplicaConfig::new(1, vec![1, 2, 3]).snapshot_every)
    }

    /// Replicas snapshotting (and compacting their logs) every `snapshot_every` entries.
    fn with(bug: Option<PlantedBug>, snapshot_every: u64) -> Cluster {
        let replicas = (1..=3)
            .map(|id| {
                let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3]);
                cfg.planted_bug = bug;
                cfg.snapshot_every = snapshot_every;
                Replica::open(cfg, Vec::new(), Register::new()).expect("opens")
            })
            .collect();
        Cluster {
            replicas,
            written: vec![0; 3],
            stalled: None,
            deaf: None,
            queue: VecDeque::new(),
        }
    }

    fn replica(&self, id: u64) -> &Replica<Register> {
        &self.replicas[id as usize - 1]
    }

    /// Steps replica `id`; what it sends is queued, and its writes are confirmed at once
    /// unless its disk is stalled.
    fn step(&mut self, id: u64, input: Input) {
        let i = id as usize - 1;
        let mut out = Vec::new();
        self.replicas[i].step(0, input, &mut out).expect("steps");
        let mut wrote = false;
        for o in out {
            match o {
                Output::Send { to, msg } if (1..=3).contains(&to) => {
                    self.queue.push_back((id, to, msg))
                }
                Output::Persist(_) => {
                    self.written[i] += 1;
                    wrote = true;
                }
                _ => {}
            }
        }
        if wrote && self.stalled != Some(id) {
            let through = self.written[i];
            self.step(id, Input::Persisted { through });
        }
    }

    fn pump(&mut self) {
        while let Some((from, to, msg)) = self.queue.pop_front() {
            if self.deaf != Some(to) || !matches!(msg, OrderMsg::Raft(_)) {
                self.step(to, Input::Message { from, msg });
            }
        }
    }

    /// Ticks replica 1 until it leads.
    fn elect_1(&mut self) {
        for _ in 0..200 {
            if self.replica(1).is_leader() {
                return;
            }
            self.step(1, Input::Tick);
            self.pump();
        }
        panic!("replica 1 never led: {}", self.replica(1).describe());
    }

    /// Orders one append to register `k` through replica 1.
    fn submit(&mut self) {
        self.submit_numbered(&[1]);
    }

    /// Orders appends of client 100 numbered `seqs`, in this order, in one batch of replica 1.
    fn submit_numbered(&mut self, seqs: &[u64]) {
        self.submit_through(1, 100, seqs);
    }

    /// Orders appends of `client` numbered `seqs`, in this order, in one batch of replica
    /// `via`.
    fn submit_through(&mut self, via: u64, client: u64, seqs: &[u64]) {
        self.send_requests(via, client, seqs);
        for _ in 0..5 {
            for id in 1..=3 {
                self.step(id, Input::Tick);
            }
            self.pump();
        }
    }

    /// Hands `client`'s requests `seqs` to replica `via`, seals its batch and delivers what
    /// follows.
    fn send_requests(&mut self, via: u64, client: u64, seqs: &[u64]) {
        for &seq in seqs {
            let request = Request {
                client,
                seq,
                payload: RegisterOp::Append {
                    key: "k".into(),
                    value: vec![7],
                }
                .encode(),
                deadline_ms: atomos_order::NO_DEADLINE,
            };
            self.step(
                via,
                Input::Message {
                    from: client,
                    msg: OrderMsg::Request(request),
                },
            );
        }
        self.step(via, Input::Request(Command::Flush));
        self.pump();
    }
}

#[test]
fn a_leader_applies_nothing_its_own_disk_does_not_hold() {
    let mut c = Cluster::new(None);
    c.elect_1();
    c.stalled = Some(1);
    c.submit();
    // The followers hold the entry and the leader knows it committed...
    assert_eq!(c.replica(2).machine().get("k"), Some(&[7u8][..]));
    // ...but its own write of it is not durable: its readers must not see it yet.
    assert_eq!(
        c.replica(1).machine().get("k"),
        None,
        "{}",
        c.replica(1).describe()
    );
    c.stalled = None;
    let through = c.written[0];
    c.step(1, Input::Persisted { through });
    assert_eq!(c.replica(1).machine().get("k"), Some(&[7u8][..]));
}

/// The same run with the check removed: the leader applies what only a follower's disk holds.
#[test]
fn the_planted_bug_applies_before_the_leader_s_disk_holds_it() {
    let mut c = Cluster::new(Some(PlantedBug::ApplyBeforeDurable));
    c.elect_1();
    c.stalled = Some(1);
    c.submit();
    assert_eq!(c.replica(1).machine().get("k"), Some(&[7u8][..]));
}

/// A request ordered after a higher-numbered one of its client never runs; the replica that
/// batched it forgets it once its batch is delivered, instead of keeping it forever.
#[test]
fn requests_that_never_run_leave_no_bookkeeping_behind() {
    let mut c = Cluster::new(None);
    c.elect_1();
    c.submit_numbered(&[7, 5, 6, 8]);
    // 7 and 8 ran; 5 and 6 came after 7 and never run.
    assert_eq!(c.replica(1).machine().get("k"), Some(&[7u8, 7][..]));
    assert_eq!(c.replica(1).requests_in_flight(), 0);
}

/// A replica whose batch the others ordered while it heard no Raft message, and who then
/// installs a snapshot covering it, forgets the batch's requests too.
#[test]
fn requests_a_snapshot_covers_leave_no_bookkeeping_behind() {
    let mut c = Cluster::with(None, 2);
    c.elect_1();
    c.deaf = Some(3);
    // Replica 3 batches client 200's request; 1 and 2 acknowledge and order it.
    c.send_requests(3, 200, &[1]);
    // More entries, so that 1 and 2 snapshot and compact past what 3 holds.
    for seq in 1..=6 {
        c.submit_through(1, 100, &[seq]);
    }
    assert_eq!(c.replica(1).machine().get("k").map(<[u8]>::len), Some(7));
    c.deaf = None;
    for _ in 0..300 {
        if c.replica(3).stats().snapshots_installed > 0 {
            break;
        }
        for id in 1..=3 {
            c.step(id, Input::Tick);
        }
        c.pump();
    }
    assert!(
        c.replica(3).stats().snapshots_installed > 0,
        "{}",
        c.replica(3).describe()
    );
    assert_eq!(c.replica(3).machine().get("k").map(<[u8]>::len), Some(7));
    assert_eq!(c.replica(3).requests_in_flight(), 0);
}
