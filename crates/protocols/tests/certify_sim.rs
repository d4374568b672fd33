//! `certify` in the simulator: 3 replicas, each an order-layer replica whose state machine is
//! the replicated store over its own engine, with application transactions running on every
//! replica (bank transfers and list-append transactions through the engine's real certified
//! commit path), under loss,
//! duplication, reordering, partitions, crashes and restarts on disks that lose unsynced
//! writes, tear the last one and fail fsyncs, with snapshots and state transfer.
//!
//! Checked on every run:
//! - no replica fails;
//! - every finally delivered position holds the same requests wherever it was delivered;
//! - replaying the final order through a model of the certification rule (a map from key to
//!   version and value) gives every answer a client received, and each live replica's objects
//!   at the end (so every acknowledged commit is there, and nothing else);
//! - replicas hold identical objects at equal positions (a digest after every step);
//! - every read-only audit, on every replica at any time, sees the bank's total;
//! - the list-append transactions run on every replica (reads and appends over a few lists,
//!   through the engine) form a history the list-append checker accepts;
//! - once the faults stop, every replica catches up and every client is answered.
//!
//!
//! The same simulation runs `active` too: the stores run procedure invocations (bank transfers)
//! speculatively at their optimistic delivery and commit them at their final one, with
//! transfers and list-append transactions written as closures certified between them; the
//! model then runs the invocations one at a time in the final order, without speculation.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-protocols --test certify_sim`.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use atomos_core::history::list_append::{self, ListOp};
use atomos_core::{
    encode_arguments, Certification, Certifier, CertifyError, Engine, EngineConfig, Invocation,
    Key, LockOutcome, ProcedureKind, Procedures, SerialExecutor, TRef, Tx, TxError, TxOptions,
    Verdict,
};
use atomos_order::{
    decode_log, Client, ClientAction, ClientInput, Delivery, OrderError, OrderMsg, Replica,
    ReplicaConfig, Request,
};
use atomos_protocols::replicated::{Answer, Entry, PlantedBug, ReplicatedStore};
use atomos_sim::workload::{list_history, ListAppendTxn, ListAppendWorkload};
use atomos_sim::{
    check_seeds, seeds, Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng,
};
use parking_lot::Mutex;

const REPLICAS: usize = 3;
const ACCOUNTS: u64 = 6;
const INITIAL: i64 = 100;
/// Transactions each incarnation of a replica starts at most.
const TX_PER_RUN: u64 = 30;

fn account(i: u64) -> TRef<i64> {
    TRef::new(Key::with_index("acct/", i))
}

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
enum Note {
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
}

/// Keeps a certification instead of ordering it: the simulated replica orders it through its
/// own client, without blocking the one thread the simulation runs on.
#[derive(Default)]
struct Capture(Mutex<Option<Certification>>);

impl Certifier for Capture {
    fn certify(&self, c: Certification) -> Result<Verdict, CertifyError> {
        *self.0.lock() = Some(c);
        Err(CertifyError::OutcomeUnknown(
            "captured for the simulation".into(),
        ))
    }
    fn barrier(&self) -> Result<u64, CertifyError> {
        Err(CertifyError::OutcomeUnknown("no barriers here".into()))
    }
    fn abstract_lock(&self, _: u64, _: &str) -> Result<LockOutcome, CertifyError> {
        Err(CertifyError::OutcomeUnknown(
            "no abstract locks here".into(),
        ))
    }
    fn release_abstract(&self, _: u64, _: Vec<String>) {}
}

/// One replica with the application running on it.
struct Node {
    replica: Replica<ReplicatedStore>,
    engine: Arc<Engine>,
    capture: Arc<Capture>,
    client: Client,
    rng: SimRng,
    started: u64,
    lists: ListAppendWorkload,
    /// Makes this run's list transaction ids and values unique in the whole simulation.
    origin: u64,
    /// List transactions waiting for their answer, by the client's request number.
    pending: BTreeMap<u64, (u64, Vec<ListOp>)>,
    announced: bool,
    last_position: u64,
    /// Transfers are procedures ordered as `Invoke` entries (the `active` protocol).
    active: bool,
}

#[derive(Clone, Copy)]
struct Setup {
    snapshot_every: u64,
    bug: Option<PlantedBug>,
    /// Run the `active` protocol: the stores run procedures speculatively; transfers are
    /// invoked, list-append transactions are still certified closures between them.
    active: bool,
}

impl Node {
    fn boot(seed: u64, setup: Setup, boot: Boot) -> Result<Node, String> {
        let replicas: Vec<u64> = (1..=REPLICAS as u64).collect();
        let mut cfg = ReplicaConfig::new(boot.node, replicas.clone());
        cfg.seed = seed.wrapping_mul(31).wrapping_add(boot.node) ^ (boot.incarnation << 32);
        cfg.batch_max = 4;
        cfg.retry_ticks = 5;
        cfg.snapshot_every = setup.snapshot_every;
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
        let first = (boot.node as usize - 1) % REPLICAS;
        let client_id = boot.node * 1_000_000 + boot.incarnation;
        Ok(Node {
            last_position: replica.machine().position(),
            replica,
            engine,
            capture,
            client: Client::new(client_id, replicas, first, 15),
            rng: SimRng::new(seed ^ (boot.node << 8) ^ (boot.incarnation << 40)),
            started: 0,
            lists: ListAppendWorkload::new(4, 4, 0.5),
            origin: (boot.node << 48) | (boot.incarnation << 32),
            pending: BTreeMap::new(),
            announced: false,
            active: setup.active,
        })
    }

    /// Runs one application transaction (a transfer or a list-append transaction).
    fn transact(&mut self, out: &mut Vec<Output<OrderMsg, Note>>) {
        if self.rng.chance(0.5) {
            self.list_append(out);
        } else {
            self.transfer(out);
        }
    }

    /// Orders a captured certification through this node's client; returns the request's
    /// number.
    fn submit(&mut self, c: Certification, out: &mut Vec<Output<OrderMsg, Note>>) -> u64 {
        let entry = Entry::Certify {
            reads: c.reads,
            writes: c.writes,
        };
        self.submit_entry(entry, out)
    }

    /// Orders `entry` through this node's client; returns the request's number.
    fn submit_entry(&mut self, entry: Entry, out: &mut Vec<Output<OrderMsg, Note>>) -> u64 {
        let mut actions = Vec::new();
        self.client
            .step(ClientInput::Submit(entry.encode()), &mut actions);
        self.started += 1;
        self.push_client(actions, out);
        // One request at a time, numbered from 1: this one's number.
        self.started
    }

    /// A list-append transaction: reads and appends over a few lists, through the engine.
    fn list_append(&mut self, out: &mut Vec<Output<OrderMsg, Note>>) {
        let mut txn = self.lists.next(&mut self.rng);
        txn.id += self.origin;
        for op in &mut txn.ops {
            if let ListOp::Append { value, .. } = op {
                *value += self.origin;
            }
        }
        let list = |k: u64| TRef::<Vec<u64>>::new(Key::with_index("list/", k));
        let mut executed = Vec::new();
        let result = self.engine.atomically(|tx| {
            executed.clear();
            for op in &txn.ops {
                match op {
                    ListOp::Read { key, .. } => {
                        let r = list(*key);
                        let seen = if tx.exists(&r)? {
                            tx.read(&r)?.clone()
                        } else {
                            Vec::new()
                        };
                        executed.push(ListOp::Read { key: *key, seen });
                    }
                    ListOp::Append { key, value } => {
                        let r = list(*key);
                        if tx.exists(&r)? {
                            tx.modify(&r, |l| l.push(*value))?;
                        } else {
                            tx.create(&r, vec![*value])?;
                        }
                        executed.push(op.clone());
                    }
                }
            }
            Ok(())
        });
        let captured = self.capture.0.lock().take();
        let id = txn.id;
        out.push(Output::Deliver(Note::ListRun(txn)));
        match (result, captured) {
            (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                let seq = self.submit(c, out);
                self.pending.insert(seq, (id, executed));
            }
            // Read-only: committed here, never ordered.
            (Ok(()), None) => out.push(Output::Deliver(Note::ListDone { id, ops: executed })),
            (r, c) => out.push(Output::Warn(format!(
                "unexpected transaction outcome {r:?} with {c:?}"
            ))),
        }
    }

    /// Hands the client's actions out; an answer to a list transaction is noted as its
    /// outcome.
    fn push_client(&mut self, actions: Vec<ClientAction>, out: &mut Vec<Output<OrderMsg, Note>>) {
        for a in actions {
            if let ClientAction::Done { seq, response } = &a {
                if let Some((id, ops)) = self.pending.remove(seq) {
                    out.push(Output::Deliver(match Answer::decode(response) {
                        Ok(Answer::Committed { .. }) => Note::ListDone { id, ops },
                        _ => Note::ListAborted { id },
                    }));
                }
            }
            push_client(self.client.id(), vec![a], out);
        }
    }

    /// A bank transfer through the engine; its certification is captured and submitted. Under
    /// `active` it is a procedure invocation instead (the first opens the accounts), or, half
    /// the time, still a certified closure: the two kinds mix on the same accounts.
    fn transfer(&mut self, out: &mut Vec<Output<OrderMsg, Note>>) {
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
                    self.submit_entry(entry, out);
                }
                Err(e) => out.push(Output::Warn(format!("arguments: {e}"))),
            }
            return;
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
        let captured = self.capture.0.lock().take();
        match (result, captured) {
            (Err(TxError::OutcomeUnknown { .. }), Some(c)) => {
                self.submit(c, out);
            }
            // Nothing written (a == b), or a transaction that found nothing to do.
            (Ok(()), None) => {}
            (r, c) => out.push(Output::Warn(format!(
                "unexpected transaction outcome {r:?} with {c:?}"
            ))),
        }
    }

    /// A read-only audit of the whole bank on this replica.
    fn audit(&self, out: &mut Vec<Output<OrderMsg, Note>>) {
        let opts = TxOptions {
            read_only: true,
            ..TxOptions::default()
        };
        let total = self.engine.run(&opts, |tx| {
            if !tx.exists(&account(0))? {
                return Ok(None);
            }
            let mut sum = 0;
            for i in 0..ACCOUNTS {
                sum += *tx.read(&account(i))?;
            }
            Ok::<_, TxError>(Some(sum))
        });
        match total {
            Ok(Some(total)) => out.push(Output::Deliver(Note::Audit { total })),
            Ok(None) => {}
            Err(e) => out.push(Output::Deliver(Note::Audit {
                total: i64::MIN + e.to_string().len() as i64,
            })),
        }
    }
}

fn push_client(client: u64, actions: Vec<ClientAction>, out: &mut Vec<Output<OrderMsg, Note>>) {
    for a in actions {
        match a {
            ClientAction::Send { to, msg } => out.push(Output::Send { to, msg }),
            ClientAction::Done { seq, response } => out.push(Output::Deliver(Note::Answer {
                client,
                seq,
                response,
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
        if !self.announced {
            self.announced = true;
            out.push(Output::Deliver(Note::Started {
                base: self.replica.final_next() - 1,
            }));
        }
        let input = match input {
            Input::Request(()) => return Ok(()),
            Input::Message {
                from,
                msg: msg @ OrderMsg::Reply { .. },
            } => {
                let mut actions = Vec::new();
                self.client
                    .step(ClientInput::Message { from, msg }, &mut actions);
                self.push_client(actions, out);
                return Ok(());
            }
            Input::Tick => {
                let mut actions = Vec::new();
                self.client.step(ClientInput::Tick, &mut actions);
                self.push_client(actions, out);
                if self.client.unanswered() == 0
                    && self.started < TX_PER_RUN
                    && self.rng.chance(0.3)
                {
                    self.transact(out);
                }
                if self.rng.chance(0.2) {
                    self.audit(out);
                }
                Input::Tick
            }
            Input::Message { from, msg } => Input::Message { from, msg },
            Input::Persisted { through } => Input::Persisted { through },
        };
        let mut actions = Vec::new();
        self.replica.step(now, input, &mut actions)?;
        for a in actions {
            out.push(match a {
                Output::Deliver(d) => Output::Deliver(Note::Delivered(d)),
                Output::Send { to, msg } => Output::Send { to, msg },
                Output::Persist(w) => Output::Persist(w),
                Output::Warn(w) => Output::Warn(w),
            });
        }
        let position = self.replica.machine().position();
        if position != self.last_position {
            self.last_position = position;
            let digest = digest(&self.replica.machine().contents());
            out.push(Output::Deliver(Note::Digest { position, digest }));
        }
        Ok(())
    }
}

struct Outcome {
    run: Run<Note>,
    unanswered: usize,
    /// Each live replica: (final_next, position, objects).
    finals: Vec<(NodeId, u64, u64, Vec<atomos_core::SnapshotObject>)>,
    /// The live replicas' executors' counters, summed (under `active`).
    executed: atomos_core::ExecutorStats,
}

fn simulate(seed: u64, setup: Setup, faults: Faults) -> Outcome {
    let cfg = SimConfig {
        seed,
        nodes: REPLICAS,
        crashable: REPLICAS,
        tick_every: 10,
        fault_until: 4_000,
        settle: 8_000,
        faults,
    };
    let mut sim = Sim::new(cfg, move |boot| Node::boot(seed, setup, boot));
    let run = sim.run();
    let mut unanswered = 0;
    let mut finals = Vec::new();
    let mut executed = atomos_core::ExecutorStats::default();
    for node in 1..=REPLICAS as NodeId {
        if let Some(n) = sim.machine(node) {
            unanswered += n.client.unanswered();
            if let Some(e) = n.replica.machine().executor_stats() {
                executed.speculated += e.speculated;
                executed.confirmed += e.confirmed;
                executed.rerun += e.rerun;
                executed.revoked += e.revoked;
            }
            let objects = n.engine.snapshot_objects().unwrap_or_default();
            finals.push((
                node,
                n.replica.final_next(),
                n.replica.machine().position(),
                objects,
            ));
        }
    }
    Outcome {
        run,
        unanswered,
        finals,
        executed,
    }
}

/// The final order as the replicas delivered it: entry seq -> its requests.
fn final_order(run: &Run<Note>) -> Result<BTreeMap<u64, Vec<Request>>, String> {
    #[derive(Default)]
    struct View {
        opt: BTreeMap<u64, Vec<Request>>,
        final_next: u64,
    }
    let mut order: BTreeMap<u64, Vec<Request>> = BTreeMap::new();
    let mut views: BTreeMap<NodeId, View> = BTreeMap::new();
    for (t, node, note) in &run.notes {
        let v = views.entry(*node).or_default();
        match note {
            Note::Started { base } => {
                *v = View {
                    opt: BTreeMap::new(),
                    final_next: base + 1,
                }
            }
            Note::Delivered(Delivery::Opt { seq, requests }) => {
                v.opt.insert(*seq, requests.clone());
            }
            Note::Delivered(Delivery::Revoke { from }) => {
                v.opt.split_off(from);
            }
            Note::Delivered(Delivery::Installed { seq }) => {
                v.opt.clear();
                v.final_next = seq + 1;
            }
            Note::Delivered(Delivery::Final { seq }) => {
                let Some(requests) = v.opt.remove(seq) else {
                    return Err(format!("node {node} at {t}: final {seq} never optimistic"));
                };
                if *seq != v.final_next {
                    return Err(format!("node {node} at {t}: final {seq} out of order"));
                }
                v.final_next += 1;
                match order.get(seq) {
                    Some(other) if *other != requests => {
                        if std::env::var("DEBUG_CERTIFY").is_ok() {
                            for l in &run.trace {
                                eprintln!("{l}");
                            }
                        }
                        return Err(format!(
                            "node {node} at {t}: position {seq} differs between replicas: \
                             {requests:?} here, {other:?} elsewhere"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        order.insert(*seq, requests);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(order)
}

/// The certification rule as a model: key -> (version, value bytes or deletion). Procedure
/// invocations run one at a time, in the final order, on an engine of the model's own that
/// gets every write, with no speculation.
struct Model {
    objects: BTreeMap<Key, (u64, Option<Vec<u8>>)>,
    position: u64,
    engine: Arc<Engine>,
    executor: SerialExecutor,
}

impl Model {
    fn new() -> Model {
        let engine = Arc::new(Engine::new(EngineConfig {
            replicated: true,
            ..EngineConfig::default()
        }));
        Model {
            objects: BTreeMap::new(),
            position: 0,
            executor: SerialExecutor::new(engine.clone(), bank_procedures()),
            engine,
        }
    }

    fn apply(&mut self, payload: &[u8]) -> Answer {
        self.position += 1;
        let position = self.position;
        match Entry::decode(payload) {
            Ok(Entry::Certify { reads, writes }) => {
                let current = reads
                    .iter()
                    .all(|(k, v)| self.objects.get(k).map_or(0, |o| o.0) == *v);
                if !current {
                    self.engine.mark_applied(position);
                    return Answer::Conflict { position };
                }
                for (k, bytes) in &writes {
                    self.objects.insert(k.clone(), (position, bytes.clone()));
                }
                self.engine.apply_certified(position, &[], writes);
                Answer::Committed { version: position }
            }
            Ok(Entry::Invoke {
                procedure,
                arguments,
            }) => {
                let invocation = Invocation {
                    procedure,
                    arguments,
                };
                let mut written = Vec::new();
                let outcome =
                    self.executor
                        .finalize((u64::MAX, 0), position, &invocation, |k, v| {
                            written.push((k.clone(), v.map(<[u8]>::to_vec)))
                        });
                for (k, bytes) in written {
                    self.objects.insert(k, (position, bytes));
                }
                Answer::Invoked { position, outcome }
            }
            Ok(Entry::Barrier) => Answer::Applied { position },
            Ok(other) => panic!("the simulation orders no {other:?}"),
            Err(e) => Answer::Refused {
                position,
                reason: e.to_string(),
            },
        }
    }

    fn snapshot(&self) -> Vec<atomos_core::SnapshotObject> {
        self.objects
            .iter()
            .map(|(k, (v, b))| (k.clone(), *v, b.clone()))
            .collect()
    }
}

/// Checks a run; returns how many certifications committed.
fn check(o: &Outcome) -> Result<usize, String> {
    if let Some((t, node, e)) = o.run.failures.first() {
        return Err(format!("replica {node} failed at {t}: {e}"));
    }
    if let Some((t, node, e)) = o.run.refused.first() {
        return Err(format!("replica {node} refused to start at {t}: {e}"));
    }
    let order = final_order(&o.run)?;
    if !order.keys().copied().eq(1..=order.len() as u64) {
        return Err("some positions were finally delivered by no replica".into());
    }
    // Replay the final order through the model.
    let mut model = Model::new();
    let mut expected = BTreeMap::new();
    let mut states = BTreeMap::new();
    let mut committed = 0;
    for requests in order.values() {
        for r in requests {
            let answer = model.apply(&r.payload);
            committed += matches!(
                answer,
                Answer::Committed { .. }
                    | Answer::Invoked {
                        outcome: atomos_core::Outcome::Returned(_),
                        ..
                    }
            ) as usize;
            expected.insert((r.client, r.seq), answer);
        }
        states.insert(model.position, model.snapshot());
    }
    let mut digests: BTreeMap<u64, u64> = BTreeMap::new();
    for (t, node, note) in &o.run.notes {
        match note {
            Note::Answer {
                client,
                seq,
                response,
            } => {
                let got = Answer::decode(response).map_err(|e| e.to_string())?;
                if expected.get(&(*client, *seq)) != Some(&got) {
                    return Err(format!(
                        "node {node} at {t}: answer {got:?} to {client}:{seq}, the final order \
                         says {:?}",
                        expected.get(&(*client, *seq))
                    ));
                }
            }
            Note::Digest { position, digest }
                if *digests.entry(*position).or_insert(*digest) != *digest =>
            {
                return Err(format!(
                    "node {node} at {t}: objects at position {position} differ from another \
                     replica's"
                ));
            }
            Note::Audit { total } if *total != INITIAL * ACCOUNTS as i64 => {
                return Err(format!("node {node} at {t}: an audit saw total {total}"));
            }
            _ => {}
        }
    }
    if o.unanswered > 0 {
        return Err(format!("{} requests never answered", o.unanswered));
    }
    check_lists(o)?;
    if committed < 10 {
        return Err(format!(
            "only {committed} commits: the run made no progress"
        ));
    }
    let end = model.snapshot();
    for (node, final_next, position, objects) in &o.finals {
        if *final_next != order.len() as u64 + 1 || *position != model.position {
            return Err(format!(
                "replica {node} ended at entry {final_next} position {position}, the log has \
                 {} entries and {} positions",
                order.len(),
                model.position
            ));
        }
        if *objects != end {
            return Err(format!("replica {node}'s objects differ from the model's"));
        }
    }
    Ok(committed)
}

/// Checks the list-append history from every replica: transactions told they committed (with
/// what they read), those never answered as of unknown outcome, those refused left out.
/// Returns how many committed.
fn check_lists(o: &Outcome) -> Result<usize, String> {
    let aborted: BTreeSet<u64> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::ListAborted { id } => Some(*id),
            _ => None,
        })
        .collect();
    let submitted: Vec<ListAppendTxn> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::ListRun(t) if !aborted.contains(&t.id) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let done = o.run.notes.iter().filter_map(|(_, node, n)| match n {
        Note::ListDone { id, ops } => Some((*node, *id, ops.clone())),
        _ => None,
    });
    let history = list_history(&submitted, done);
    list_append::check(&history).map_err(|a| format!("list-append history: {a}"))?;
    Ok(history
        .iter()
        .filter(|t| t.outcome == list_append::Outcome::Committed)
        .count())
}

fn count(o: &Outcome, f: impl Fn(&Note) -> bool) -> usize {
    o.run.notes.iter().filter(|(_, _, n)| f(n)).count()
}

fn setup() -> Setup {
    Setup {
        snapshot_every: 25,
        bug: None,
        active: false,
    }
}

fn active_setup() -> Setup {
    Setup {
        active: true,
        ..setup()
    }
}

#[test]
fn certification_survives_every_fault() {
    let (mut installs, mut torn, mut fsyncs, mut conflicts, mut audits) = (0, 0, 0, 0, 0);
    let (mut commits, mut list_commits) = (0, 0);
    let restarts = std::cell::Cell::new(0);
    check_seeds(60, "-p atomos-protocols --test certify_sim", |seed| {
        let o = simulate(seed, setup(), Faults::harsh());
        installs += count(&o, |n| {
            matches!(n, Note::Delivered(Delivery::Installed { .. }))
        });
        conflicts += count(&o, |n| match n {
            Note::Answer { response, .. } => {
                matches!(Answer::decode(response), Ok(Answer::Conflict { .. }))
            }
            _ => false,
        });
        audits += count(&o, |n| matches!(n, Note::Audit { .. }));
        restarts.set(restarts.get() + count(&o, |n| matches!(n, Note::Started { .. })));
        torn += o.run.torn;
        fsyncs += o.run.failed_fsyncs;
        commits += check(&o)?;
        list_commits += check_lists(&o)?;
        Ok(())
    });
    println!(
        "over the seeds: {commits} commits ({list_commits} list-append transactions), {conflicts} \
         conflicts answered, {audits} audits, \
         {installs} snapshot installs, {} starts, {torn} torn writes, {fsyncs} failed fsyncs",
        restarts.get()
    );
    assert!(installs > 0, "no replica caught up by state transfer");
    assert!(torn > 0, "no crash tore a write");
    assert!(conflicts > 0, "no certification ever failed: no contention");
    assert!(audits > 0);
}

/// Replicas lose their whole disk at a crash (one per run, perhaps more than once): each
/// rejoins by state transfer, withholds its vote until caught up, and nothing acknowledged is
/// lost.
#[test]
fn a_replica_whose_disk_is_wiped_rejoins_and_loses_nothing() {
    fn faults() -> Faults {
        Faults {
            wipe: 0.5,
            max_wiped_nodes: 1,
            ..Faults::harsh()
        }
    }
    let mut wiped = 0;
    check_seeds(40, "-p atomos-protocols --test certify_sim", |seed| {
        let o = simulate(seed, setup(), faults());
        wiped += o.run.wiped.len();
        check(&o)?;
        check_lists(&o)?;
        Ok(())
    });
    assert!(wiped > 0, "no disk was ever wiped");
    println!("wiped disks over the seeds: {wiped}");
}

#[test]
fn planted_bugs_are_caught() {
    let bug = PlantedBug::FirstReadOnly;
    let tried = seeds(40);
    let mut lists_caught = 0;
    let failing: Vec<(u64, String)> = tried
        .iter()
        .copied()
        .filter_map(|seed| {
            let s = Setup {
                bug: Some(bug),
                ..setup()
            };
            let o = simulate(seed, s, Faults::harsh());
            lists_caught += check_lists(&o).is_err() as usize;
            check(&o).err().map(|e| (seed, e))
        })
        .collect();
    // The list-append checker alone sees it too (lost appends, reads no order explains).
    assert!(
        lists_caught > 0,
        "the list-append history never showed {bug:?}"
    );
    assert!(
        !failing.is_empty(),
        "{bug:?} went unnoticed in {} seeds",
        tried.len()
    );
    println!(
        "{bug:?} fails {} of {} seeds (the list-append check alone {lists_caught}); first: seed \
         {}: {}",
        failing.len(),
        tried.len(),
        failing[0].0,
        failing[0].1
    );
}

/// `active`: transfers are procedures every replica runs speculatively at their optimistic
/// delivery and commits at their final one, with transfers and list-append transactions
/// written as closures certified between them. Every answer, and every replica's objects, are those of a serial run of the final
/// order without speculation (the model), whatever was revoked or lost in crashes.
#[test]
fn active_replication_survives_every_fault() {
    let (mut invoked, mut revoked) = (0, 0);
    let mut executed = atomos_core::ExecutorStats::default();
    check_seeds(60, "-p atomos-protocols --test certify_sim", |seed| {
        let o = simulate(seed, active_setup(), Faults::harsh());
        invoked += count(&o, |n| match n {
            Note::Answer { response, .. } => {
                matches!(Answer::decode(response), Ok(Answer::Invoked { .. }))
            }
            _ => false,
        });
        revoked += count(&o, |n| {
            matches!(n, Note::Delivered(Delivery::Revoke { .. }))
        });
        executed.speculated += o.executed.speculated;
        executed.confirmed += o.executed.confirmed;
        executed.rerun += o.executed.rerun;
        executed.revoked += o.executed.revoked;
        check(&o)?;
        check_lists(&o)?;
        Ok(())
    });
    println!(
        "over the seeds: {invoked} invocations answered, {revoked} revocations; at the end the \
         live replicas' executors had speculated {}, confirmed {}, run again {}, dropped {}",
        executed.speculated, executed.confirmed, executed.rerun, executed.revoked
    );
    assert!(invoked > 0, "no invocation was answered");
    assert!(executed.confirmed > 0, "no speculation was ever confirmed");
    assert!(
        executed.rerun > 0,
        "no invocation was ever run again: closures never invalidated a speculation"
    );
}

#[test]
fn committing_at_the_optimistic_delivery_is_caught() {
    let bug = PlantedBug::CommitAtOpt;
    let tried = seeds(40);
    let failing: Vec<(u64, String)> = tried
        .iter()
        .copied()
        .filter_map(|seed| {
            let s = Setup {
                bug: Some(bug),
                ..active_setup()
            };
            check(&simulate(seed, s, Faults::harsh()))
                .err()
                .map(|e| (seed, e))
        })
        .collect();
    assert!(
        !failing.is_empty(),
        "{bug:?} went unnoticed in {} seeds",
        tried.len()
    );
    println!(
        "{bug:?} fails {} of {} seeds; first: seed {}: {}",
        failing.len(),
        tried.len(),
        failing[0].0,
        failing[0].1
    );
}

#[test]
fn one_seed_gives_one_trace() {
    let a = simulate(7, setup(), Faults::harsh());
    let b = simulate(7, setup(), Faults::harsh());
    assert_eq!(a.run.trace, b.run.trace);
}
