//! The workload generators and the cross-node history checker on a small transactional store of
//! our own: node 0 is the primary and executes every transaction; the other nodes forward their
//! clients' transactions to it, re-send them until answered, and report the results. The
//! primary's data and its record of executed transactions are persisted.
//!
//! Properties, under loss, duplication, reordering, partitions and crashes: the list-append
//! history recorded on all nodes is serializable; every audit and the final state conserve the
//! bank's money. A planted bug (the primary forgets which transactions it already executed, so a
//! re-sent transaction runs twice) must be caught.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-sim --test store`.

use std::collections::BTreeMap;

use atomos_core::history::list_append::{self, ListOp};
use atomos_sim::workload::{self, BankOp, BankWorkload, ListAppendTxn, ListAppendWorkload};
use atomos_sim::{
    check_seeds, first_caught, Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig,
    SimRng, Write,
};
use serde::{Deserialize, Serialize};

const PRIMARY: NodeId = 1;
const NODES: usize = 3;
const ACCOUNTS: u64 = 8;
const INITIAL: i64 = 100;
/// Time units a forwarded transaction waits for its answer before it is re-sent.
const RESEND_AFTER: u64 = 60;

#[derive(Clone, Debug, Serialize, Deserialize)]
enum Txn {
    Lists(ListAppendTxn),
    Bank { id: u64, op: BankOp },
}

impl Txn {
    fn id(&self) -> u64 {
        match self {
            Txn::Lists(t) => t.id,
            Txn::Bank { id, .. } => *id,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Lists(Vec<ListOp>),
    Transfer { done: bool },
    Audit(Vec<i64>),
}

#[derive(Clone, Debug)]
enum Msg {
    Forward { txn: Txn },
    Done { id: u64, answer: Answer },
}

#[derive(Clone, Debug)]
struct Note {
    id: u64,
    answer: Answer,
}

/// The primary's state: rebuilt at boot by executing again the transactions its disk holds (it
/// writes each one it executes before answering).
#[derive(Default)]
struct Persisted {
    lists: BTreeMap<u64, Vec<u64>>,
    balances: Vec<i64>,
    executed: BTreeMap<u64, Answer>,
}

struct Store {
    me: NodeId,
    persisted: Persisted,
    /// Volatile: forwarded transactions awaiting their answer, with when they were last sent.
    waiting: BTreeMap<u64, (Txn, u64)>,
    /// The planted bug: do not remember executed transactions.
    forgetful: bool,
}

impl Store {
    fn boot(boot: Boot, forgetful: bool) -> Result<Store, String> {
        let mut store = Store {
            me: boot.node,
            persisted: Persisted {
                balances: vec![INITIAL; ACCOUNTS as usize],
                ..Persisted::default()
            },
            waiting: BTreeMap::new(),
            forgetful,
        };
        for r in &boot.log {
            let txn: Txn = postcard::from_bytes(r).map_err(|e| e.to_string())?;
            store.apply(&txn);
        }
        Ok(store)
    }

    /// Executes `txn` (or answers it again) and writes it to disk before anything that
    /// follows goes out.
    fn execute(&mut self, txn: &Txn, out: &mut Vec<Output<Msg, Note>>) -> Answer {
        if !self.forgetful {
            if let Some(answer) = self.persisted.executed.get(&txn.id()) {
                return answer.clone();
            }
        }
        let record = postcard::to_stdvec(txn).unwrap_or_default();
        out.push(Output::Persist(Write::Append(vec![record.into()])));
        self.apply(txn)
    }

    fn apply(&mut self, txn: &Txn) -> Answer {
        let p = &mut self.persisted;
        let answer = match txn {
            Txn::Lists(t) => Answer::Lists(
                t.ops
                    .iter()
                    .map(|op| match op {
                        ListOp::Read { key, .. } => ListOp::Read {
                            key: *key,
                            seen: p.lists.get(key).cloned().unwrap_or_default(),
                        },
                        ListOp::Append { key, value } => {
                            p.lists.entry(*key).or_default().push(*value);
                            op.clone()
                        }
                    })
                    .collect(),
            ),
            Txn::Bank {
                op: BankOp::Transfer { from, to, amount },
                ..
            } => {
                let (from, to, amount) = (*from as usize, *to as usize, *amount as i64);
                let done = p.balances[from] >= amount;
                if done {
                    p.balances[from] -= amount;
                    p.balances[to] += amount;
                }
                Answer::Transfer { done }
            }
            Txn::Bank {
                op: BankOp::Audit, ..
            } => Answer::Audit(p.balances.clone()),
        };
        p.executed.insert(txn.id(), answer.clone());
        answer
    }
}

impl Machine for Store {
    type Msg = Msg;
    type Request = Txn;
    type Delivery = Note;
    type Error = String;

    fn step(
        &mut self,
        now: u64,
        input: Input<Msg, Txn>,
        out: &mut Vec<Output<Msg, Note>>,
    ) -> Result<(), String> {
        match input {
            Input::Persisted { .. } => {}
            Input::Request(txn) if self.me == PRIMARY => {
                let answer = self.execute(&txn, out);
                out.push(Output::Deliver(Note {
                    id: txn.id(),
                    answer,
                }));
            }
            Input::Request(txn) => {
                out.push(Output::Send {
                    to: PRIMARY,
                    msg: Msg::Forward { txn: txn.clone() },
                });
                self.waiting.insert(txn.id(), (txn, now));
            }
            Input::Message {
                from,
                msg: Msg::Forward { txn },
            } => {
                let answer = self.execute(&txn, out);
                out.push(Output::Send {
                    to: from,
                    msg: Msg::Done {
                        id: txn.id(),
                        answer,
                    },
                });
            }
            Input::Message {
                msg: Msg::Done { id, answer },
                ..
            } => {
                if self.waiting.remove(&id).is_some() {
                    out.push(Output::Deliver(Note { id, answer }));
                }
            }
            Input::Tick => {
                for (txn, sent) in self.waiting.values_mut() {
                    if now - *sent >= RESEND_AFTER {
                        *sent = now;
                        out.push(Output::Send {
                            to: PRIMARY,
                            msg: Msg::Forward { txn: txn.clone() },
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

struct Outcome {
    run: Run<Note>,
    submitted: Vec<ListAppendTxn>,
    final_balances: Vec<i64>,
}

fn simulate(seed: u64, forgetful: bool) -> Outcome {
    let cfg = SimConfig {
        seed,
        nodes: NODES,
        crashable: NODES,
        tick_every: 10,
        fault_until: 3_000,
        settle: 2_000,
        faults: Faults::harsh(),
    };
    let mut sim = Sim::new(cfg, move |boot| Store::boot(boot, forgetful));
    // The workload comes from its own generator seeded by the run's seed.
    let mut rng = SimRng::new(seed ^ 0x5eed);
    let mut lists = ListAppendWorkload::new(4, 4, 0.5);
    let bank = BankWorkload {
        accounts: ACCOUNTS,
        max_amount: 30,
        audit_ratio: 0.2,
    };
    let mut submitted = Vec::new();
    for i in 0..150u64 {
        let at = i * 20 + rng.below(20);
        let node = 1 + rng.below(NODES as u64) as NodeId;
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
    let run = sim.run();
    let final_balances = sim
        .machine(PRIMARY)
        .map(|p| p.persisted.balances.clone())
        .unwrap_or_default();
    Outcome {
        run,
        submitted,
        final_balances,
    }
}

fn check(o: &Outcome) -> Result<(), String> {
    let done = o
        .run
        .notes
        .iter()
        .filter_map(|(_, node, n)| match &n.answer {
            Answer::Lists(ops) => Some((*node, n.id, ops.clone())),
            _ => None,
        });
    let history = workload::list_history(&o.submitted, done);
    list_append::check(&history).map_err(|e| e.to_string())?;
    let total = INITIAL * ACCOUNTS as i64;
    for (t, node, n) in &o.run.notes {
        if let Answer::Audit(b) = &n.answer {
            if b.iter().sum::<i64>() != total {
                return Err(format!("audit at {t} on node {node} saw {b:?}"));
            }
        }
    }
    if o.final_balances.iter().sum::<i64>() != total {
        return Err(format!("final balances {:?}", o.final_balances));
    }
    Ok(())
}

#[test]
fn histories_from_all_nodes_are_serializable_under_faults() {
    check_seeds(100, "-p atomos-sim --test store", |seed| {
        let o = simulate(seed, false);
        check(&o)?;
        let reported = o.run.notes.len();
        if reported < 50 {
            return Err(format!("only {reported} of 150 transactions reported"));
        }
        Ok(())
    });
}

#[test]
fn executing_a_resent_transaction_twice_is_caught() {
    first_caught("re-executing re-sent transactions", 100, |seed| {
        check(&simulate(seed, true))
    });
}
