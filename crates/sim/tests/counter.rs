//! The simulator on a small state machine of our own: a counter replicated from a fixed leader
//! to followers, where the leader acknowledges an increment once a majority has persisted it.
//! The property: every acknowledged increment is in the persisted log of a majority, whatever
//! the faults. A planted bug (followers acknowledge before persisting) must be caught.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-sim --test counter`.

use std::collections::{BTreeMap, BTreeSet};

use atomos_sim::{check_seeds, seeds, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig};

const LEADER: NodeId = 0;

#[derive(Clone, Debug, PartialEq)]
enum Msg {
    Replicate { seq: usize, id: u64 },
    Ack { seq: usize },
}

#[derive(Clone, Debug, PartialEq)]
enum Note {
    Acked(u64),
}

struct Counter {
    me: NodeId,
    nodes: usize,
    /// Persisted: the log of increment ids, in sequence order.
    log: Vec<u64>,
    /// Volatile (leader): who acknowledged each unacknowledged sequence number.
    acks: BTreeMap<usize, BTreeSet<NodeId>>,
    /// Volatile (leader): sequence numbers already acknowledged to clients.
    done: BTreeSet<usize>,
    /// Volatile (buggy follower): entries acknowledged but not yet persisted.
    pending: Vec<u64>,
    /// The planted bug: acknowledge before persisting.
    ack_before_persist: bool,
}

impl Counter {
    fn new(me: NodeId, nodes: usize, ack_before_persist: bool) -> Counter {
        Counter {
            me,
            nodes,
            log: Vec::new(),
            acks: BTreeMap::new(),
            done: BTreeSet::new(),
            pending: Vec::new(),
            ack_before_persist,
        }
    }

    fn majority(&self) -> usize {
        self.nodes / 2 + 1
    }

    fn replicate(&self, seq: usize, out: &mut Vec<Output<Msg, Note>>) {
        for to in (0..self.nodes).filter(|&n| n != self.me) {
            out.push(Output::Send {
                to,
                msg: Msg::Replicate {
                    seq,
                    id: self.log[seq],
                },
            });
        }
    }

    /// Entries a follower holds, persisted or (with the bug) not.
    fn held(&self) -> usize {
        self.log.len() + self.pending.len()
    }
}

impl Machine for Counter {
    type Msg = Msg;
    type Request = u64;
    type Note = Note;

    fn step(&mut self, _now: u64, input: Input<Msg, u64>, out: &mut Vec<Output<Msg, Note>>) {
        match input {
            Input::Start => {
                if self.me == LEADER {
                    // After a restart, everything not known acknowledged is counted again.
                    for seq in 0..self.log.len() {
                        if !self.done.contains(&seq) {
                            self.acks.entry(seq).or_default().insert(self.me);
                        }
                    }
                }
            }
            Input::Request(id) if self.me == LEADER => {
                let seq = self.log.len();
                self.log.push(id);
                self.acks.entry(seq).or_default().insert(self.me);
                self.replicate(seq, out);
            }
            Input::Request(_) => {}
            Input::Message {
                from,
                msg: Msg::Replicate { seq, id },
            } => {
                if seq == self.held() {
                    if self.ack_before_persist {
                        self.pending.push(id);
                    } else {
                        self.log.push(id);
                    }
                }
                if seq < self.held() {
                    out.push(Output::Send {
                        to: from,
                        msg: Msg::Ack { seq },
                    });
                }
            }
            Input::Message {
                from,
                msg: Msg::Ack { seq },
            } => {
                if self.done.contains(&seq) {
                    return;
                }
                let acks = self.acks.entry(seq).or_default();
                acks.insert(from);
                if acks.len() >= self.majority() {
                    self.acks.remove(&seq);
                    self.done.insert(seq);
                    out.push(Output::Note(Note::Acked(self.log[seq])));
                }
            }
            Input::Tick => {
                // Followers persist what they hold; the leader retransmits what is not acked.
                self.log.append(&mut self.pending);
                if self.me == LEADER {
                    let open: Vec<usize> = self.acks.keys().copied().collect();
                    for seq in open {
                        self.replicate(seq, out);
                    }
                }
            }
        }
    }

    fn crash(&mut self) {
        self.acks.clear();
        self.done.clear();
        self.pending.clear();
    }
}

fn simulate(seed: u64, buggy: bool) -> (Run<Note>, Vec<Vec<u64>>) {
    let nodes = 3;
    let cfg = SimConfig {
        seed,
        nodes,
        tick_every: 10,
        fault_until: 3_000,
        settle: 2_000,
        faults: Faults::harsh(),
    };
    let machines = (0..nodes)
        .map(|me| Counter::new(me, nodes, buggy))
        .collect();
    let mut sim = Sim::new(cfg, machines);
    for i in 0..100u64 {
        sim.request_at(i * 25, LEADER, 1_000 + i);
    }
    let run = sim.run();
    let logs = sim.machines().iter().map(|m| m.log.clone()).collect();
    (run, logs)
}

/// Every acknowledged increment is persisted on a majority.
fn check(run: &Run<Note>, logs: &[Vec<u64>]) -> Result<(), String> {
    let majority = logs.len() / 2 + 1;
    for (t, _, Note::Acked(id)) in &run.notes {
        let holders = logs.iter().filter(|l| l.contains(id)).count();
        if holders < majority {
            return Err(format!(
                "increment {id}, acknowledged at {t}, is persisted on {holders} of {} nodes",
                logs.len()
            ));
        }
    }
    Ok(())
}

#[test]
fn acknowledged_increments_survive_every_fault() {
    check_seeds(200, "-p atomos-sim --test counter", |seed| {
        let (run, logs) = simulate(seed, false);
        check(&run, &logs)?;
        if run.notes.is_empty() {
            return Err("nothing was acknowledged".into());
        }
        Ok(())
    });
}

#[test]
fn the_planted_bug_is_found() {
    let failing: Vec<u64> = seeds(200)
        .into_iter()
        .filter(|&seed| {
            let (run, logs) = simulate(seed, true);
            check(&run, &logs).is_err()
        })
        .collect();
    assert!(
        !failing.is_empty(),
        "acknowledging before persisting went unnoticed in 200 seeds"
    );
    println!(
        "the planted bug fails {} of 200 seeds, first {}",
        failing.len(),
        failing[0]
    );
}

#[test]
fn one_seed_gives_one_trace() {
    let (a, _) = simulate(42, false);
    let (b, _) = simulate(42, false);
    assert_eq!(a.trace, b.trace);
    let (c, _) = simulate(43, false);
    assert_ne!(a.trace, c.trace, "another seed, another run");
    assert!(
        a.trace.iter().any(|l| l.contains("crash")),
        "faults were injected"
    );
    assert!(a.trace.iter().any(|l| l.contains("lost")));
}
