//! Fuzzing of every decoder a node runs on bytes from a peer, each followed by the state
//! machine that receives the message: the wire frame (`LinkFrame<Envelope<NodeMsg>>`), the TFA
//! and order-layer messages inside it, and the Raft messages and snapshots inside those. The TFA
//! node and the order replica under fuzzing each run among two honest peers, so they have state
//! to get wrong (objects, locks, a log, a leader, snapshots).
//!
//! Inputs are raw bytes, valid encodings with bytes flipped, inserted or cut, and
//! structure-aware messages built by `arbitrary` (then encoded and decoded like any other).
//! Every outcome must be a decode error or a step of the receiving machine; checked: no panic,
//! no input that makes a decode or a step allocate more than 64 MiB, and no change of state
//! from an input the machine refuses (a TFA clock beyond the protocol's bound, a message from a
//! non-member of the order layer, a snapshot that does not decode).
//!
//! `ATOMOS_FUZZ_INPUTS=N` sets the inputs per target (default 20,000);
//! `ATOMOS_FUZZ_SEED=S` the first seed. On demand, ten million inputs:
//! `ATOMOS_FUZZ_INPUTS=10000000 cargo test --release -p atomos --test fuzz_decoders`.

use atomos_seam::stable::SplitMix64;
use rand_core::{RngCore, SeedableRng};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use arbitrary::{Arbitrary, Unstructured};
use atomos::net::rpc::Envelope;
use atomos::net::tcp::LinkFrame;
use atomos::net::wire;
use atomos::order::{OrderMsg, Register, Replica, ReplicaConfig};
use atomos::protocols::oss::{OssConfig, OssNode};
use atomos::protocols::tfa::clock::MAX_CLOCK;
use atomos::protocols::tfa::{Reply, TfaConfig, TfaMsg, TfaNode, TfaRequest};
use atomos::Key;
use atomos::NodeMsg;
use atomos_seam::{Input, Machine};
use prost::Message as _;
use raft::eraftpb::{
    ConfState, Entry, EntryType, Message, MessageType, Snapshot, SnapshotMetadata,
};

/// Counts live heap bytes and the peak since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Most bytes one input may add to the heap at its peak.
const MAX_GROWTH: usize = 64 << 20;

/// Runs `f` and fails if the heap grew by more than `MAX_GROWTH` at any moment. The tests in
/// this file run one at a time (see `serial`), so the count is theirs.
fn bounded<R>(what: &str, f: impl FnOnce() -> R) -> R {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let r = f();
    let grew = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    assert!(grew <= MAX_GROWTH, "{what}: the heap grew by {grew} bytes");
    r
}

/// One test at a time, so the allocation counts are not mixed.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn inputs() -> u64 {
    std::env::var("ATOMOS_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn first_seed() -> u64 {
    std::env::var("ATOMOS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A small deterministic generator.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// `valid` with a few random bytes flipped, inserted or cut.
fn mutate(rng: &mut Rng, mut valid: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(valid.len() as u64 + 1) as usize;
        match rng.below(4) {
            0 if at < valid.len() => valid[at] ^= 1 << rng.below(8),
            1 => valid.insert(at, rng.next() as u8),
            2 => valid.truncate(at),
            _ if at < valid.len() => valid[at] = rng.next() as u8,
            _ => {}
        }
    }
    valid
}

/// The input of one round: raw bytes, a mutated valid encoding, or a valid one.
fn input_bytes(rng: &mut Rng, valid: impl FnOnce(&mut Unstructured) -> Option<Vec<u8>>) -> Vec<u8> {
    let len = rng.below(600) as usize;
    let raw = rng.bytes(len);
    let mut u = Unstructured::new(&raw);
    match rng.below(3) {
        0 => raw.clone(),
        1 => valid(&mut u).map_or(raw.clone(), |v| mutate(rng, v)),
        _ => valid(&mut u).unwrap_or(raw.clone()),
    }
}

/// A node message built by `arbitrary`.
fn arbitrary_node_msg(u: &mut Unstructured) -> arbitrary::Result<NodeMsg> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 => NodeMsg::Ping(u.arbitrary()?),
        1 => NodeMsg::Pong(u.arbitrary()?),
        2 => NodeMsg::Order(OrderMsg::arbitrary(u)?),
        _ => NodeMsg::Tfa(TfaMsg::arbitrary(u)?),
    })
}

/// A wire frame's payload (what a sealed record carries, without the length prefix).
fn frame_payload(msg: NodeMsg, u: &mut Unstructured) -> Option<Vec<u8>> {
    let envelope = match u.int_in_range(0..=2u8).ok()? {
        0 => Envelope::OneWay(msg),
        1 => Envelope::Request {
            id: u.arbitrary().ok()?,
            body: msg,
        },
        _ => Envelope::Response {
            id: u.arbitrary().ok()?,
            body: msg,
        },
    };
    let frame = if u.ratio(1, 8u8).ok()? {
        LinkFrame::KeepAlive
    } else {
        LinkFrame::App(envelope)
    };
    let mut out = Vec::new();
    wire::encode(&frame, 1 << 20, &mut out).ok()?;
    Some(out[atomos::net::frame::PREFIX..].to_vec())
}

/// A Raft message built field by field from unstructured bytes (raft-rs's types do not
/// implement `Arbitrary`).
fn arbitrary_raft(u: &mut Unstructured) -> arbitrary::Result<Message> {
    // Mostly small terms (to meet the replica's), sometimes any at all.
    let term = |u: &mut Unstructured| -> arbitrary::Result<u64> {
        if u.ratio(1, 16u8)? {
            u.arbitrary()
        } else {
            u.int_in_range(0..=5)
        }
    };
    let mut m = Message {
        to: u.int_in_range(0..=4)?,
        from: u.int_in_range(0..=4)?,
        term: term(u)?,
        log_term: u.int_in_range(0..=5)?,
        index: u.int_in_range(0..=20)?,
        commit: u.int_in_range(0..=20)?,
        reject: u.arbitrary()?,
        reject_hint: u.int_in_range(0..=20)?,
        request_snapshot: u.int_in_range(0..=20)?,
        priority: u.arbitrary()?,
        ..Default::default()
    };
    m.set_msg_type(match u.int_in_range(0..=5u8)? {
        0 => MessageType::MsgAppend,
        1 => MessageType::MsgHeartbeat,
        2 => MessageType::MsgRequestVote,
        3 => MessageType::MsgSnapshot,
        4 => MessageType::MsgAppendResponse,
        _ => MessageType::MsgRequestPreVote,
    });
    for _ in 0..u.int_in_range(0..=3)? {
        let mut e = Entry {
            term: u.int_in_range(0..=5)?,
            index: u.int_in_range(0..=20)?,
            data: u.arbitrary::<Vec<u8>>()?,
            ..Default::default()
        };
        e.set_entry_type(if u.arbitrary()? {
            EntryType::EntryNormal
        } else {
            EntryType::EntryConfChange
        });
        m.entries.push(e);
    }
    if m.get_msg_type() == MessageType::MsgSnapshot {
        m.snapshot = Some(Snapshot {
            data: u.arbitrary::<Vec<u8>>()?,
            metadata: Some(SnapshotMetadata {
                index: if u.ratio(1, 16u8)? {
                    u.arbitrary()?
                } else {
                    u.int_in_range(0..=20)?
                },
                term: term(u)?,
                conf_state: Some(ConfState {
                    voters: vec![1, 2, 3],
                    ..Default::default()
                }),
            }),
        });
    }
    Ok(m)
}

/// What a TFA node's state looks like from outside (to tell whether an input changed it).
fn tfa_state(n: &TfaNode) -> String {
    format!(
        "{} {:?} {:?} {} {} {}",
        n.clock(),
        n.counters(),
        n.in_flight(),
        n.pending_requests(),
        n.objects().len(),
        n.objects().locks_held()
    )
}

/// A TFA node with some history: objects it owns, a transaction running.
fn tfa_node() -> TfaNode {
    let mut n = TfaNode::new(1, vec![1, 2, 3], 1, TfaConfig::default()).expect("a member");
    let mut out = Vec::new();
    for h in 0..4u64 {
        n.step(h, Input::Request(TfaRequest::Begin { h }), &mut out)
            .expect("infallible");
    }
    n
}

thread_local! {
    /// The OSS node that decoded OSS messages go to (made at the first one).
    static OSS: std::cell::RefCell<Option<OssNode>> = const { std::cell::RefCell::new(None) };
}

/// Node 1 of three OSS nodes, on an engine of its own.
fn oss_node() -> OssNode {
    let engine = std::sync::Arc::new(atomos::Engine::new(atomos::EngineConfig {
        replicated: true,
        ..atomos::EngineConfig::default()
    }));
    OssNode::open(OssConfig::new(1, vec![1, 2, 3]), engine, &[]).expect("a member")
}

/// Inputs that decoded and reached a machine.
static DELIVERED: AtomicUsize = AtomicUsize::new(0);

/// Feeds a decoded node message to the machine that receives it.
fn deliver(tfa: &mut TfaNode, order: &mut Replica<Register>, now: u64, from: u64, msg: NodeMsg) {
    DELIVERED.fetch_add(1, Ordering::Relaxed);
    match msg {
        NodeMsg::Tfa(m) => {
            let refused = m.clock > MAX_CLOCK;
            let before = refused.then(|| tfa_state(tfa));
            tfa.step(now, Input::Message { from, msg: m }, &mut Vec::new())
                .expect("infallible");
            if let Some(before) = before {
                assert_eq!(
                    tfa_state(tfa),
                    before,
                    "a refused TFA message changed the node"
                );
            }
        }
        NodeMsg::Order(m) => {
            let member = (1..=3).contains(&from);
            let before = (!member).then(|| order.describe());
            // A replica error stops the replica (the node reports it): allowed, never a panic.
            let _ = order.step(now, Input::Message { from, msg: m }, &mut Vec::new());
            if let Some(before) = before {
                assert_eq!(
                    order.describe(),
                    before,
                    "a non-member's message changed the replica"
                );
            }
        }
        // An OSS node takes whatever decodes (or stops with an error), never panics.
        NodeMsg::Oss(m) => OSS.with(|oss| {
            let mut oss = oss.borrow_mut();
            let node = oss.get_or_insert_with(oss_node);
            let _ = node.step(now, Input::Message { from, msg: m }, &mut Vec::new());
        }),
        // Served by the node's client service, whose checks tests/clients.rs exercises.
        NodeMsg::Ping(_)
        | NodeMsg::Pong(_)
        | NodeMsg::Describe
        | NodeMsg::Catalog { .. }
        | NodeMsg::Query { .. }
        | NodeMsg::QueryAnswer(_)
        | NodeMsg::Submit { .. }
        | NodeMsg::SubmitAnswer(_) => {}
    }
}

/// Checks that the inputs reached the machines (at least a fifth of them decoded), and says
/// how far the machines went.
fn reached(delivered_before: usize, order: &Replica<Register>, tfa: &TfaNode) {
    let delivered = DELIVERED.load(Ordering::Relaxed) - delivered_before;
    eprintln!(
        "{delivered} of {} inputs reached a machine; {}; tfa {}",
        inputs(),
        order.describe(),
        tfa_state(tfa)
    );
    assert!(
        delivered as u64 >= inputs() / 5,
        "only {delivered} inputs decoded"
    );
}

#[test]
fn wire_frames_decode_to_messages_their_machines_take_or_errors() {
    let _one = serial();
    let mut tfa = tfa_node();
    let mut order = replica(1);
    let delivered_before = DELIVERED.load(Ordering::Relaxed);
    let start = first_seed();
    for seed in start..start + inputs() {
        let mut rng = Rng::new(seed);
        let bytes = input_bytes(&mut rng, |u| {
            let msg = arbitrary_node_msg(u).ok()?;
            frame_payload(msg, u)
        });
        let from = [2, 3, 9][rng.below(3) as usize];
        bounded(&format!("wire seed {seed}"), || {
            if let Ok(LinkFrame::App(envelope)) =
                wire::decode::<LinkFrame<Envelope<NodeMsg>>>(&bytes)
            {
                let msg = match envelope {
                    Envelope::OneWay(m) => m,
                    Envelope::Request { body, .. } | Envelope::Response { body, .. } => body,
                };
                deliver(&mut tfa, &mut order, seed, from, msg);
            }
        });
        if seed % 64 == 0 {
            // Time passes too: re-sends and timeouts over whatever the inputs left.
            tfa.step(seed, Input::Tick, &mut Vec::new())
                .expect("infallible");
            let _ = order.step(seed, Input::Tick, &mut Vec::new());
        }
    }
    reached(delivered_before, &order, &tfa);
}

/// Three TFA nodes running transfers among themselves, so the one under fuzzing owns objects,
/// holds locks, tracks keys and coordinates transactions of its own while the inputs arrive.
struct TfaCluster {
    nodes: Vec<TfaNode>,
    queue: std::collections::VecDeque<(u64, u64, TfaMsg)>,
    answers: Vec<(u64, atomos::protocols::tfa::Answer)>,
    next_h: u64,
    now: u64,
    commits: u64,
}

impl TfaCluster {
    fn new() -> TfaCluster {
        TfaCluster {
            nodes: (1..=3)
                .map(|id| TfaNode::new(id, vec![1, 2, 3], 1, TfaConfig::default()).expect("member"))
                .collect(),
            queue: Default::default(),
            answers: Vec::new(),
            next_h: 1_000,
            now: 0,
            commits: 0,
        }
    }

    fn step(&mut self, node: u64, input: Input<TfaMsg, TfaRequest>) {
        let mut out = Vec::new();
        self.nodes[node as usize - 1]
            .step(self.now, input, &mut out)
            .expect("infallible");
        for o in out {
            match o {
                atomos_seam::Output::Send { to, msg } if (1..=3).contains(&to) => {
                    self.queue.push_back((node, to, msg))
                }
                atomos_seam::Output::Deliver(a) => self.answers.push((node, a)),
                _ => {}
            }
        }
    }

    /// Delivers messages until none is left (or a bound, should the nodes keep talking).
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let Some((from, to, msg)) = self.queue.pop_front() else {
                return;
            };
            self.step(to, Input::Message { from, msg });
        }
    }

    /// The answer to transaction `h` on `node`, once the messages settled.
    fn answer(&mut self, node: u64, h: u64) -> Option<Reply> {
        self.settle();
        let i = self
            .answers
            .iter()
            .position(|(n, a)| *n == node && a.h == h)?;
        Some(self.answers.remove(i).1.reply)
    }

    /// A transfer on `node`: reads both keys, writes each one more than it read.
    fn transfer(&mut self, node: u64, keys: [Key; 2]) {
        let h = self.next_h;
        self.next_h += 1;
        self.step(node, Input::Request(TfaRequest::Begin { h }));
        let mut writes = Vec::new();
        for key in keys {
            self.step(
                node,
                Input::Request(TfaRequest::Read {
                    h,
                    key: key.clone(),
                }),
            );
            match self.answer(node, h) {
                Some(Reply::Read(Ok(v))) => {
                    let n = v.and_then(|b| b.first().copied()).unwrap_or(0);
                    writes.push((key, Some(vec![n.wrapping_add(1)])));
                }
                _ => {
                    self.step(node, Input::Request(TfaRequest::Abort { h }));
                    return;
                }
            }
        }
        self.step(node, Input::Request(TfaRequest::Commit { h, writes }));
        if let Some(Reply::Commit(Ok(()))) = self.answer(node, h) {
            self.commits += 1;
        }
        self.answers.clear();
    }

    fn tick(&mut self) {
        self.now += 1;
        for id in 1..=3 {
            self.step(id, Input::Tick);
        }
        self.settle();
    }
}

#[test]
fn tfa_messages_decode_to_steps_or_errors() {
    let _one = serial();
    let mut cluster = TfaCluster::new();
    let mut order = replica(1);
    let delivered_before = DELIVERED.load(Ordering::Relaxed);
    let start = first_seed();
    for seed in start..start + inputs() {
        let mut rng = Rng::new(seed ^ 0x7fa);
        let bytes = input_bytes(&mut rng, |u| {
            let msg = TfaMsg::arbitrary(u).ok()?;
            postcard::to_stdvec(&msg).ok()
        });
        let from = 2 + rng.below(2);
        let now = cluster.now;
        // Mostly the senders' real run: a message of a newer run tells the node its peer
        // restarted, and from then on it drops the peer's real traffic (the honest transfers
        // would stop). One decoded message in sixteen keeps whatever run it names.
        let other_run = rng.below(16) == 0;
        bounded(&format!("tfa seed {seed}"), || {
            if let Ok(mut msg) = postcard::from_bytes::<TfaMsg>(&bytes) {
                if !other_run {
                    msg.incarnation = 1;
                }
                deliver(
                    &mut cluster.nodes[0],
                    &mut order,
                    now,
                    from,
                    NodeMsg::Tfa(msg),
                );
            }
        });
        if seed % 4 == 0 {
            let keys = [
                Key::with_index("f/", seed % 8),
                Key::with_index("f/", (seed + 3) % 8),
            ];
            cluster.transfer(1 + seed % 3, keys);
            cluster.tick();
        }
    }
    reached(delivered_before, &order, &cluster.nodes[0]);
    eprintln!("{} honest transfers committed", cluster.commits);
    assert!(
        cluster.commits > inputs() / 40,
        "the honest nodes committed only {} transfers",
        cluster.commits
    );
}

/// Three replicas passing messages to each other with a client's requests, so the one under
/// fuzzing has a log, a leader, batches and snapshots to get wrong. Writes count as durable
/// at once.
struct OrderCluster {
    replicas: Vec<Replica<Register>>,
    written: Vec<u64>,
    queue: std::collections::VecDeque<(u64, u64, OrderMsg)>,
    seq: u64,
}

fn replica(id: u64) -> Replica<Register> {
    let mut cfg = ReplicaConfig::new(id, vec![1, 2, 3]);
    cfg.snapshot_every = 20;
    Replica::open(cfg, Vec::new(), Register::new()).expect("opens")
}

impl OrderCluster {
    fn new() -> OrderCluster {
        OrderCluster {
            replicas: (1..=3).map(replica).collect(),
            written: vec![0; 3],
            queue: Default::default(),
            seq: 0,
        }
    }

    /// Steps replica `to` with `input` and carries out what it asks. A replica that fails
    /// restarts empty (a node whose replica stops is restarted by its supervisor).
    fn step(&mut self, now: u64, to: u64, input: atomos::order::Input) {
        let i = to as usize - 1;
        let mut out = Vec::new();
        if self.replicas[i].step(now, input, &mut out).is_err() {
            self.replicas[i] = replica(to);
            self.written[i] = 0;
            return;
        }
        let mut wrote = false;
        for o in out {
            match o {
                atomos_seam::Output::Send { to: dest, msg } if (1..=3).contains(&dest) => {
                    self.queue.push_back((to, dest, msg))
                }
                atomos_seam::Output::Persist(_) => {
                    self.written[i] += 1;
                    wrote = true;
                }
                _ => {}
            }
        }
        if wrote {
            let through = self.written[i];
            self.step(now, to, Input::Persisted { through });
        }
    }

    /// One round of honest traffic: a client request, ticks, and the messages in flight.
    fn round(&mut self, now: u64) {
        self.seq += 1;
        let request = atomos::order::Request {
            client: 100,
            seq: self.seq,
            payload: atomos::order::RegisterOp::Append {
                key: "k".into(),
                value: vec![self.seq as u8],
            }
            .encode(),
            deadline_ms: atomos::order::NO_DEADLINE,
        };
        let to = 1 + self.seq % 3;
        let msg = OrderMsg::Request(request);
        self.step(now, to, Input::Message { from: 100, msg });
        for id in 1..=3 {
            self.step(now, id, Input::Tick);
        }
        for _ in 0..self.queue.len().min(64) {
            if let Some((from, to, msg)) = self.queue.pop_front() {
                self.step(now, to, Input::Message { from, msg });
            }
        }
    }
}

#[test]
fn order_and_raft_messages_decode_to_steps_or_errors() {
    let _one = serial();
    let mut tfa = tfa_node();
    let mut cluster = OrderCluster::new();
    for now in 0..200 {
        cluster.round(now);
    }
    let delivered_before = DELIVERED.load(Ordering::Relaxed);
    let start = first_seed();
    for seed in start..start + inputs() {
        let mut rng = Rng::new(seed ^ 0x0bde);
        let raft_inside = rng.below(2) == 0;
        let bytes = input_bytes(&mut rng, |u| {
            let msg = if raft_inside {
                let m = arbitrary_raft(u).ok()?;
                if m.get_msg_type() == MessageType::MsgSnapshot && u.arbitrary().ok()? {
                    OrderMsg::State {
                        snapshot: m.snapshot.unwrap_or_default().encode_to_vec(),
                    }
                } else {
                    OrderMsg::Raft(m.encode_to_vec())
                }
            } else {
                OrderMsg::arbitrary(u).ok()?
            };
            postcard::to_stdvec(&msg).ok()
        });
        let from = [2, 3, 9][rng.below(3) as usize];
        let now = 200 + seed - start;
        bounded(&format!("order seed {seed}"), || {
            if let Ok(msg) = postcard::from_bytes::<OrderMsg>(&bytes) {
                deliver(
                    &mut tfa,
                    &mut cluster.replicas[0],
                    now,
                    from,
                    NodeMsg::Order(msg),
                );
            }
        });
        if seed % 4 == 0 {
            cluster.round(now);
        }
    }
    reached(delivered_before, &cluster.replicas[0], &tfa);
    // The others heard only honest replicas: the guard refused none of their messages, and the
    // cluster got on with its work.
    for r in &cluster.replicas[1..] {
        assert_eq!(r.stats().raft_refused, 0, "{}", r.describe());
        assert!(r.final_next() > 100, "{}", r.describe());
    }
}
