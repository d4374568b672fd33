//! A simulated node: a TFA node with the application that runs the transaction programs on
//! it (attempts, back-offs, answers), its timing, and one simulated run of a cluster of them.

use std::collections::BTreeMap;

use atomos_core::history::list_append::ListOp;
use atomos_core::Key;
use atomos_protocols::tfa::{self, Action, Failure, PlantedBug, Reply, TfaConfig, TfaMsg, TfaNode};
use atomos_sim::workload::{BankWorkload, ListAppendTxn, ListAppendWorkload};
use atomos_sim::{Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng};

use super::*;

pub(crate) struct Running {
    pub(crate) txn: Txn,
    pub(crate) attempt: u32,
    pub(crate) seen: BTreeMap<Key, Option<Vec<u8>>>,
    pub(crate) answer: Option<Answer>,
    /// Waiting out a back-off before the next attempt.
    pub(crate) restart_at: Option<u64>,
}

/// A simulated node: a TFA node and the transaction programs its application runs.
pub(crate) struct SimNode {
    pub(crate) me: NodeId,
    pub(crate) tfa: TfaNode,
    pub(crate) running: BTreeMap<u64, Running>,
    /// Families holding abstract locks, by handle.
    pub(crate) holding: BTreeMap<u64, Holding>,
    pub(crate) rng: SimRng,
}

impl SimNode {
    /// A node (re)started: it reads its home records back from its log and starts without
    /// objects, under a new incarnation.
    pub(crate) fn boot(
        boot: Boot,
        nodes: usize,
        cfg: TfaConfig,
        seed: u64,
    ) -> Result<SimNode, String> {
        let me = boot.node;
        let members = (1..=nodes as u64).collect();
        let tfa = TfaNode::open(me, members, boot.incarnation, cfg, &boot.log)
            .map_err(|e| e.to_string())?;
        Ok(SimNode {
            me,
            tfa,
            running: BTreeMap::new(),
            holding: BTreeMap::new(),
            rng: SimRng::new(seed ^ (me * 0x9e37) ^ (boot.incarnation << 40)),
        })
    }

    /// Moves transaction `h` on: its next read, or its commit.
    pub(crate) fn advance(
        &mut self,
        now: u64,
        h: u64,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        let Some(r) = self.running.get_mut(&h) else {
            return;
        };
        match program(&r.txn, &r.seen) {
            Next::Read(key) if reads_to_write(&r.txn, &key) => {
                self.tfa.read_for_write(now, h, key, acts)
            }
            Next::Read(key) => self.tfa.read(now, h, key, acts),
            Next::Commit { writes, answer } => {
                r.answer = Some(answer);
                self.tfa.commit(now, h, writes, acts)
            }
            Next::NotYet if r.attempt >= MAX_ATTEMPTS => {
                self.tfa.abort(now, h, acts);
                let id = r.txn.id();
                self.running.remove(&h);
                out.push(Output::Deliver(Note::NeverCreated { id }));
            }
            Next::NotYet => {
                self.tfa.abort(now, h, acts);
                r.restart_at = Some(now + 50);
            }
        }
    }

    pub(crate) fn start_attempt(
        &mut self,
        now: u64,
        h: u64,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        if let Some(r) = self.running.get_mut(&h) {
            r.attempt += 1;
            r.seen.clear();
            r.answer = None;
            r.restart_at = None;
            self.tfa.begin(h);
            self.advance(now, h, acts, out);
        }
    }

    /// Applies the node's actions; answers to transactions move their programs on, which may
    /// produce more actions.
    pub(crate) fn drive(
        &mut self,
        now: u64,
        mut acts: Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        while !acts.is_empty() {
            let mut next = Vec::new();
            for a in acts {
                match a {
                    Output::Send { to, msg } => out.push(Output::Send { to, msg }),
                    Output::Warn(w) => out.push(Output::Warn(w)),
                    Output::Deliver(tfa::Answer { h, reply }) => {
                        self.answer(now, h, reply, &mut next, out)
                    }
                    Output::Persist(w) => out.push(Output::Persist(w)),
                }
            }
            acts = next;
        }
    }

    pub(crate) fn answer(
        &mut self,
        now: u64,
        h: u64,
        reply: Reply,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
        if self.holding.contains_key(&h) {
            let answer = match reply {
                Reply::Abstract(a) => a,
                Reply::Read(Err(f)) | Reply::Commit(Err(f)) => Err(f),
                Reply::Read(Ok(_)) | Reply::Commit(Ok(())) => {
                    unreachable!("a family reads and commits nothing")
                }
            };
            return self.on_hold_answer(now, h, answer, acts, out);
        }
        let result = match reply {
            Reply::Read(Ok(value)) => {
                let Some(r) = self.running.get_mut(&h) else {
                    return;
                };
                let key = match program(&r.txn, &r.seen) {
                    Next::Read(key) => key,
                    _ => unreachable!("a read was outstanding"),
                };
                r.seen.insert(key, value);
                return self.advance(now, h, acts, out);
            }
            Reply::Read(Err(f)) | Reply::Commit(Err(f)) => Err(f),
            Reply::Commit(Ok(())) => Ok(()),
            Reply::Abstract(_) => unreachable!("the programs take no abstract locks"),
        };
        let Some(r) = self.running.get_mut(&h) else {
            return;
        };
        if std::env::var("DEBUG_TFA").is_ok() {
            eprintln!(
                "t={now} node={} h={h} attempt={} {:?}",
                self.me, r.attempt, result
            );
        }
        match result {
            Ok(()) => {
                let r = self.running.remove(&h).expect("present");
                out.push(Output::Deliver(Note::Committed {
                    id: r.txn.id(),
                    answer: r.answer.expect("set at commit"),
                }));
            }
            Err(Failure::Stale(_)) if r.attempt < MAX_ATTEMPTS => {
                // The programs have no nested blocks: the whole attempt goes.
                self.tfa.abort(now, h, acts);
                let backoff = 1 + self.rng.below(10 * u64::from(r.attempt.min(8)));
                r.restart_at = Some(now + backoff);
            }
            Err(Failure::Conflict(_)) if r.attempt < MAX_ATTEMPTS => {
                let backoff = 1 + self.rng.below(10 * u64::from(r.attempt.min(8)));
                r.restart_at = Some(now + backoff);
            }
            Err(failure) => {
                let r = self.running.remove(&h).expect("present");
                out.push(Output::Deliver(Note::Failed {
                    id: r.txn.id(),
                    failure,
                }));
            }
        }
    }
}

impl Machine for SimNode {
    type Msg = TfaMsg;
    type Request = Txn;
    type Delivery = Note;
    type Error = String;

    fn step(
        &mut self,
        now: u64,
        input: Input<TfaMsg, Txn>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) -> Result<(), String> {
        let mut acts = Vec::new();
        match input {
            Input::Persisted { .. } => {}
            Input::Request(Txn::Exclusive(ex)) => self.start_exclusive(now, ex, &mut acts, out),
            Input::Request(txn) => {
                let h = txn.id();
                self.running.insert(
                    h,
                    Running {
                        txn,
                        attempt: 0,
                        seen: BTreeMap::new(),
                        answer: None,
                        restart_at: None,
                    },
                );
                self.start_attempt(now, h, &mut acts, out);
            }
            Input::Message { from, msg } => self.tfa.on_message(now, from, msg, &mut acts),
            Input::Tick => {
                self.tfa.tick(now, &mut acts);
                let due: Vec<u64> = self
                    .running
                    .iter()
                    .filter(|(_, r)| r.restart_at.is_some_and(|t| t <= now))
                    .map(|(&h, _)| h)
                    .collect();
                for h in due {
                    self.start_attempt(now, h, &mut acts, out);
                }
                self.hold_tick(now, &mut acts, out);
            }
        }
        self.drive(now, acts, out);
        Ok(())
    }
}

/// Timing in simulated time units (ticks every 10): re-send after 40, give up after 1,500 (a
/// partition lasts 200, a crashed node stays down 100), ask about a lock after 100, give a
/// lock up after 1,000 without an answer; reads for writes take no locks for 1,000 after a
/// transaction met one (about 20 round trips; the default is 100 ms, a few hundred).
pub(crate) fn sim_tfa_config() -> TfaConfig {
    TfaConfig {
        lease: 100,
        abandon: 1_000,
        resend: 40,
        request_timeout: 1_500,
        max_hops: 16,
        busy_delay: 10,
        busy_retries: 3,
        lock_writes_at_read: true,
        contention_quiet: 1000,
        forward_reads: true,
        planted_bug: None,
    }
}

pub(crate) struct Outcome {
    pub(crate) nodes: usize,
    pub(crate) run: Run<Note>,
    pub(crate) submitted: Vec<ListAppendTxn>,
    pub(crate) end: Result<Final, String>,
}

pub(crate) fn simulate(
    seed: u64,
    nodes: usize,
    faults: Faults,
    bug: Option<PlantedBug>,
) -> Outcome {
    let cfg = SimConfig {
        seed,
        nodes,
        crashable: nodes,
        tick_every: 10,
        fault_until: 3_000,
        settle: 12_000,
        faults,
    };
    let mut sim = Sim::new(cfg, move |boot| {
        let cfg = TfaConfig {
            planted_bug: bug,
            // One seed in four reads without locking, as a node configured so does.
            lock_writes_at_read: seed % 4 != 3,
            // One seed in three answers reads of objects elsewhere with redirects.
            forward_reads: seed % 3 != 2,
            ..sim_tfa_config()
        };
        SimNode::boot(boot, nodes, cfg, seed)
    });
    let mut rng = SimRng::new(seed ^ 0x7fa);
    let mut lists = ListAppendWorkload::new(LIST_KEYS, 4, 0.5);
    let bank = BankWorkload {
        accounts: ACCOUNTS,
        max_amount: 30,
        audit_ratio: 0.2,
    };
    sim.request_at(0, 1, Txn::Setup);
    let mut submitted = Vec::new();
    for i in 0..200u64 {
        let at = 100 + i * 15 + rng.below(15);
        let node = 1 + rng.below(nodes as u64);
        let txn = if rng.chance(0.5) {
            let t = lists.next(&mut rng);
            submitted.push(t.clone());
            Txn::Lists(t)
        } else {
            Txn::Bank {
                id: 1_000_000 + i,
                op: bank.next(&mut rng),
            }
        };
        sim.request_at(at, node, txn);
    }
    // Families holding abstract locks, contending for a few names (drawn apart, so the other
    // programs are what they were without them).
    let mut holders = SimRng::new(seed ^ 0xab5);
    for i in 0..60u64 {
        let at = 100 + i * 45 + holders.below(45);
        let node = 1 + holders.below(nodes as u64);
        let first = holders.below(LOCK_NAMES);
        let mut names = vec![lock_name(first)];
        if holders.chance(0.7) {
            names.push(lock_name(
                (first + 1 + holders.below(LOCK_NAMES - 1)) % LOCK_NAMES,
            ));
        }
        let ex = Exclusive {
            id: HOLDERS + i,
            names,
            // One family in ten holds longer than the abandon time (1,000).
            hold: if holders.chance(0.1) {
                1_200 + holders.below(1_300)
            } else {
                20 + holders.below(280)
            },
            give_back: holders.chance(0.6),
        };
        sim.request_at(at, node, Txn::Exclusive(ex));
    }
    // Once the faults are over and every node is back: read every list.
    for key in 0..LIST_KEYS {
        let t = ListAppendTxn {
            id: FINAL_READ + key,
            ops: vec![ListOp::Read { key, seen: vec![] }],
        };
        submitted.push(t.clone());
        sim.request_at(final_read_at(key), 1 + key % nodes as u64, Txn::Lists(t));
    }
    let run = sim.run();
    let machines: Vec<&SimNode> = (1..=nodes as NodeId)
        .filter_map(|n| sim.machine(n))
        .collect();
    let end = final_state(&machines);
    if std::env::var("DEBUG_TFA").is_ok() {
        let pat = std::env::var("DEBUG_TFA").unwrap_or_default();
        for l in run.trace.iter().filter(|l| {
            l.contains("crash") || l.contains("start") || (!pat.is_empty() && l.contains(&pat))
        }) {
            eprintln!("{l}");
        }
        let keys = (0..LIST_KEYS).map(list).chain((0..ACCOUNTS).map(account));
        for key in keys {
            for m in &machines {
                eprintln!("{}", m.tfa.describe_key(&key));
            }
        }
    }
    Outcome {
        nodes,
        run,
        submitted,
        end,
    }
}
