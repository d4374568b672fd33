//! The simulator: event queue, simulated network, faults, trace.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt::Debug;

use crate::rng::SimRng;

/// A node's index in the simulation.
pub type NodeId = usize;

/// What a machine reacts to.
#[derive(Clone, Debug)]
pub enum Input<M, R> {
    /// The node (re)started; after a crash it has only what it persisted.
    Start,
    /// A message from another node.
    Message {
        /// The sender.
        from: NodeId,
        /// The message.
        msg: M,
    },
    /// A periodic timer.
    Tick,
    /// A client request.
    Request(R),
}

/// What a machine asks for.
#[derive(Clone, Debug)]
pub enum Output<M, N> {
    /// Send `msg` to `to` (through the faulty network).
    Send {
        /// The receiver.
        to: NodeId,
        /// The message.
        msg: M,
    },
    /// Something observable for the checker (a reply to a client, a delivery).
    Note(N),
}

/// A deterministic protocol state machine: no clocks, threads, sockets or randomness of its own.
pub trait Machine {
    /// Messages between nodes.
    type Msg: Clone + Debug;
    /// Client requests.
    type Request: Clone + Debug;
    /// Observable events.
    type Note: Clone + Debug;
    /// Reacts to one input at simulated time `now`, appending outputs to `out`.
    fn step(
        &mut self,
        now: u64,
        input: Input<Self::Msg, Self::Request>,
        out: &mut Vec<Output<Self::Msg, Self::Note>>,
    );
    /// The node crashed: forget everything that was not persisted.
    fn crash(&mut self);
}

/// Fault rates. Probabilities are per message (loss, duplication), or per node and tick (crash),
/// or per tick (partition).
#[derive(Clone, Debug)]
pub struct Faults {
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Messages take 1..=`max_delay` time units (so they overtake each other).
    pub max_delay: u64,
    /// Probability per tick that a partition starts (when none is active).
    pub partition: f64,
    /// How long a partition lasts.
    pub partition_len: u64,
    /// Probability per node and tick that the node crashes.
    pub crash: f64,
    /// How long a crashed node stays down.
    pub down_for: u64,
}

impl Faults {
    /// No faults; messages take one time unit.
    pub fn none() -> Faults {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            max_delay: 1,
            partition: 0.0,
            partition_len: 0,
            crash: 0.0,
            down_for: 0,
        }
    }

    /// Every kind of fault, at rates that keep a small cluster making progress.
    pub fn harsh() -> Faults {
        Faults {
            drop: 0.05,
            duplicate: 0.05,
            max_delay: 30,
            partition: 0.02,
            partition_len: 200,
            crash: 0.01,
            down_for: 100,
        }
    }
}

/// One simulation's settings.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed of every random choice.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: usize,
    /// Time units between ticks.
    pub tick_every: u64,
    /// Faults are injected until this time.
    pub fault_until: u64,
    /// Then the network heals, crashed nodes restart, and the run goes on this long.
    pub settle: u64,
    /// The faults.
    pub faults: Faults,
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct Run<N> {
    /// The seed.
    pub seed: u64,
    /// Every event in the order processed, one line each.
    pub trace: Vec<String>,
    /// Notes the machines emitted: (time, node, note).
    pub notes: Vec<(u64, NodeId, N)>,
}

#[derive(Clone, Debug)]
enum Event<M, R> {
    Deliver { from: NodeId, to: NodeId, msg: M },
    Tick,
    Restart(NodeId),
    Heal,
    Request { to: NodeId, req: R },
}

struct Scheduled<M, R> {
    time: u64,
    seq: u64,
    event: Event<M, R>,
}

impl<M, R> PartialEq for Scheduled<M, R> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<M, R> Eq for Scheduled<M, R> {}
impl<M, R> PartialOrd for Scheduled<M, R> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M, R> Ord for Scheduled<M, R> {
    // Earliest first (the heap is a max-heap); ties in scheduling order.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A simulation of `nodes` machines.
pub struct Sim<S: Machine> {
    cfg: SimConfig,
    rng: SimRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled<S::Msg, S::Request>>,
    machines: Vec<S>,
    up: Vec<bool>,
    /// During a partition, the side each node is on.
    side: Option<Vec<bool>>,
    trace: Vec<String>,
    notes: Vec<(u64, NodeId, S::Note)>,
    out: Vec<Output<S::Msg, S::Note>>,
    live: bool,
}

impl<S: Machine> Sim<S> {
    /// A simulation of the given machines (one per node).
    pub fn new(cfg: SimConfig, machines: Vec<S>) -> Sim<S> {
        assert_eq!(cfg.nodes, machines.len(), "one machine per node");
        Sim {
            rng: SimRng::new(cfg.seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            up: vec![true; machines.len()],
            machines,
            side: None,
            trace: Vec::new(),
            notes: Vec::new(),
            out: Vec::new(),
            live: std::env::var_os("ATOMOS_SIM_TRACE").is_some(),
            cfg,
        }
    }

    /// Records one trace line (and prints it at once when `ATOMOS_SIM_TRACE` is set, so a run
    /// that panics inside a machine still shows how it got there).
    fn log(&mut self, line: String) {
        if self.live {
            eprintln!("{line}");
        }
        self.trace.push(line);
    }

    fn schedule(&mut self, delay: u64, event: Event<S::Msg, S::Request>) {
        self.seq += 1;
        self.queue.push(Scheduled {
            time: self.now + delay,
            seq: self.seq,
            event,
        });
    }

    /// Submits a client request to `node` at time `at`.
    pub fn request_at(&mut self, at: u64, node: NodeId, req: S::Request) {
        let delay = at.saturating_sub(self.now);
        self.schedule(delay, Event::Request { to: node, req });
    }

    fn faulty(&self) -> bool {
        self.now < self.cfg.fault_until
    }

    fn step_node(&mut self, node: NodeId, input: Input<S::Msg, S::Request>) {
        let mut out = std::mem::take(&mut self.out);
        self.machines[node].step(self.now, input, &mut out);
        for o in out.drain(..) {
            match o {
                Output::Send { to, msg } => self.send(node, to, msg),
                Output::Note(n) => {
                    self.log(format!("{} note {node} {n:?}", self.now));
                    self.notes.push((self.now, node, n));
                }
            }
        }
        self.out = out;
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: S::Msg) {
        let faults = self.faulty();
        if faults && self.rng.chance(self.cfg.faults.drop) {
            self.log(format!("{} lost {from}->{to} {msg:?}", self.now));
            return;
        }
        let copies = if faults && self.rng.chance(self.cfg.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = 1 + self.rng.below(self.cfg.faults.max_delay.max(1));
            self.schedule(
                delay,
                Event::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    fn cut_off(&self, a: NodeId, b: NodeId) -> bool {
        self.side.as_ref().is_some_and(|s| s[a] != s[b])
    }

    fn inject_faults(&mut self) {
        let f = self.cfg.faults.clone();
        if self.side.is_none() && self.cfg.nodes > 1 && self.rng.chance(f.partition) {
            let mut side: Vec<bool> = (0..self.cfg.nodes).map(|_| self.rng.chance(0.5)).collect();
            if side.iter().all(|&s| s) || side.iter().all(|&s| !s) {
                let n = self.rng.below(self.cfg.nodes as u64) as usize;
                side[n] = !side[n];
            }
            self.log(format!("{} partition {side:?}", self.now));
            self.side = Some(side);
            self.schedule(f.partition_len.max(1), Event::Heal);
        }
        for node in 0..self.cfg.nodes {
            if self.up[node] && self.rng.chance(f.crash) {
                self.log(format!("{} crash {node}", self.now));
                self.up[node] = false;
                self.machines[node].crash();
                self.schedule(f.down_for.max(1), Event::Restart(node));
            }
        }
    }

    /// Runs to the end and returns the trace and the notes. The machines stay available for
    /// checking their final state ([`Sim::machines`]).
    pub fn run(&mut self) -> Run<S::Note> {
        for node in 0..self.cfg.nodes {
            self.step_node(node, Input::Start);
        }
        self.schedule(self.cfg.tick_every.max(1), Event::Tick);
        let end = self.cfg.fault_until + self.cfg.settle;
        let mut healed = false;
        while let Some(Scheduled { time, event, .. }) = self.queue.pop() {
            if time > end {
                break;
            }
            self.now = time;
            if !healed && !self.faulty() {
                // Faults are over: heal the network and bring every node back.
                healed = true;
                self.side = None;
                self.log(format!("{} settle", self.now));
                for node in 0..self.cfg.nodes {
                    if !self.up[node] {
                        self.up[node] = true;
                        self.log(format!("{} restart {node}", self.now));
                        self.step_node(node, Input::Start);
                    }
                }
            }
            match event {
                Event::Deliver { from, to, msg } => {
                    if !self.up[to] || self.cut_off(from, to) {
                        self.log(format!("{time} blocked {from}->{to} {msg:?}"));
                    } else {
                        self.log(format!("{time} deliver {from}->{to} {msg:?}"));
                        self.step_node(to, Input::Message { from, msg });
                    }
                }
                Event::Tick => {
                    if self.faulty() {
                        self.inject_faults();
                    }
                    for node in 0..self.cfg.nodes {
                        if self.up[node] {
                            self.step_node(node, Input::Tick);
                        }
                    }
                    self.schedule(self.cfg.tick_every.max(1), Event::Tick);
                }
                Event::Restart(node) => {
                    if !self.up[node] {
                        self.up[node] = true;
                        self.log(format!("{time} restart {node}"));
                        self.step_node(node, Input::Start);
                    }
                }
                Event::Heal => {
                    if self.side.take().is_some() {
                        self.log(format!("{time} heal"));
                    }
                }
                Event::Request { to, req } => {
                    if self.up[to] {
                        self.log(format!("{time} request {to} {req:?}"));
                        self.step_node(to, Input::Request(req));
                    } else {
                        self.log(format!("{time} request-refused {to} {req:?}"));
                    }
                }
            }
        }
        Run {
            seed: self.cfg.seed,
            trace: std::mem::take(&mut self.trace),
            notes: std::mem::take(&mut self.notes),
        }
    }

    /// The machines, to check their state after a run.
    pub fn machines(&self) -> &[S] {
        &self.machines
    }
}
