//! The simulator on a small state machine of our own: a counter replicated from a fixed leader
//! to followers, where the leader acknowledges an increment once a majority has persisted it.
//! The property: every acknowledged increment is in the durable log of a majority (read from
//! the simulated disks at the end), whatever the faults, the disks' included. A planted bug
//! (followers emit their acknowledgement before the write, so it is not held back until the
//! write is durable) must be caught.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-sim --test counter`.

use std::collections::{BTreeMap, BTreeSet};

use atomos_sim::{
    check_seeds, first_caught, Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig,
    Write,
};

const LEADER: NodeId = 1;
const NODES: usize = 3;

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
    /// The log of increment ids, in sequence order (each one written to disk as it is added).
    log: Vec<u64>,
    /// Leader: who acknowledged each unacknowledged sequence number.
    acks: BTreeMap<usize, BTreeSet<NodeId>>,
    /// Leader: sequence numbers already acknowledged to clients.
    done: BTreeSet<usize>,
    /// The planted bug: acknowledge before writing.
    ack_before_persist: bool,
}

fn record(id: u64) -> Vec<u8> {
    id.to_be_bytes().to_vec()
}

fn decode(log: &[Vec<u8>]) -> Result<Vec<u64>, String> {
    log.iter()
        .map(|r| {
            <[u8; 8]>::try_from(r.as_slice())
                .map(u64::from_be_bytes)
                .map_err(|_| format!("a record of {} bytes", r.len()))
        })
        .collect()
}

impl Counter {
    /// A node rebuilt from its disk.
    fn boot(boot: Boot, ack_before_persist: bool) -> Result<Counter, String> {
        let log = decode(&boot.log)?;
        let mut c = Counter {
            me: boot.node,
            acks: BTreeMap::new(),
            done: BTreeSet::new(),
            ack_before_persist,
            log,
        };
        if c.me == LEADER {
            // Everything not known acknowledged is counted again.
            for seq in 0..c.log.len() {
                c.acks.entry(seq).or_default().insert(c.me);
            }
        }
        Ok(c)
    }

    fn replicate(&self, seq: usize, out: &mut Vec<Output<Msg, Note>>) {
        for to in (1..=NODES as NodeId).filter(|&n| n != self.me) {
            out.push(Output::Send {
                to,
                msg: Msg::Replicate {
                    seq,
                    id: self.log[seq],
                },
            });
        }
    }
}

impl Machine for Counter {
    type Msg = Msg;
    type Request = u64;
    type Delivery = Note;
    type Error = String;

    fn step(
        &mut self,
        _now: u64,
        input: Input<Msg, u64>,
        out: &mut Vec<Output<Msg, Note>>,
    ) -> Result<(), String> {
        match input {
            Input::Request(id) if self.me == LEADER => {
                let seq = self.log.len();
                self.log.push(id);
                out.push(Output::Persist(Write::Append(vec![record(id).into()])));
                self.acks.entry(seq).or_default().insert(self.me);
                self.replicate(seq, out);
            }
            Input::Message {
                from,
                msg: Msg::Replicate { seq, id },
            } => {
                let ack = Output::Send {
                    to: from,
                    msg: Msg::Ack { seq },
                };
                if seq == self.log.len() {
                    self.log.push(id);
                    let write = Output::Persist(Write::Append(vec![record(id).into()]));
                    if self.ack_before_persist {
                        out.extend([ack, write]);
                    } else {
                        // The seam holds the acknowledgement back until the write is durable.
                        out.extend([write, ack]);
                    }
                } else if seq < self.log.len() {
                    out.push(ack);
                }
            }
            Input::Message {
                from,
                msg: Msg::Ack { seq },
            } => {
                if self.done.contains(&seq) {
                    return Ok(());
                }
                let acks = self.acks.entry(seq).or_default();
                acks.insert(from);
                if acks.len() > NODES / 2 {
                    self.acks.remove(&seq);
                    self.done.insert(seq);
                    out.push(Output::Deliver(Note::Acked(self.log[seq])));
                }
            }
            Input::Tick if self.me == LEADER => {
                // The leader retransmits what is not acknowledged.
                let open: Vec<usize> = self.acks.keys().copied().collect();
                for seq in open {
                    self.replicate(seq, out);
                }
            }
            Input::Request(_) | Input::Tick | Input::Persisted { .. } => {}
        }
        Ok(())
    }
}

fn simulate(seed: u64, buggy: bool) -> (Run<Note>, Vec<Vec<u64>>) {
    let cfg = SimConfig {
        seed,
        nodes: NODES,
        crashable: NODES,
        tick_every: 10,
        fault_until: 3_000,
        settle: 2_000,
        faults: Faults::harsh(),
    };
    let mut sim = Sim::new(cfg, move |boot| Counter::boot(boot, buggy));
    for i in 0..100u64 {
        sim.request_at(i * 25, LEADER, 1_000 + i);
    }
    let run = sim.run();
    let logs = (1..=NODES as NodeId)
        .map(|n| decode(&sim.disk(n)).unwrap_or_default())
        .collect();
    (run, logs)
}

/// Every acknowledged increment is persisted on a majority.
fn check(run: &Run<Note>, logs: &[Vec<u64>]) -> Result<(), String> {
    let majority = logs.len() / 2 + 1;
    if let Some((t, node, e)) = run.failures.first() {
        return Err(format!("node {node} failed at {t}: {e}"));
    }
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
    first_caught("acknowledging before persisting", 200, |seed| {
        let (run, logs) = simulate(seed, true);
        check(&run, &logs)
    });
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
    let torn: usize = (0..50).map(|seed| simulate(seed, false).0.torn).sum();
    assert!(torn > 0, "no crash ever tore a write");
}
