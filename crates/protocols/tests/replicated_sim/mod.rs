//! The simulated `certify` and `active` clusters shared by the simulation tests: a replica
//! with its application (`Node`), the run (`simulate`), and its checks (`check`).

mod check;

pub(crate) use check::{check, check_lists};

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use crate::operator::{last_membership, next_change, removed};
use atomos_core::history::list_append::ListOp;
use atomos_core::{
    encode_arguments, Certification, Engine, EngineConfig, Invocation, Key, ProcedureKind,
    Procedures, SerialExecutor, Tx, TxError,
};
use atomos_order::{
    decode_log, Delivery, Endpoint, EndpointConfig, EndpointDelivery, EndpointRequest,
    MemberChange, Membership, OrderError, OrderMsg, Outcome as Answered, Replica, ReplicaConfig,
    Request, SnapshotJob,
};
use atomos_protocols::replicated::{Answer, Entry, PlantedBug, ReplicatedStore};
use atomos_sim::workload::{
    bank_total, check_list_run, execute_list_ops, Capture, ListAppendTxn, ListAppendWorkload,
};
use atomos_sim::{
    Agreement, Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng,
};

/// The replicas that found the cluster (nodes 1 to 3).
const REPLICAS: usize = 3;
/// Replica slots in membership runs: the founders and two that join (nodes 4 and 5).
const MEMBERSHIP_SLOTS: usize = 5;
const ACCOUNTS: u64 = 6;
const INITIAL: i64 = 100;
/// Transactions each incarnation of a replica starts at most.
const TX_PER_RUN: u64 = 30;

use atomos_sim::workload::bank_account as account;

/// The bank as procedures (the `active` set-up): "open" makes the accounts once, "transfer"
/// moves money between two of them.
fn bank_procedures() -> Procedures {
    let p = Procedures::new();
    let open = |tx: &mut Tx<'_>, _: &()| {
        if !tx.exists(&account(0))? {
            for i in 0..ACCOUNTS {
                tx.create(&account(i), INITIAL)?;
            }
        }
        Ok(())
    };
    let transfer = |tx: &mut Tx<'_>, &(a, b, amount): &(u64, u64, i64)| {
        if a == b || !tx.exists(&account(0))? {
            return Ok(false);
        }
        tx.modify(&account(a), |v| *v -= amount)?;
        tx.modify(&account(b), |v| *v += amount)?;
        Ok(true)
    };
    let registered = p
        .register("open", ProcedureKind::Update, open)
        .and_then(|()| p.register("transfer", ProcedureKind::Update, transfer));
    assert!(registered.is_ok(), "{registered:?}");
    p
}

#[derive(Clone, Debug)]
pub(crate) enum Note {
    /// A replica (re)started with this many entries finally delivered.
    Started {
        base: u64,
    },
    Delivered(Delivery),
    /// A client's answer.
    Answer {
        client: u64,
        seq: u64,
        response: Vec<u8>,
    },
    /// The store's objects after a step that changed its position.
    Digest {
        position: u64,
        digest: u64,
    },
    /// A read-only audit's total.
    Audit {
        total: i64,
    },
    /// A list-append transaction was run (with what its reads would have seen) and, if it
    /// wrote, submitted.
    ListRun(ListAppendTxn),
    /// It committed, having executed these operations.
    ListDone {
        id: u64,
        ops: Vec<ListOp>,
    },
    /// Its certification failed: it did not commit.
    ListAborted {
        id: u64,
    },
    /// This replica, leading, proposed a change of the operator's script.
    Proposed(MemberChange),
}

/// One replica with the application running on it: the production endpoint (the replica, the
/// node's client and the routing between them) under a simulated application.
struct Node {
    endpoint: Endpoint<ReplicatedStore>,
    engine: Arc<Engine>,
    capture: Arc<Capture>,
    rng: SimRng,
    started: u64,
    lists: ListAppendWorkload,
    /// Makes this run's list transaction ids and values unique in the whole simulation.
    origin: u64,
    /// List transactions waiting for their answer, by ticket.
    pending: BTreeMap<u64, (u64, Vec<ListOp>)>,
    announced: bool,
    last_position: u64,
    /// Transfers are procedures ordered as `Invoke` entries (the `active` protocol).
    active: bool,
    /// The latest digest this node's replica answered: (node, position, digest), reported in
    /// the node's next `Digest` entry.
    last_digest: Option<(u64, u64, u64)>,
    /// An operator asks this replica, when it leads, for the next change of its script.
    operator: bool,
    /// Membership changes asked for so far (their tickets, apart from the submissions').
    changes_asked: u64,
    /// Removed from the cluster: decommissioned, it takes no input any more.
    decommissioned: bool,
    /// Snapshots the replica asked to have encoded, each with the ticks left before its job
    /// runs: the replica applies more meanwhile (the job reads the engine as it was pinned), as
    /// beside a real encoding thread. A crash loses them.
    encoding: Vec<(u64, u64, SnapshotJob)>,
}

#[derive(Clone, Copy)]
pub(crate) struct Setup {
    pub(crate) snapshot_every: u64,
    pub(crate) bug: Option<PlantedBug>,
    /// Run the `active` protocol: the stores run procedures speculatively; transfers are
    /// invoked, list-append transactions are still certified closures between them.
    pub(crate) active: bool,
    /// Two more replicas join and an operator replaces members while the faults last (the
    /// order layer's operator script): a cluster of 1, 2, 3 ends as 3, 4, 5.
    pub(crate) membership: bool,
    /// A bug planted in the order layer under the replicated store.
    pub(crate) order_bug: Option<atomos_order::PlantedBug>,
}

impl Setup {
    /// The replica slots: nodes 1 to this.
    fn slots(&self) -> usize {
        match self.membership {
            true => MEMBERSHIP_SLOTS,
            false => REPLICAS,
        }
    }
}

impl Node {
    fn boot(seed: u64, setup: Setup, boot: Boot) -> Result<Node, String> {
        // The founders know each other; a replica that joins knows nobody yet.
        let founders: Vec<u64> = match boot.node as usize <= REPLICAS {
            true => (1..=REPLICAS as u64).collect(),
            false => Vec::new(),
        };
        let mut cfg = ReplicaConfig::new(boot.node, founders);
        cfg.planted_bug = setup.order_bug;
        cfg.seed = seed.wrapping_mul(31).wrapping_add(boot.node) ^ (boot.incarnation << 32);
        cfg.batch_max = 4;
        cfg.retry_ticks = 5;
        cfg.snapshot_every = setup.snapshot_every;
        // Snapshots stream in chunks of a few hundred bytes: a transfer crosses many messages.
        cfg.snapshot_chunk_bytes = 64 + (seed % 512) as usize;
        // A few entries delivered per step (1 to 8 by seed): catching up spans many steps.
        cfg.deliveries_per_step = 1 + (seed % 8) as usize;
        // A wiped replica is restarted as an operator would: told that it lost its log.
        cfg.rejoin = boot.wiped;
        let engine = Arc::new(Engine::new(EngineConfig {
            replicated: true,
            ..EngineConfig::default()
        }));
        let capture = Arc::new(Capture::default());
        if !engine.set_certifier(capture.clone()) {
            return Err("certifier refused".into());
        }
        let store = match setup.active {
            true => ReplicatedStore::active(engine.clone(), bank_procedures())?,
            false => ReplicatedStore::new(engine.clone())?,
        }
        .with_planted_bug(setup.bug);
        let log = decode_log(&boot.log).map_err(|e| e.to_string())?;
        let replica = Replica::open(cfg, log, store).map_err(|e| e.to_string())?;
        let decommissioned = removed(&replica);
        let replicas = replica.membership().all();
        // Client ids unique across nodes and restarts, as the node runtime's random base makes
        // them.
        let endpoint_cfg = EndpointConfig {
            client_base: (boot.node << 40) | (boot.incarnation << 32),
            resend_ticks: 15,
            // Short, so that requests submitted without a deadline expire under the faults
            // and are sent again as new ones.
            request_lifetime_ms: 400,
        };
        Ok(Node {
            last_position: replica.machine().position(),
            endpoint: Endpoint::new(replica, &replicas, endpoint_cfg),
            engine,
            capture,
            rng: SimRng::new(seed ^ (boot.node << 8) ^ (boot.incarnation << 40)),
            started: 0,
            lists: ListAppendWorkload::new(4, 4, 0.5),
            origin: (boot.node << 48) | (boot.incarnation << 32),
            pending: BTreeMap::new(),
            announced: false,
            active: setup.active,
            last_digest: None,
            operator: setup.membership,
            changes_asked: 0,
            decommissioned,
            encoding: Vec::new(),
        })
    }

    /// Runs one application transaction (a transfer or a list-append transaction).
    fn transact(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        if self.rng.chance(0.1) {
            // Replicas compare their states: the digest this one reported last, against theirs.
            let reported = self.last_digest;
            self.submit_entry(now, Entry::ContentsDigest { reported }, out)?;
        } else if self.rng.chance(0.5) {
            self.list_append(now, out)?;
        } else {
            self.transfer(now, out)?;
        }
        Ok(())
    }

    /// Orders a captured certification through the endpoint; returns its ticket.
    fn submit(
        &mut self,
        now: u64,
        c: Certification,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<u64, OrderError> {
        let entry = Entry::Certify {
            reads: c.reads,
            writes: c.writes,
        };
        self.submit_entry(now, entry, out)
    }

    /// Orders `entry` through the endpoint; returns its ticket (1, 2, 3, ... in this run).
    fn submit_entry(
        &mut self,
        now: u64,
        entry: Entry,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<u64, OrderError> {
        self.started += 1;
        let submit = EndpointRequest::Submit {
            ticket: self.started,
            payload: entry.encode(),
            deadline_ms: atomos_order::NO_DEADLINE,
        };
        self.step_endpoint(now, Input::Request(submit), out)?;
        Ok(self.started)
    }

    /// A list-append transaction: reads and appends over a few lists, through the engine.
    fn list_append(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        let mut txn = self.lists.next(&mut self.rng);
        txn.id += self.origin;
        for op in &mut txn.ops {
            if let ListOp::Append { value, .. } = op {
                *value += self.origin;
            }
        }
        let mut executed = Vec::new();
        let result = self.engine.atomically(|tx| {
            executed = execute_list_ops(tx, &txn.ops)?;
            Ok(())
        });
        let captured = self.capture.take();
        let id = txn.id;
        out.push(Output::Deliver(Note::ListRun(txn)));
        match (result, captured) {
            (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                // Pending before it is submitted: a one-replica order could answer at once.
                let ticket = self.started + 1;
                self.pending.insert(ticket, (id, executed));
                self.submit(now, c, out)?;
            }
            // Read-only: committed here, never ordered.
            (Ok(()), None) => out.push(Output::Deliver(Note::ListDone { id, ops: executed })),
            (r, c) => out.push(Output::Warn(format!(
                "unexpected transaction outcome {r:?} with {c:?}"
            ))),
        }
        Ok(())
    }

    /// Runs the snapshot encodings whose time came and hands their states back.
    fn encode_due(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        for (_, left, _) in self.encoding.iter_mut() {
            *left = left.saturating_sub(1);
        }
        while let Some(i) = self.encoding.iter().position(|(_, left, _)| *left == 0) {
            let (seq, _, job) = self.encoding.remove(i);
            let state = job();
            let back = EndpointRequest::SnapshotEncoded { seq, state };
            self.step_endpoint(now, Input::Request(back), out)?;
        }
        Ok(())
    }

    /// Steps the endpoint and hands its outputs out: the replica's deliveries as notes, and
    /// each answer as a note (an answer to a list transaction also as its outcome).
    fn step_endpoint(
        &mut self,
        now: u64,
        input: Input<OrderMsg, EndpointRequest>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        let mut outputs = Vec::new();
        self.endpoint.step(now, input, &mut outputs)?;
        for o in outputs {
            match o {
                Output::Deliver(EndpointDelivery::Answered {
                    ticket,
                    client,
                    seq,
                    outcome: Answered::Applied(response),
                }) => {
                    if let Ok(Answer::Digested { position, digest }) = Answer::decode(&response) {
                        self.last_digest = Some((self.origin >> 48, position, digest));
                    }
                    if let Some((id, ops)) = self.pending.remove(&ticket) {
                        out.push(Output::Deliver(match Answer::decode(&response) {
                            Ok(Answer::Committed { .. }) => Note::ListDone { id, ops },
                            _ => Note::ListAborted { id },
                        }));
                    }
                    out.push(Output::Deliver(Note::Answer {
                        client,
                        seq,
                        response,
                    }));
                }
                // Requests here have no deadline.
                Output::Deliver(EndpointDelivery::Answered { .. }) => {}
                Output::Deliver(EndpointDelivery::Order(Delivery::EncodeSnapshot { seq, job })) => {
                    if let Some(job) = job.take() {
                        let ticks = 1 + self.rng.below(8);
                        self.encoding.push((seq, ticks, job));
                    }
                }
                Output::Deliver(EndpointDelivery::Order(d)) => {
                    out.push(Output::Deliver(Note::Delivered(d)))
                }
                Output::Send { to, msg } => out.push(Output::Send { to, msg }),
                Output::Persist(write) => out.push(Output::Persist(write)),
                Output::Warn(text) => out.push(Output::Warn(text)),
            }
        }
        Ok(())
    }

    /// A bank transfer through the engine; its certification is captured and submitted. Under
    /// `active` it is a procedure invocation instead (the first opens the accounts), or, half
    /// the time, still a certified closure: the two kinds mix on the same accounts.
    fn transfer(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        let (a, b) = (self.rng.below(ACCOUNTS), self.rng.below(ACCOUNTS));
        let amount = 1 + self.rng.below(20) as i64;
        if self.active && (self.started == 0 || self.rng.chance(0.5)) {
            let (procedure, arguments) = if self.started == 0 {
                ("open", encode_arguments("open", &()))
            } else {
                ("transfer", encode_arguments("transfer", &(a, b, amount)))
            };
            match arguments {
                Ok(arguments) => {
                    let entry = Entry::Invoke {
                        procedure: procedure.into(),
                        arguments,
                    };
                    self.submit_entry(now, entry, out)?;
                }
                Err(e) => out.push(Output::Warn(format!("arguments: {e}"))),
            }
            return Ok(());
        }
        let result = self.engine.atomically(|tx| {
            if !tx.exists(&account(0))? {
                for i in 0..ACCOUNTS {
                    tx.create(&account(i), INITIAL)?;
                }
                return Ok(());
            }
            if a != b {
                tx.modify(&account(a), |v| *v -= amount)?;
                tx.modify(&account(b), |v| *v += amount)?;
            }
            Ok(())
        });
        let captured = self.capture.take();
        match (result, captured) {
            (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                self.submit(now, c, out)?;
            }
            // Nothing written (a == b), or a transaction that found nothing to do.
            (Ok(()), None) => {}
            (r, c) => out.push(Output::Warn(format!(
                "unexpected transaction outcome {r:?} with {c:?}"
            ))),
        }
        Ok(())
    }

    /// The operator, when this replica leads: asks it for the next change of the script that
    /// is due and not yet in the membership.
    fn operate(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        let replica = self.endpoint.replica();
        if !self.operator || !replica.is_leader() {
            return Ok(());
        }
        let Some(change) = next_change(now, replica.membership()) else {
            return Ok(());
        };
        self.changes_asked += 1;
        // Numbered apart from the submissions' tickets.
        let ticket = u64::MAX - self.changes_asked;
        let ask = EndpointRequest::ChangeMembership {
            ticket,
            change: change.clone(),
        };
        let mut outputs = Vec::new();
        self.step_endpoint(now, Input::Request(ask), &mut outputs)?;
        let proposed = outputs.iter().any(|o| {
            matches!(o, Output::Deliver(Note::Delivered(Delivery::MemberChange { ticket: t, result: Ok(_) })) if *t == ticket)
        });
        out.extend(outputs);
        if proposed {
            out.push(Output::Deliver(Note::Proposed(change)));
        }
        Ok(())
    }

    /// A read-only audit of the whole bank on this replica.
    fn audit(&self, out: &mut Vec<Output<OrderMsg, Note>>) {
        match bank_total(&self.engine, ACCOUNTS) {
            Ok(Some(total)) => out.push(Output::Deliver(Note::Audit { total })),
            Ok(None) => {}
            Err(e) => out.push(Output::Deliver(Note::Audit {
                total: i64::MIN + e.to_string().len() as i64,
            })),
        }
    }
}

fn digest(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl Machine for Node {
    type Msg = OrderMsg;
    type Request = ();
    type Delivery = Note;
    type Error = OrderError;

    fn step(
        &mut self,
        now: u64,
        input: Input<OrderMsg, ()>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        if self.decommissioned {
            return Ok(());
        }
        if !self.announced {
            self.announced = true;
            out.push(Output::Deliver(Note::Started {
                base: self.endpoint.replica().final_next() - 1,
            }));
        }
        match input {
            Input::Request(()) => return Ok(()),
            Input::Tick => {
                self.step_endpoint(now, Input::Tick, out)?;
                self.encode_due(now, out)?;
                if self.endpoint.in_flight() == 0
                    && self.started < TX_PER_RUN
                    && self.rng.chance(0.3)
                {
                    self.transact(now, out)?;
                }
                if self.rng.chance(0.2) {
                    self.audit(out);
                }
                self.operate(now, out)?;
            }
            Input::Message { from, msg } => {
                self.step_endpoint(now, Input::Message { from, msg }, out)?
            }
            Input::Persisted { through } => {
                self.step_endpoint(now, Input::Persisted { through }, out)?
            }
        }
        let store = self.endpoint.replica().machine();
        let position = store.position();
        if position != self.last_position {
            self.last_position = position;
            let digest = digest(&store.contents());
            out.push(Output::Deliver(Note::Digest { position, digest }));
        }
        self.decommissioned = removed(self.endpoint.replica());
        Ok(())
    }
}

pub(crate) struct Outcome {
    pub(crate) run: Run<Note>,
    pub(crate) unanswered: usize,
    /// Each live replica: (final_next, position, objects).
    pub(crate) finals: Vec<(NodeId, u64, u64, Vec<atomos_core::SnapshotObject>)>,
    /// The live replicas' executors' counters, summed (under `active`).
    pub(crate) executed: atomos_core::ExecutorStats,
    /// Digests the live replicas compared with another's report, summed.
    pub(crate) digests_compared: u64,
    /// The run had members change (the operator's script).
    pub(crate) membership_run: bool,
    /// The membership at the run's end: the one delivered at the highest position.
    pub(crate) membership: Membership,
}

pub(crate) fn simulate(seed: u64, setup: Setup, faults: Faults) -> Outcome {
    let slots = setup.slots();
    let cfg = SimConfig {
        seed,
        nodes: slots,
        crashable: slots,
        tick_every: 10,
        fault_until: 4_000,
        settle: 8_000,
        faults,
    };
    let mut sim = Sim::new(cfg, move |boot| Node::boot(seed, setup, boot));
    let run = sim.run();
    let delivered = run.notes.iter().filter_map(|(_, _, n)| match n {
        Note::Delivered(Delivery::Membership { seq, membership }) => Some((*seq, membership)),
        _ => None,
    });
    let membership = last_membership(delivered, REPLICAS as u64);
    let mut unanswered = 0;
    let mut finals = Vec::new();
    let mut executed = atomos_core::ExecutorStats::default();
    let mut digests_compared = 0;
    for node in 1..=slots as NodeId {
        // Replicas removed, and those never added, are left out.
        if let Some(n) = sim.machine(node).filter(|_| membership.contains(node)) {
            unanswered += n.endpoint.in_flight();
            let replica = n.endpoint.replica();
            digests_compared += replica.machine().stats().digests_compared;
            if let Some(e) = replica.machine().executor_stats() {
                executed.speculated += e.speculated;
                executed.confirmed += e.confirmed;
                executed.rerun += e.rerun;
                executed.revoked += e.revoked;
            }
            let objects = n.engine.snapshot_objects().unwrap_or_default();
            finals.push((
                node,
                replica.final_next(),
                replica.machine().position(),
                objects,
            ));
        }
    }
    Outcome {
        run,
        unanswered,
        finals,
        executed,
        digests_compared,
        membership_run: setup.membership,
        membership,
    }
}

pub(crate) fn count(o: &Outcome, f: impl Fn(&Note) -> bool) -> usize {
    o.run.notes.iter().filter(|(_, _, n)| f(n)).count()
}

pub(crate) fn setup() -> Setup {
    Setup {
        snapshot_every: 25,
        bug: None,
        active: false,
        membership: false,
        order_bug: None,
    }
}

pub(crate) fn active_setup() -> Setup {
    Setup {
        active: true,
        ..setup()
    }
}
