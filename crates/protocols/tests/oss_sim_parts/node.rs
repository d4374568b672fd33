//! A simulated OSS node: the OSS machine with the application that runs list-append, bank and
//! node-local transactions over its engine, and what it notes.

use std::collections::BTreeMap;
use std::sync::Arc;

use atomos_core::history::list_append::ListOp;
use atomos_core::{Engine, EngineConfig, TxError, TxOptions};
use atomos_protocols::oss::{
    AbortReason, CommitMode, OssBug, OssConfig, OssDelivery, OssError, OssMsg, OssNode, OssRequest,
};
use atomos_sim::workload::bank_account as account;
use atomos_sim::workload::{
    bank_total, execute_list_ops_on, Capture, ListAppendTxn, ListAppendWorkload,
};
use atomos_sim::{Boot, Input, Machine, Output, SimRng};
use parking_lot::Mutex;

use super::*;

#[derive(Clone, Debug)]
pub(crate) enum Note {
    ListRun(ListAppendTxn),
    ListDone {
        id: u64,
        ops: Vec<ListOp>,
    },
    ListAborted {
        id: u64,
    },
    /// A local counter increment committed with this value.
    Counted(u64),
    /// A transfer committed.
    Transferred,
    Audit {
        total: i64,
    },
    Aborted,
    /// The node installed an image of a domain.
    Image,
}

/// What a commit in flight was.
pub(crate) enum Waiting {
    List(u64, Vec<ListOp>),
    Count(u64),
    Transfer,
}

pub(crate) struct Node {
    pub(crate) oss: OssNode,
    pub(crate) engine: Arc<Engine>,
    pub(crate) capture: Arc<Capture>,
    pub(crate) rng: SimRng,
    pub(crate) lists: ListAppendWorkload,
    pub(crate) origin: u64,
    pub(crate) started: u64,
    pub(crate) next_caller: u64,
    pub(crate) waiting: BTreeMap<u64, Waiting>,
    /// The most control-log proposals this node had in flight at once.
    pub(crate) control_in_flight_max: usize,
}

impl Node {
    pub(crate) fn boot(
        seed: u64,
        mode: CommitMode,
        bug: Option<OssBug>,
        history_max: usize,
        boot: Boot,
    ) -> Result<Node, String> {
        let members: Vec<u64> = (1..=NODES as u64).collect();
        let mut cfg = OssConfig::new(boot.node, members);
        cfg.commit = mode;
        // Lists in domain 0, accounts in a domain of their own.
        cfg.domains = vec![String::new(), "acct/".into()];
        cfg.replica.seed = seed.wrapping_mul(31).wrapping_add(boot.node) ^ (boot.incarnation << 32);
        cfg.replica.retry_ticks = 5;
        cfg.planted_bug = bug;
        cfg.history_max = history_max;
        // Compacted often: every run replays compacted logs after its crashes.
        cfg.compact_after = 25;
        // A node whose disk was wiped is restarted as an operator would: told so.
        cfg.rejoin = boot.wiped;
        cfg.replica.rejoin = boot.wiped;
        let engine = Arc::new(Engine::new(EngineConfig {
            replicated: true,
            ..EngineConfig::default()
        }));
        let capture = Arc::new(Capture::default());
        if !engine.set_certifier(capture.clone()) {
            return Err("certifier refused".into());
        }
        let oss = OssNode::open(cfg, engine.clone(), &boot.log).map_err(|e| e.to_string())?;
        Ok(Node {
            oss,
            engine,
            capture,
            rng: SimRng::new(seed ^ (boot.node << 8) ^ (boot.incarnation << 40)),
            lists: ListAppendWorkload::new(4, 4, 0.5),
            origin: (boot.node << 48) | (boot.incarnation << 32),
            started: 0,
            next_caller: 0,
            waiting: BTreeMap::new(),
            control_in_flight_max: 0,
        })
    }

    /// Runs `body` on the engine; a commit it needs is handed to OSS.
    pub(crate) fn run(
        &mut self,
        what: Waiting,
        body: impl FnMut(&mut atomos_core::Tx<'_>) -> Result<(), TxError>,
        out: &mut Vec<Output<OssMsg, Note>>,
    ) -> Result<(), OssError> {
        let result = self.engine.atomically(body);
        let captured = self.capture.take();
        match (result, captured) {
            (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                self.next_caller += 1;
                let caller = self.next_caller;
                self.waiting.insert(caller, what);
                let req = OssRequest::Commit {
                    tx: caller,
                    reads: c.reads,
                    writes: c.writes,
                };
                let mut inner = Vec::new();
                self.oss.step(0, Input::Request(req), &mut inner)?;
                self.carry(inner, out);
            }
            (Ok(()), None) => {
                if let Waiting::List(id, ops) = what {
                    out.push(Output::Deliver(Note::ListDone { id, ops }));
                }
            }
            (r, c) => out.push(Output::Warn(format!("unexpected outcome {r:?} with {c:?}"))),
        }
        Ok(())
    }

    pub(crate) fn transact(&mut self, out: &mut Vec<Output<OssMsg, Note>>) -> Result<(), OssError> {
        self.started += 1;
        let pick = self.rng.below(10);
        if pick < 5 {
            let mut txn = self.lists.next(&mut self.rng);
            txn.id += self.origin;
            let node = self.origin >> 48;
            for op in &mut txn.ops {
                if let ListOp::Append { value, .. } = op {
                    *value += self.origin;
                }
                // Half the operations go to this node's own lists (keys from LOCAL_LISTS on,
                // one range per node): commits mix node-local and replicated objects, and the
                // checker sees the node-local ones too.
                if self.rng.chance(0.5) {
                    match op {
                        ListOp::Read { key, .. } | ListOp::Append { key, .. } => {
                            *key += LOCAL_LISTS * node
                        }
                    }
                }
            }
            out.push(Output::Deliver(Note::ListRun(txn.clone())));
            let executed = Arc::new(Mutex::new(Vec::new()));
            let seen = executed.clone();
            let ops = txn.ops.clone();
            let body = move |tx: &mut atomos_core::Tx<'_>| {
                *seen.lock() = execute_list_ops_on(tx, &ops, list_object)?;
                Ok(())
            };
            // The operations as executed are known once the body ran.
            let result = self.engine.atomically(body);
            let captured = self.capture.take();
            let ops = executed.lock().clone();
            match (result, captured) {
                (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                    self.next_caller += 1;
                    let caller = self.next_caller;
                    self.waiting.insert(caller, Waiting::List(txn.id, ops));
                    let mut inner = Vec::new();
                    let req = OssRequest::Commit {
                        tx: caller,
                        reads: c.reads,
                        writes: c.writes,
                    };
                    self.oss.step(0, Input::Request(req), &mut inner)?;
                    self.carry(inner, out);
                }
                (Ok(()), None) => out.push(Output::Deliver(Note::ListDone { id: txn.id, ops })),
                (r, c) => out.push(Output::Warn(format!("unexpected outcome {r:?} with {c:?}"))),
            }
            Ok(())
        } else if pick < 8 {
            let (a, b) = (self.rng.below(ACCOUNTS), self.rng.below(ACCOUNTS));
            let amount = 1 + self.rng.below(20) as i64;
            self.run(
                Waiting::Transfer,
                move |tx| {
                    if !tx.exists(&account(0))? {
                        for i in 0..ACCOUNTS {
                            tx.create(&account(i), INITIAL)?;
                        }
                        let n = read_or_zero(tx, &transfers_here())?;
                        return write_u64(tx, &transfers_here(), n + 1);
                    }
                    if a != b {
                        tx.modify(&account(a), |v| *v -= amount)?;
                        tx.modify(&account(b), |v| *v += amount)?;
                        let n = read_or_zero(tx, &transfers_here())?;
                        write_u64(tx, &transfers_here(), n + 1)?;
                    }
                    Ok(())
                },
                out,
            )
        } else {
            let next = self
                .engine
                .run(
                    &TxOptions {
                        read_only: true,
                        ..TxOptions::default()
                    },
                    |tx| {
                        Ok::<_, TxError>(if tx.exists(&counter())? {
                            *tx.read(&counter())?
                        } else {
                            0
                        })
                    },
                )
                .unwrap_or(0)
                + 1;
            self.run(
                Waiting::Count(next),
                // A local commit that reads a replicated object too.
                move |tx| {
                    if tx.exists(&account(0))? {
                        tx.read(&account(0))?;
                    }
                    write_u64(tx, &counter(), next)
                },
                out,
            )
        }
    }

    pub(crate) fn audit(&self, out: &mut Vec<Output<OssMsg, Note>>) {
        if let Ok(Some(total)) = bank_total(&self.engine, ACCOUNTS) {
            out.push(Output::Deliver(Note::Audit { total }));
        }
    }

    pub(crate) fn carry(
        &mut self,
        inner: Vec<Output<OssMsg, OssDelivery>>,
        out: &mut Vec<Output<OssMsg, Note>>,
    ) {
        for o in inner {
            out.push(match o {
                Output::Send { to, msg } => Output::Send { to, msg },
                Output::Persist(w) => Output::Persist(w),
                Output::Warn(w) => Output::Warn(w),
                Output::Deliver(OssDelivery::Committed { tx, .. }) => {
                    match self.waiting.remove(&tx) {
                        Some(Waiting::List(id, ops)) => Output::Deliver(Note::ListDone { id, ops }),
                        Some(Waiting::Count(n)) => Output::Deliver(Note::Counted(n)),
                        Some(Waiting::Transfer) => Output::Deliver(Note::Transferred),
                        None => Output::Warn(format!("an answer for unknown commit {tx}")),
                    }
                }
                Output::Deliver(OssDelivery::Aborted {
                    tx,
                    reason: AbortReason::Unknown,
                }) => {
                    // Whether it committed is not known: neither done nor aborted.
                    self.waiting.remove(&tx);
                    Output::Warn(format!("the outcome of commit {tx} is unknown"))
                }
                Output::Deliver(OssDelivery::Aborted { tx, .. }) => {
                    match self.waiting.remove(&tx) {
                        Some(Waiting::List(id, _)) => Output::Deliver(Note::ListAborted { id }),
                        Some(_) => Output::Deliver(Note::Aborted),
                        None => Output::Warn(format!("an abort for unknown commit {tx}")),
                    }
                }
            });
        }
    }
}

impl Machine for Node {
    type Msg = OssMsg;
    type Request = ();
    type Delivery = Note;
    type Error = OssError;

    fn step(
        &mut self,
        now: u64,
        input: Input<OssMsg, ()>,
        out: &mut Vec<Output<OssMsg, Note>>,
    ) -> Result<(), OssError> {
        let input = match input {
            Input::Request(()) => return Ok(()),
            Input::Tick => {
                if self.waiting.is_empty() && self.started < TX_PER_RUN && self.rng.chance(0.3) {
                    self.transact(out)?;
                }
                if self.rng.chance(0.2) {
                    self.audit(out);
                }
                Input::Tick
            }
            Input::Message { from, msg } => Input::Message { from, msg },
            Input::Persisted { through } => Input::Persisted { through },
        };
        let mut inner = Vec::new();
        let images = self.oss.counters().images_installed;
        self.oss.step(now, input, &mut inner)?;
        for _ in images..self.oss.counters().images_installed {
            out.push(Output::Deliver(Note::Image));
        }
        self.control_in_flight_max = self
            .control_in_flight_max
            .max(self.oss.control_proposals_in_flight());
        self.carry(inner, out);
        Ok(())
    }
}
