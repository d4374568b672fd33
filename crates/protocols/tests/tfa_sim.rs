//! TFA in the simulator: every node runs list-append and bank transactions over objects that
//! migrate between them, under message loss, duplication, reordering, partitions, crashes and
//! restarts (with a disk that loses unsynced writes), and locks given up on.
//!
//! Checked on every seed: the list-append history recorded on all nodes is serializable; every
//! audit sees the bank's money whole; after the network heals, every object has at most one
//! owner, and one that has none is reported lost by its home (a crashed node's objects are lost:
//! TFA keeps one copy); a final read of every list sees every committed append to it, or is told
//! the list was lost; without a lost account the final balances add up; no lock is held and no
//! decision is left unconfirmed; a transaction fails only as lost or unavailable (what crashes
//! and partitions explain), never by running out of attempts.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-protocols --test tfa_sim`; run
//! 1,000: `ATOMOS_SIM_SEEDS=1000 cargo test -p atomos-protocols --test tfa_sim`. With
//! `DEBUG_TFA=PATTERN` a run prints each transaction's attempts, the crashes and restarts, the
//! trace lines containing PATTERN, and every node's view of each list.

use std::collections::BTreeMap;

use atomos_core::history::list_append::{self, ListOp};
use atomos_core::Key;
use atomos_protocols::tfa::{self, Action, Failure, PlantedBug, Reply, TfaConfig, TfaMsg, TfaNode};
use atomos_sim::workload::{self, BankOp, BankWorkload, ListAppendTxn, ListAppendWorkload};
use atomos_sim::{
    check_seeds, Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng,
};

const ACCOUNTS: u64 = 6;
const LIST_KEYS: u64 = 4;
const INITIAL: i64 = 100;
const MAX_ATTEMPTS: u32 = 60;
/// Final reads of list `i` have id `FINAL_READ + i`.
const FINAL_READ: u64 = 2_000_000;

fn account(i: u64) -> Key {
    Key::with_index("acct/", i)
}

fn list(i: u64) -> Key {
    Key::with_index("list/", i)
}

#[derive(Clone, Debug)]
enum Txn {
    /// Creates every account (run first, on one node).
    Setup,
    Lists(ListAppendTxn),
    Bank {
        id: u64,
        op: BankOp,
    },
}

impl Txn {
    fn id(&self) -> u64 {
        match self {
            Txn::Setup => 0,
            Txn::Lists(t) => t.id,
            Txn::Bank { id, .. } => *id,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Answer {
    Created,
    Lists(Vec<ListOp>),
    Transfer { done: bool },
    Audit(Vec<i64>),
}

#[derive(Clone, Debug)]
enum Note {
    Committed {
        id: u64,
        answer: Answer,
    },
    Failed {
        id: u64,
        failure: Failure,
    },
    /// The accounts were never there (the setup's node crashed before creating them).
    NeverCreated {
        id: u64,
    },
}

/// What a transaction program needs next, given what it has read so far.
enum Next {
    Read(Key),
    /// The accounts are not created yet: abandon this attempt and try again later.
    NotYet,
    Commit {
        writes: Vec<(Key, Option<Vec<u8>>)>,
        answer: Answer,
    },
}

fn enc<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("encodes")
}

fn dec<T: serde::de::DeserializeOwned>(b: &[u8]) -> T {
    postcard::from_bytes(b).expect("decodes")
}

/// Whether `txn` reads `key` to write it (then the node may lock it with the read). A list
/// transaction in two reads every key so, written or not: its locks on keys it leaves
/// unwritten are released at its end, and must not move those keys.
fn reads_to_write(txn: &Txn, key: &Key) -> bool {
    match txn {
        Txn::Setup
        | Txn::Bank {
            op: BankOp::Transfer { .. },
            ..
        } => true,
        Txn::Bank {
            op: BankOp::Audit, ..
        } => false,
        Txn::Lists(t) => {
            t.id % 2 == 0
                || t.ops
                    .iter()
                    .any(|op| matches!(op, ListOp::Append { key: k, .. } if list(*k) == *key))
        }
    }
}

/// Runs the program of `txn` over the reads made so far (`None`: missing object); like an
/// atomic section re-run by its closure, it asks for the first key it has not read yet.
fn program(txn: &Txn, seen: &BTreeMap<Key, Option<Vec<u8>>>) -> Next {
    macro_rules! get {
        ($key:expr) => {
            match seen.get(&$key) {
                Some(v) => v.clone(),
                None => return Next::Read($key),
            }
        };
    }
    match txn {
        Txn::Setup => {
            for i in 0..ACCOUNTS {
                get!(account(i));
            }
            Next::Commit {
                writes: (0..ACCOUNTS)
                    .map(|i| (account(i), Some(enc(&INITIAL))))
                    .collect(),
                answer: Answer::Created,
            }
        }
        Txn::Lists(t) => {
            let mut buffered: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            let mut ops = Vec::new();
            for op in &t.ops {
                let key = match op {
                    ListOp::Read { key, .. } | ListOp::Append { key, .. } => *key,
                };
                let l = match buffered.entry(key) {
                    std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::btree_map::Entry::Vacant(e) => {
                        let v = get!(list(key));
                        e.insert(v.map(|b| dec(&b)).unwrap_or_default())
                    }
                };
                match op {
                    ListOp::Read { .. } => ops.push(ListOp::Read {
                        key,
                        seen: l.clone(),
                    }),
                    ListOp::Append { value, .. } => {
                        l.push(*value);
                        ops.push(op.clone());
                    }
                }
            }
            let writes = t
                .ops
                .iter()
                .filter_map(|op| match op {
                    ListOp::Append { key, .. } => Some(*key),
                    ListOp::Read { .. } => None,
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .map(|k| (list(k), Some(enc(&buffered[&k]))))
                .collect();
            Next::Commit {
                writes,
                answer: Answer::Lists(ops),
            }
        }
        Txn::Bank {
            op: BankOp::Transfer { from, to, amount },
            ..
        } => {
            let (Some(a), Some(b)) = (get!(account(*from)), get!(account(*to))) else {
                return Next::NotYet;
            };
            let (a, b): (i64, i64) = (dec(&a), dec(&b));
            let amount = *amount as i64;
            if a < amount {
                return Next::Commit {
                    writes: vec![],
                    answer: Answer::Transfer { done: false },
                };
            }
            Next::Commit {
                writes: vec![
                    (account(*from), Some(enc(&(a - amount)))),
                    (account(*to), Some(enc(&(b + amount)))),
                ],
                answer: Answer::Transfer { done: true },
            }
        }
        Txn::Bank {
            op: BankOp::Audit, ..
        } => {
            let mut balances = Vec::new();
            for i in 0..ACCOUNTS {
                match get!(account(i)) {
                    Some(b) => balances.push(dec::<i64>(&b)),
                    None => return Next::NotYet,
                }
            }
            Next::Commit {
                writes: vec![],
                answer: Answer::Audit(balances),
            }
        }
    }
}

struct Running {
    txn: Txn,
    attempt: u32,
    seen: BTreeMap<Key, Option<Vec<u8>>>,
    answer: Option<Answer>,
    /// Waiting out a back-off before the next attempt.
    restart_at: Option<u64>,
}

/// A simulated node: a TFA node and the transaction programs its application runs.
struct SimNode {
    me: NodeId,
    tfa: TfaNode,
    running: BTreeMap<u64, Running>,
    rng: SimRng,
}

impl SimNode {
    /// A node (re)started: it reads its home records back from its log and starts without
    /// objects, under a new incarnation.
    fn boot(boot: Boot, nodes: usize, cfg: TfaConfig, seed: u64) -> Result<SimNode, String> {
        let me = boot.node;
        let members = (1..=nodes as u64).collect();
        let tfa = TfaNode::open(me, members, boot.incarnation, cfg, &boot.log)
            .map_err(|e| e.to_string())?;
        Ok(SimNode {
            me,
            tfa,
            running: BTreeMap::new(),
            rng: SimRng::new(seed ^ (me * 0x9e37) ^ (boot.incarnation << 40)),
        })
    }

    /// Moves transaction `h` on: its next read, or its commit.
    fn advance(
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

    fn start_attempt(
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
    fn drive(&mut self, now: u64, mut acts: Vec<Action>, out: &mut Vec<Output<TfaMsg, Note>>) {
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

    fn answer(
        &mut self,
        now: u64,
        h: u64,
        reply: Reply,
        acts: &mut Vec<Action>,
        out: &mut Vec<Output<TfaMsg, Note>>,
    ) {
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
fn sim_tfa_config() -> TfaConfig {
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

struct Outcome {
    run: Run<Note>,
    submitted: Vec<ListAppendTxn>,
    end: Result<Final, String>,
}

fn simulate(seed: u64, nodes: usize, faults: Faults, bug: Option<PlantedBug>) -> Outcome {
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
        run,
        submitted,
        end,
    }
}

/// What the run ended with.
struct Final {
    /// Each account's balance, `None` if it was lost.
    balances: Vec<Option<i64>>,
    /// Accounts nobody holds and nobody reports lost: never created.
    absent: Vec<u64>,
    /// Objects lost (reported so by their home).
    lost: usize,
    /// Each list as its one holder has it after the run; `None`: nobody holds it (lost, or
    /// never appended to).
    lists: Vec<Option<Vec<u64>>>,
    /// The lists their homes report lost.
    lost_lists: Vec<u64>,
}

/// After the run: every object owned by at most one node, one owned by none reported lost by
/// its home, no lock held, nothing unconfirmed.
fn final_state(machines: &[&SimNode]) -> Result<Final, String> {
    for m in machines {
        let held = m.tfa.objects().locks_held();
        if held > 0 {
            return Err(format!("node {} still holds {held} locks", m.me));
        }
    }
    for m in machines {
        let (active, decided, tracking) = m.tfa.in_flight();
        let requests = m.tfa.pending_requests();
        if requests > 0 {
            return Err(format!(
                "node {} remembers {requests} requests: {:?}",
                m.me,
                m.tfa.describe_active()
            ));
        }
        if active + decided + tracking > 0 {
            return Err(format!(
                "node {}: {active} transactions, {decided} decisions, {tracking} directory \
                 updates still in flight {:?}",
                m.me,
                m.tfa.describe_active()
            ));
        }
    }
    let describe = |key: &Key| {
        machines
            .iter()
            .map(|m| m.tfa.describe_key(key))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let owners = |key: &Key| -> Vec<(NodeId, Option<Vec<u8>>)> {
        machines
            .iter()
            .filter_map(|m| {
                m.tfa
                    .objects()
                    .get(key)
                    .filter(|h| h.version > 0)
                    .map(|h| (m.me, h.value.map(<[u8]>::to_vec)))
            })
            .collect()
    };
    let reported_lost = |key: &Key| {
        machines
            .iter()
            .any(|m| m.tfa.home(key) == m.me && m.tfa.home_record(key).is_some_and(|r| r.lost))
    };
    let mut lost = 0;
    let (mut lists, mut lost_lists) = (Vec::new(), Vec::new());
    for i in 0..LIST_KEYS {
        let key = list(i);
        let o = owners(&key);
        if o.len() > 1 {
            return Err(format!("list {i} has owners {o:?}\n{}", describe(&key)));
        }
        if o.is_empty() && reported_lost(&key) {
            lost += 1;
            lost_lists.push(i);
        }
        lists.push(match o.as_slice() {
            [(_, Some(v))] => Some(dec(v)),
            _ => None,
        });
    }
    let mut balances = Vec::new();
    let mut absent = Vec::new();
    for i in 0..ACCOUNTS {
        let key = account(i);
        match owners(&key).as_slice() {
            [(_, Some(v))] => balances.push(Some(dec(v))),
            [] if reported_lost(&key) => {
                lost += 1;
                balances.push(None);
            }
            [] => {
                absent.push(i);
                balances.push(None);
            }
            other => {
                return Err(format!(
                    "account {i} has owners {other:?}\n{}",
                    describe(&key)
                ))
            }
        }
    }
    Ok(Final {
        balances,
        absent,
        lost,
        lists,
        lost_lists,
    })
}

/// When the final read of list `key` is asked for (once the faults are over and every node is
/// back).
fn final_read_at(key: u64) -> u64 {
    9_000 + key * 10
}

fn check(o: &Outcome) -> Result<(), String> {
    // Each committed list transaction, with when it committed.
    let committed: Vec<(u64, NodeId, u64, Vec<ListOp>)> = o
        .run
        .notes
        .iter()
        .filter_map(|(t, node, n)| match n {
            Note::Committed {
                id,
                answer: Answer::Lists(ops),
            } => Some((*t, *node, *id, ops.clone())),
            _ => None,
        })
        .collect();
    let done: Vec<(NodeId, u64, Vec<ListOp>)> = committed
        .iter()
        .map(|(_, node, id, ops)| (*node, *id, ops.clone()))
        .collect();
    // A failed transaction committed nothing: it is left out of the history. Only the faults
    // explain a failure: an object lost with a crashed node, or a node that did not answer.
    let failures: Vec<(u64, &Failure)> = o
        .run
        .notes
        .iter()
        .filter_map(|(_, _, n)| match n {
            Note::Failed { id, failure } => Some((*id, failure)),
            _ => None,
        })
        .collect();
    let setup_done = o
        .run
        .notes
        .iter()
        .any(|(_, _, n)| matches!(n, Note::Committed { id: 0, .. }));
    for (_, node, n) in &o.run.notes {
        if let (Note::NeverCreated { id }, true) = (n, setup_done) {
            return Err(format!(
                "transaction {id} on node {node} never saw the accounts"
            ));
        }
    }
    for (id, failure) in &failures {
        let explained = match failure {
            Failure::Lost { .. } => true,
            Failure::Unavailable { .. } => *id < FINAL_READ,
            _ => false,
        };
        if !explained {
            return Err(format!("transaction {id} failed: {failure:?}"));
        }
    }
    let failed: std::collections::BTreeSet<u64> = failures.iter().map(|(id, _)| *id).collect();
    let submitted: Vec<ListAppendTxn> = o
        .submitted
        .iter()
        .filter(|t| !failed.contains(&t.id))
        .cloned()
        .collect();
    let history = workload::list_history(&submitted, done.iter().cloned());
    list_append::check(&history).map_err(|e| e.to_string())?;
    // Every append committed before the final read of its list was asked for is seen by it,
    // unless the list was lost. (One still retrying then may commit after it: the history
    // check above orders those.)
    for key in 0..LIST_KEYS {
        let final_read = done.iter().find(|(_, id, _)| *id == FINAL_READ + key);
        let seen = match final_read.map(|(_, _, ops)| ops.as_slice()) {
            Some([ListOp::Read { seen, .. }]) => seen,
            Some(other) => return Err(format!("final read of list {key} did {other:?}")),
            None if failed.contains(&(FINAL_READ + key)) => continue, // lost, and told so
            None => return Err(format!("the final read of list {key} never finished")),
        };
        for (_, _, id, ops) in committed.iter().filter(|c| c.0 < final_read_at(key)) {
            for op in ops {
                if let ListOp::Append { key: k, value } = op {
                    if *k == key && !seen.contains(value) {
                        return Err(format!(
                            "append {value} to list {key} by committed transaction {id} is \
                             lost: the final read saw {seen:?}"
                        ));
                    }
                }
            }
        }
    }
    let total = INITIAL * ACCOUNTS as i64;
    for (t, node, n) in &o.run.notes {
        if let Note::Committed {
            answer: Answer::Audit(b),
            ..
        } = n
        {
            if b.iter().sum::<i64>() != total {
                return Err(format!("audit at {t} on node {node} saw {b:?}"));
            }
        }
    }
    let end = o.end.as_ref().map_err(Clone::clone)?;
    // Every committed append, however late, is in its list's last copy, unless the list was
    // reported lost (a copy lost and re-created from nothing would miss the older appends:
    // lost lists are never re-created).
    for (_, id, ops) in &done {
        for op in ops {
            if let ListOp::Append { key, value } = op {
                let last = end.lists.get(*key as usize).and_then(Option::as_ref);
                let kept = last.is_some_and(|l| l.contains(value));
                if !kept && !end.lost_lists.contains(key) {
                    return Err(format!(
                        "append {value} to list {key} by committed transaction {id} is not \
                         in the list's last copy {last:?}"
                    ));
                }
            }
        }
    }
    if setup_done && !end.absent.is_empty() {
        return Err(format!(
            "accounts {:?} were created, nobody holds them, and nobody reports them lost",
            end.absent
        ));
    }
    if end.balances.iter().all(Option::is_some) {
        let sum: i64 = end.balances.iter().flatten().sum();
        if sum != total {
            return Err(format!("final balances {:?}", end.balances));
        }
    }
    Ok(())
}

fn committed(o: &Outcome) -> usize {
    o.run
        .notes
        .iter()
        .filter(|(_, _, n)| matches!(n, Note::Committed { .. }))
        .count()
}

/// Every fault but crashes (nor failed fsyncs, which crash a node).
fn network_faults() -> Faults {
    Faults {
        crash: 0.0,
        fsync_fail: 0.0,
        ..Faults::harsh()
    }
}

/// Every fault, crashes included (a node crashes about once a run).
fn all_faults() -> Faults {
    Faults {
        crash: 0.003,
        ..Faults::harsh()
    }
}

fn crashes(o: &Outcome) -> usize {
    o.run.trace.iter().filter(|l| l.contains(" crash ")).count()
}

#[test]
fn histories_are_serializable_and_nothing_is_lost_unreported_under_crashes_and_faults() {
    let (mut crashed, mut lost, mut runs) = (0, 0, 0);
    check_seeds(60, "-p atomos-protocols --test tfa_sim", |seed| {
        let o = simulate(seed, 4, all_faults(), None);
        check(&o)?;
        runs += 1;
        crashed += crashes(&o);
        lost += o.end.as_ref().map_or(0, |e| e.lost);
        Ok(())
    });
    // The faults did what they are for: nodes crashed and objects were lost (and reported).
    assert!(crashed >= runs, "{crashed} crashes in {runs} runs");
    assert!(lost > 0, "no object was ever lost in {runs} runs");
}

/// Faults without crashes (nor failed fsyncs, which crash a node): nothing is lost, so nearly
/// everything commits.
#[test]
fn under_network_faults_alone_nearly_everything_commits() {
    check_seeds(30, "-p atomos-protocols --test tfa_sim", |seed| {
        let o = simulate(seed, 4, network_faults(), None);
        check(&o)?;
        let n = committed(&o);
        if n < 150 {
            return Err(format!("only {n} of 205 transactions committed"));
        }
        Ok(())
    });
}

#[test]
fn without_faults_everything_commits() {
    check_seeds(10, "-p atomos-protocols --test tfa_sim", |seed| {
        let o = simulate(seed, 3, Faults::none(), None);
        check(&o)?;
        let n = committed(&o);
        if n != 205 {
            return Err(format!("{n} of 205 transactions committed"));
        }
        if o.end.as_ref().map_or(1, |e| e.lost) != 0 {
            return Err("an object was lost without a fault".into());
        }
        Ok(())
    });
}

/// Seeds that once failed: each found a defect (fixed since).
#[test]
fn seeds_that_found_defects() {
    // 486: a home's record of a restart reached its disk without the losses it implied;
    // 632: a loss reported to a home was taken as confirmed by the home's answer to a move of
    // the same version; 2760 (reads forwarded): a late duplicate of a read for a write locked
    // an object for a transaction that had been told "busy" and went on without that lock;
    // asked about it after the lease, its node answered "abort" but kept the number, so the
    // abort released the lock the transaction took at commit, and the object forked.
    for seed in [486, 632, 2760] {
        if let Err(e) = check(&simulate(seed, 4, all_faults(), None)) {
            panic!("seed {seed}: {e}");
        }
    }
    // Under network faults alone, 96: with reads for writes taking locks and too short a
    // pause after contention, readers waited out whole transactions and one transaction kept
    // retrying until after the final reads; 1429 (reads forwarded): one did, and the check
    // required the final read to see its append.
    for seed in [96, 1429] {
        if let Err(e) = check(&simulate(seed, 4, network_faults(), None)) {
            panic!("seed {seed}: {e}");
        }
    }
}

/// The first of `seeds` on which the simulation, running `bug`, fails its checks.
fn first_caught(bug: PlantedBug, faults: &Faults, seeds: u64) -> (u64, String) {
    (0..seeds)
        .find_map(|seed| {
            check(&simulate(seed, 4, faults.clone(), Some(bug)))
                .err()
                .map(|e| (seed, e))
        })
        .unwrap_or_else(|| panic!("{seeds} seeds ran {bug:?} and none failed"))
}

/// The simulation catches planted defects: a restarted committer's locks released (the old
/// copies kept) instead of dropped as lost; a restarted home that forgets its records; a read
/// for a write that takes no lock; a commit that takes objects it locked but did not write.
/// The first two show when a node crashes at the wrong moment, so their faults crash nodes and
/// lose messages often; the last two show under network faults alone (a crash would turn the
/// objects they orphan into objects reported lost). The same seeds pass without the defect.
#[test]
fn planted_bugs_are_caught() {
    let crashing = Faults {
        crash: 0.02,
        drop: 0.2,
        ..Faults::harsh()
    };
    let network = network_faults();
    for (bug, faults) in [
        (PlantedBug::ReleaseInDoubt, &crashing),
        (PlantedBug::ForgetHomeRecords, &crashing),
        (PlantedBug::UnlockedWriteRead, &network),
        (PlantedBug::SurrenderUnnamed, &network),
    ] {
        let (seed, error) = first_caught(bug, faults, 500);
        eprintln!("seed {seed} caught {bug:?}: {error}");
        check(&simulate(seed, 4, faults.clone(), None))
            .unwrap_or_else(|e| panic!("seed {seed} without {bug:?}: {e}"));
    }
}
