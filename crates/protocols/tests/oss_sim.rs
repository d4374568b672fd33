//! OSS in the simulator: three nodes run list-append transactions, bank transfers and
//! node-local counters over OSS (ultra-peer sequencing, epochs through the control log) with
//! loss, duplication, delay, partitions, crashes, restarts and disks that lose unsynced
//! writes. Checks: the list-append history is serializable, every audit finds the bank's
//! total, the live nodes end with the same replicated objects, no acknowledged local commit is
//! lost, and commits happened.

use std::collections::BTreeMap;
use std::sync::Arc;

use atomos_core::history::list_append::ListOp;
use atomos_core::{Engine, EngineConfig, Key, TRef, TxError, TxOptions};
use atomos_protocols::oss::{
    CommitMode, OssBug, OssConfig, OssDelivery, OssError, OssMsg, OssNode, OssRequest,
};
use atomos_sim::workload::{
    bank_total, check_list_run, execute_list_ops_on, list, Capture, ListAppendTxn,
    ListAppendWorkload,
};
use atomos_sim::{Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng};
use parking_lot::Mutex;

const NODES: usize = 3;
const ACCOUNTS: u64 = 5;
const INITIAL: i64 = 100;
/// Transactions each incarnation of a node starts at most.
const TX_PER_RUN: u64 = 40;

use atomos_sim::workload::bank_account as account;

/// List keys from `LOCAL_LISTS * node` on are node `node`'s own (under `local/`).
const LOCAL_LISTS: u64 = 1_000;

/// The object of list `key`: a shared list, or a node's own.
fn list_object(key: u64) -> TRef<Vec<u64>> {
    if key >= LOCAL_LISTS {
        TRef::new(Key::with_index("local/list/", key))
    } else {
        list(key)
    }
}

fn counter() -> TRef<u64> {
    TRef::new("local/counter")
}

/// How many transfers this node committed (written with each transfer: a commit of
/// replicated and node-local keys at once).
fn transfers_here() -> TRef<u64> {
    TRef::new("local/transfers")
}

/// Reads a u64 that may not exist yet.
fn read_or_zero(tx: &mut atomos_core::Tx<'_>, r: &TRef<u64>) -> Result<u64, TxError> {
    Ok(if tx.exists(r)? { *tx.read(r)? } else { 0 })
}

fn write_u64(tx: &mut atomos_core::Tx<'_>, r: &TRef<u64>, v: u64) -> Result<(), TxError> {
    if tx.exists(r)? {
        tx.write(r, v)
    } else {
        tx.create(r, v)
    }
}

#[derive(Clone, Debug)]
enum Note {
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
}

/// What a commit in flight was.
enum Waiting {
    List(u64, Vec<ListOp>),
    Count(u64),
    Transfer,
}

struct Node {
    oss: OssNode,
    engine: Arc<Engine>,
    capture: Arc<Capture>,
    rng: SimRng,
    lists: ListAppendWorkload,
    origin: u64,
    started: u64,
    next_caller: u64,
    waiting: BTreeMap<u64, Waiting>,
    /// The most control-log proposals this node had in flight at once.
    control_in_flight_max: usize,
}

impl Node {
    fn boot(seed: u64, mode: CommitMode, bug: Option<OssBug>, boot: Boot) -> Result<Node, String> {
        let members: Vec<u64> = (1..=NODES as u64).collect();
        let mut cfg = OssConfig::new(boot.node, members);
        cfg.commit = mode;
        // Lists in domain 0, accounts in a domain of their own.
        cfg.domains = vec![String::new(), "acct/".into()];
        cfg.replica.seed = seed.wrapping_mul(31).wrapping_add(boot.node) ^ (boot.incarnation << 32);
        cfg.replica.retry_ticks = 5;
        cfg.planted_bug = bug;
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
    fn run(
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

    fn transact(&mut self, out: &mut Vec<Output<OssMsg, Note>>) -> Result<(), OssError> {
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

    fn audit(&self, out: &mut Vec<Output<OssMsg, Note>>) {
        if let Ok(Some(total)) = bank_total(&self.engine, ACCOUNTS) {
            out.push(Output::Deliver(Note::Audit { total }));
        }
    }

    fn carry(
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
        self.oss.step(now, input, &mut inner)?;
        self.control_in_flight_max = self
            .control_in_flight_max
            .max(self.oss.control_proposals_in_flight());
        self.carry(inner, out);
        Ok(())
    }
}

struct Outcome {
    run: Run<Note>,
    /// Each live node: its replicated objects, its local counter and its count of transfers.
    finals: Vec<(NodeId, Vec<atomos_core::SnapshotObject>, u64, u64)>,
    /// Each live node's applied watermark and digest of what it applied, per domain.
    digests: Vec<(NodeId, [Option<Digest>; 2])>,
    /// The lists as the first live node ends with them.
    lists: BTreeMap<u64, Vec<u64>>,
    commits: u64,
    epochs: u64,
    /// Tokens the live nodes passed.
    passes: u64,
    /// The most control-log proposals a live node had in flight at once.
    control_in_flight_max: usize,
}

/// A domain's applied watermark and the digest of what was applied through it.
type Digest = (u64, u64);

fn simulate(seed: u64, mode: CommitMode, bug: Option<OssBug>, faults: Faults) -> Outcome {
    simulate_modes(seed, [mode; NODES], bug, faults)
}

/// [`simulate`] with each node configured with its own commit mode.
fn simulate_modes(
    seed: u64,
    modes: [CommitMode; NODES],
    bug: Option<OssBug>,
    faults: Faults,
) -> Outcome {
    let cfg = SimConfig {
        seed,
        nodes: NODES,
        crashable: NODES,
        tick_every: 10,
        fault_until: 4_000,
        settle: 8_000,
        faults,
    };
    let mut sim = Sim::new(cfg, move |boot| {
        let mode = modes[(boot.node as usize - 1) % NODES];
        Node::boot(seed, mode, bug, boot)
    });
    let run = sim.run();
    let mut finals = Vec::new();
    let mut lists = BTreeMap::new();
    let (mut commits, mut epochs) = (0, 0);
    let mut digests = Vec::new();
    let mut passes = 0;
    let mut control_in_flight_max = 0;
    for node in 1..=NODES as NodeId {
        if let Some(n) = sim.machine(node) {
            control_in_flight_max = control_in_flight_max.max(n.control_in_flight_max);
            let objects: Vec<_> = n
                .engine
                .snapshot_objects()
                .unwrap_or_default()
                .into_iter()
                .filter(|(k, _, _)| !k.as_bytes().starts_with(b"local/"))
                .map(|(k, _, v)| (k, 0, v))
                .collect();
            let opts = TxOptions {
                read_only: true,
                ..TxOptions::default()
            };
            let (count, transfers) = n
                .engine
                .run(&opts, |tx| {
                    Ok::<_, TxError>((
                        read_or_zero(tx, &counter())?,
                        read_or_zero(tx, &transfers_here())?,
                    ))
                })
                .unwrap_or((0, 0));
            // The shared lists as the first live node has them; each node's own lists.
            let keys: Vec<u64> = if lists.is_empty() {
                (0..8).collect()
            } else {
                Vec::new()
            };
            let own = (0..8).map(|k| LOCAL_LISTS * node + k);
            for k in keys.into_iter().chain(own) {
                let r = list_object(k);
                let l = n
                    .engine
                    .run(&opts, |tx| {
                        Ok::<_, TxError>(if tx.exists(&r)? {
                            tx.read(&r)?.clone()
                        } else {
                            Vec::new()
                        })
                    })
                    .unwrap_or_default();
                lists.insert(k, l);
            }
            let c = n.oss.counters();
            commits += c.commits + c.local_commits;
            epochs = epochs.max(c.epochs);
            passes += c.token_passes;
            finals.push((node, objects, count, transfers));
            digests.push((node, [0, 1].map(|d| n.oss.applied_digest(d))));
        }
    }
    Outcome {
        run,
        finals,
        digests,
        lists,
        commits,
        epochs,
        passes,
        control_in_flight_max,
    }
}

fn check(o: &Outcome) -> Result<usize, String> {
    for (t, node, note) in &o.run.notes {
        if let Note::Audit { total } = note {
            if *total != INITIAL * ACCOUNTS as i64 {
                return Err(format!("node {node} at {t}: audit found {total}"));
            }
        }
    }
    // Every acknowledged local count survives on its node (its last run's, or a later one).
    let mut acked: BTreeMap<NodeId, u64> = BTreeMap::new();
    for (_, node, note) in &o.run.notes {
        if let Note::Counted(n) = note {
            let e = acked.entry(*node).or_default();
            *e = (*e).max(*n);
        }
    }
    // Node-local objects live on their node's disk alone: a wiped disk loses them.
    let wiped: Vec<NodeId> = o.run.wiped.iter().map(|(_, n)| *n).collect();
    for (node, _, count, _) in o.finals.iter().filter(|f| !wiped.contains(&f.0)) {
        if let Some(&a) = acked.get(node) {
            if *count < a {
                return Err(format!(
                    "node {node}: local counter {count}, {a} was acknowledged"
                ));
            }
        }
    }
    // The node-local part of every acknowledged transfer survives with its replicated part.
    let mut transferred: BTreeMap<NodeId, u64> = BTreeMap::new();
    for (_, node, note) in &o.run.notes {
        if let Note::Transferred = note {
            *transferred.entry(*node).or_default() += 1;
        }
    }
    for (node, _, _, transfers) in o.finals.iter().filter(|f| !wiped.contains(&f.0)) {
        let acked = transferred.get(node).copied().unwrap_or(0);
        if *transfers < acked {
            return Err(format!(
                "node {node}: {acked} transfers acknowledged, its local count says {transfers}"
            ));
        }
    }
    // Every acknowledged append is in the lists the cluster ends with.
    for (t, node, note) in &o.run.notes {
        if let Note::ListDone { ops, .. } = note {
            for op in ops {
                if let ListOp::Append { key, value } = op {
                    // A node's own lists die with its disk.
                    if *key >= LOCAL_LISTS && wiped.contains(&(key / LOCAL_LISTS)) {
                        continue;
                    }
                    if !o.lists.get(key).is_some_and(|l| l.contains(value)) {
                        return Err(format!(
                            "node {node} at {t}: append of {value} to list {key} acknowledged, \
                             then lost"
                        ));
                    }
                }
            }
        }
    }
    // No commit id was used twice: nodes that applied as far applied the same commits.
    for (i, (a, da)) in o.digests.iter().enumerate() {
        for (b, db) in &o.digests[i + 1..] {
            for (x, y) in da.iter().zip(db) {
                if let (Some((wa, ha)), Some((wb, hb))) = (x, y) {
                    if wa == wb && ha != hb {
                        return Err(format!(
                            "nodes {a} and {b} applied different commits through id {wa}"
                        ));
                    }
                }
            }
        }
    }
    // The live nodes converged.
    if let Some((first, objects, _, _)) = o.finals.first() {
        for (node, other, _, _) in &o.finals[1..] {
            if other != objects {
                return Err(format!(
                    "nodes {first} and {node} ended with different objects"
                ));
            }
        }
    }
    let aborted: std::collections::BTreeSet<u64> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::ListAborted { id } => Some(*id),
            _ => None,
        })
        .collect();
    // The lists of a node whose disk was wiped lost their history with it: left out.
    let kept = |ops: &[ListOp]| -> Vec<ListOp> {
        ops.iter()
            .filter(|op| {
                let (ListOp::Read { key, .. } | ListOp::Append { key, .. }) = op;
                *key < LOCAL_LISTS || !wiped.contains(&(key / LOCAL_LISTS))
            })
            .cloned()
            .collect()
    };
    let runs = o.run.notes.iter().filter_map(|(_, _, n)| match n {
        Note::ListRun(t) => Some(ListAppendTxn {
            id: t.id,
            ops: kept(&t.ops),
        }),
        _ => None,
    });
    let done = o.run.notes.iter().filter_map(|(_, node, n)| match n {
        Note::ListDone { id, ops } => Some((*node, *id, kept(ops))),
        _ => None,
    });
    check_list_run(runs, &aborted, done)
}

fn seeds(default: u64) -> u64 {
    std::env::var("ATOMOS_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const TOKENS: [CommitMode; 2] = [CommitMode::DistributedToken, CommitMode::CoordinatorToken];

fn failure_free(mode: CommitMode) {
    for seed in 0..5 {
        let o = simulate(seed, mode, None, Faults::none());
        let lists = check(&o).unwrap_or_else(|e| panic!("{mode:?} seed {seed}: {e}"));
        assert!(
            o.commits > 20,
            "{mode:?} seed {seed}: only {} commits",
            o.commits
        );
        assert!(
            lists > 5,
            "{mode:?} seed {seed}: {lists} list transactions committed"
        );
        assert_eq!(o.finals.len(), NODES);
        if mode != CommitMode::UltraPeer {
            assert!(
                o.passes > 10,
                "{mode:?} seed {seed}: {} token passes",
                o.passes
            );
        }
    }
}

fn with_every_fault(mode: CommitMode, default_seeds: u64) {
    let mut epochs = 0;
    let mut commits = 0;
    for seed in 0..seeds(default_seeds) {
        let o = simulate(seed, mode, None, Faults::harsh());
        if let Err(e) = check(&o) {
            panic!("{mode:?} seed {seed}: {e}");
        }
        // A node cut off from a majority re-proposes its suspicions: one at a time.
        assert!(
            o.control_in_flight_max <= 1,
            "{mode:?} seed {seed}: {} control proposals in flight at once",
            o.control_in_flight_max
        );
        epochs = epochs.max(o.epochs);
        commits += o.commits;
    }
    eprintln!("{mode:?}: {commits} commits; at most {epochs} epochs started on a node in one run");
    assert!(commits > 100, "only {commits} commits over the seeds");
    assert!(epochs > 1, "no epoch ever changed");
}

fn with_a_wiped_disk(mode: CommitMode, default_seeds: u64) {
    let mut wiped = 0;
    for seed in 0..seeds(default_seeds) {
        let mut faults = Faults::harsh();
        faults.wipe = 0.3;
        faults.max_wiped_nodes = 1;
        let o = simulate(seed, mode, None, faults);
        if let Err(e) = check(&o) {
            panic!("{mode:?} seed {seed}: {e}");
        }
        wiped += usize::from(!o.run.wiped.is_empty());
    }
    assert!(wiped > 3, "only {wiped} runs wiped a disk");
}

#[test]
fn failure_free_runs_commit_and_converge() {
    failure_free(CommitMode::UltraPeer);
}

#[test]
fn failure_free_runs_commit_and_converge_with_a_token() {
    for mode in TOKENS {
        failure_free(mode);
    }
}

#[test]
fn runs_with_every_fault_stay_serializable_and_lose_nothing_acknowledged() {
    with_every_fault(CommitMode::UltraPeer, 40);
}

#[test]
fn token_runs_with_every_fault_stay_serializable_and_lose_nothing_acknowledged() {
    for mode in TOKENS {
        with_every_fault(mode, 40);
    }
}

#[test]
fn a_node_that_lost_its_disk_rejoins_without_losing_anything_acknowledged() {
    with_a_wiped_disk(CommitMode::UltraPeer, 40);
}

#[test]
fn a_token_node_that_lost_its_disk_rejoins_without_losing_anything_acknowledged() {
    for mode in TOKENS {
        with_a_wiped_disk(mode, 20);
    }
}

#[test]
fn counting_a_write_set_stable_before_a_majority_holds_it_is_caught() {
    let caught = (0..40).find(|&seed| {
        let o = simulate(
            seed,
            CommitMode::UltraPeer,
            Some(OssBug::StableAtOne),
            Faults::harsh(),
        );
        check(&o).is_err()
    });
    assert!(caught.is_some(), "the planted bug went unnoticed");
}

#[test]
fn a_sequencer_that_skips_validation_is_caught() {
    let caught = (0..20).any(|seed| {
        let o = simulate(
            seed,
            CommitMode::UltraPeer,
            Some(OssBug::SkipValidation),
            Faults::none(),
        );
        check(&o).is_err()
    });
    assert!(caught, "the planted bug went unnoticed");
}

#[test]
fn a_token_taken_twice_is_caught() {
    let caught = (0..40).find(|&seed| {
        let o = simulate(
            seed,
            CommitMode::DistributedToken,
            Some(OssBug::TokenTakenTwice),
            Faults::harsh(),
        );
        check(&o)
            .map_err(|e| eprintln!("seed {seed}: {e}"))
            .is_err()
    });
    assert!(caught.is_some(), "the planted bug went unnoticed");
}

/// Nodes configured with different commit modes follow the one the first epoch's start
/// carried: they commit and converge with faults as a cluster configured alike does.
#[test]
fn nodes_configured_differently_follow_the_mode_the_log_decided() {
    let modes = [
        CommitMode::UltraPeer,
        CommitMode::DistributedToken,
        CommitMode::CoordinatorToken,
    ];
    let mut commits = 0;
    for seed in 0..seeds(10) {
        let o = simulate_modes(seed, modes, None, Faults::harsh());
        if let Err(e) = check(&o) {
            panic!("seed {seed}: {e}");
        }
        commits += o.commits;
    }
    assert!(commits > 100, "only {commits} commits");
}
