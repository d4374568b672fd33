//! The simulator: event queue, simulated network and disks, faults, trace.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};

use atomos_seam::{Gate, Input, Machine, NodeId, Output};

use crate::disk::SimDisk;
use crate::rng::SimRng;
use crate::setup::{Boot, BootFn, Run, SimConfig};

#[derive(Debug)]
enum Event<M, R> {
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: M,
    },
    Tick,
    Restart(NodeId),
    Heal,
    Request {
        to: NodeId,
        req: R,
    },
    /// The node's writes up to `through` reach the disk (if it did not restart meanwhile).
    Synced {
        node: NodeId,
        incarnation: u64,
        through: u64,
        fail: bool,
    },
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

type Out<M> = Output<<M as Machine>::Msg, <M as Machine>::Delivery>;

/// One simulated node: its machine while it is up, its disk always.
struct Slot<M: Machine> {
    machine: Option<M>,
    disk: SimDisk,
    /// Outputs waiting for disk writes before them.
    gate: Gate<Out<M>>,
    /// Starts so far.
    incarnation: u64,
    /// When its latest write becomes durable (writes sync in order).
    synced_at: u64,
    /// It refused to start (a damaged log): it stays down.
    refused: bool,
    corrupted: bool,
    /// The disk was wiped at some crash.
    wiped: bool,
}

/// A simulation of `nodes` machines.
pub struct Sim<M: Machine> {
    cfg: SimConfig,
    rng: SimRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Scheduled<M::Msg, M::Request>>,
    boot: BootFn<M>,
    slots: Vec<Slot<M>>,
    /// During a partition, the side each node is on.
    side: Option<Vec<bool>>,
    run: Run<M::Delivery>,
    out: Vec<Out<M>>,
    live: bool,
}

impl<M: Machine> Sim<M> {
    /// A simulation whose nodes are built (and rebuilt after each crash, from their disks) by
    /// `boot`.
    pub fn new(cfg: SimConfig, boot: impl FnMut(Boot) -> Result<M, String> + 'static) -> Sim<M> {
        let slots = (0..cfg.nodes)
            .map(|_| Slot {
                machine: None,
                disk: SimDisk::new(),
                gate: Gate::new(),
                incarnation: 0,
                synced_at: 0,
                refused: false,
                corrupted: false,
                wiped: false,
            })
            .collect();
        Sim {
            rng: SimRng::new(cfg.seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            boot: Box::new(boot),
            slots,
            side: None,
            run: Run::empty(cfg.seed),
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
        self.run.trace.push(line);
    }

    fn schedule(&mut self, delay: u64, event: Event<M::Msg, M::Request>) {
        self.seq += 1;
        self.queue.push(Scheduled {
            time: self.now + delay,
            seq: self.seq,
            event,
        });
    }

    fn slot(&mut self, node: NodeId) -> &mut Slot<M> {
        &mut self.slots[node as usize - 1]
    }

    fn is_up(&self, node: NodeId) -> bool {
        self.slots[node as usize - 1].machine.is_some()
    }

    /// Submits a local request to `node` at time `at`.
    pub fn request_at(&mut self, at: u64, node: NodeId, req: M::Request) {
        let delay = at.saturating_sub(self.now);
        self.schedule(delay, Event::Request { to: node, req });
    }

    fn faulty(&self) -> bool {
        self.now < self.cfg.fault_until
    }

    /// Starts `node` from its disk.
    fn start(&mut self, node: NodeId) {
        let slot = self.slot(node);
        if slot.machine.is_some() || slot.refused {
            return;
        }
        let incarnation = slot.incarnation;
        slot.incarnation += 1;
        slot.gate = Gate::new();
        let wiped = slot.wiped;
        let log = match slot.disk.load() {
            Ok(log) => log,
            Err(c) => {
                slot.refused = true;
                let why = format!(
                    "damaged log record at byte {} ({} good before it)",
                    c.offset, c.records_before
                );
                self.log(format!("{} refused {node} {why}", self.now));
                self.run.refused.push((self.now, node, why));
                return;
            }
        };
        self.log(format!("{} start {node} #{incarnation}", self.now));
        match (self.boot)(Boot {
            node,
            incarnation,
            log,
            wiped,
        }) {
            Ok(m) => self.slot(node).machine = Some(m),
            Err(why) => {
                self.slot(node).refused = true;
                self.log(format!("{} refused {node} {why}", self.now));
                self.run.refused.push((self.now, node, why));
            }
        }
    }

    /// `node` stops: its machine is gone, its unsynced writes are lost (part of the first may
    /// land torn), and maybe a record in the middle of its log is damaged.
    fn crash(&mut self, node: NodeId, why: &str) {
        self.log(format!("{} crash {node} ({why})", self.now));
        self.run.crashes.push((self.now, node));
        let f = self.cfg.faults.clone();
        let corrupted_nodes = self.slots.iter().filter(|s| s.corrupted).count();
        let mut rng = std::mem::replace(&mut self.rng, SimRng::new(0));
        let slot = self.slot(node);
        slot.machine = None;
        let torn = slot.disk.crash(f.torn, &mut rng);
        let corrupt = !slot.corrupted
            && corrupted_nodes < f.max_corrupt_nodes
            && rng.chance(f.corrupt)
            && slot.disk.corrupt(&mut rng);
        if corrupt {
            slot.corrupted = true;
        }
        self.rng = rng;
        if torn {
            self.run.torn += 1;
            self.log(format!("{} torn {node}", self.now));
        }
        if corrupt {
            self.run.corrupted.push((self.now, node));
            self.log(format!("{} corrupted {node}", self.now));
        }
        let wiped_nodes: BTreeSet<NodeId> = self.run.wiped.iter().map(|(_, n)| *n).collect();
        let may_wipe = wiped_nodes.contains(&node) || wiped_nodes.len() < f.max_wiped_nodes;
        // (No draw when wiping is off, so that runs without it keep their traces.)
        if f.wipe > 0.0 && !corrupt && may_wipe && self.rng.chance(f.wipe) {
            let slot = self.slot(node);
            slot.disk.wipe();
            slot.wiped = true;
            self.run.wiped.push((self.now, node));
            self.log(format!("{} wiped {node}", self.now));
        }
    }

    fn step_node(&mut self, node: NodeId, input: Input<M::Msg, M::Request>) {
        let now = self.now;
        let mut out = std::mem::take(&mut self.out);
        let result = match self.slot(node).machine.as_mut() {
            Some(m) => m.step(now, input, &mut out),
            None => return,
        };
        if let Err(e) = result {
            // Crash-stop, as the driver does: nothing of this step goes out.
            out.clear();
            self.out = out;
            let e = e.to_string();
            self.run.failures.push((now, node, e.clone()));
            self.crash(node, &e);
            self.schedule(self.cfg.faults.down_for.max(1), Event::Restart(node));
            return;
        }
        for o in out.drain(..) {
            match o {
                Output::Persist(write) => self.persist(node, write),
                o => {
                    if let Some(o) = self.slot(node).gate.pass(o) {
                        self.carry_out(node, o);
                    }
                }
            }
        }
        self.out = out;
    }

    fn persist(&mut self, node: NodeId, write: atomos_seam::Write) {
        let faulty = self.faulty();
        let fail = faulty && self.rng.chance(self.cfg.faults.fsync_fail);
        let mut delay = 1 + self.rng.below(self.cfg.faults.sync_delay.max(1));
        // Drawn only when stalls are asked for, so runs without them keep their traces.
        if faulty && self.cfg.faults.stall > 0.0 && self.rng.chance(self.cfg.faults.stall) {
            delay += self.cfg.faults.stall_len;
        }
        let now = self.now;
        let slot = self.slot(node);
        slot.gate.write();
        let through = slot.disk.issue(write);
        let incarnation = slot.incarnation;
        // Writes become durable in the order issued.
        slot.synced_at = slot.synced_at.max(now + delay);
        let at = slot.synced_at - now;
        self.schedule(
            at,
            Event::Synced {
                node,
                incarnation,
                through,
                fail,
            },
        );
    }

    fn carry_out(&mut self, node: NodeId, o: Out<M>) {
        match o {
            Output::Send { to, msg } => self.send(node, to, msg),
            Output::Deliver(d) => {
                self.log(format!("{} note {node} {d:?}", self.now));
                self.run.notes.push((self.now, node, d));
            }
            Output::Warn(w) => self.log(format!("{} warn {node} {w}", self.now)),
            Output::Persist(_) => {}
        }
    }

    fn synced(&mut self, node: NodeId, through: u64) {
        let slot = self.slot(node);
        slot.disk.sync(through);
        let free = slot.gate.durable(through);
        for o in free {
            self.carry_out(node, o);
        }
        self.step_node(node, Input::Persisted { through });
    }

    fn send(&mut self, from: NodeId, to: NodeId, msg: M::Msg) {
        if to == 0 || to as usize > self.cfg.nodes {
            self.log(format!("{} nowhere {from}->{to} {msg:?}", self.now));
            return;
        }
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
        self.side
            .as_ref()
            .is_some_and(|s| s[a as usize - 1] != s[b as usize - 1])
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
        for node in 1..=self.cfg.crashable.min(self.cfg.nodes) as NodeId {
            if self.is_up(node) && self.rng.chance(f.crash) {
                self.crash(node, "fault");
                self.schedule(f.down_for.max(1), Event::Restart(node));
            }
        }
    }

    /// Runs to the end and returns what happened. The machines stay available for checking
    /// their final state ([`Sim::machine`]), and the disks too ([`Sim::disk`]).
    pub fn run(&mut self) -> Run<M::Delivery> {
        for node in 1..=self.cfg.nodes as NodeId {
            self.start(node);
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
                for node in 1..=self.cfg.nodes as NodeId {
                    self.start(node);
                }
            }
            match event {
                Event::Deliver { from, to, msg } => {
                    if !self.is_up(to) || self.cut_off(from, to) {
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
                    for node in 1..=self.cfg.nodes as NodeId {
                        self.step_node(node, Input::Tick);
                    }
                    self.schedule(self.cfg.tick_every.max(1), Event::Tick);
                }
                Event::Restart(node) => self.start(node),
                Event::Heal => {
                    if self.side.take().is_some() {
                        self.log(format!("{time} heal"));
                    }
                }
                Event::Request { to, req } => {
                    if self.is_up(to) {
                        self.log(format!("{time} request {to} {req:?}"));
                        self.step_node(to, Input::Request(req));
                    } else {
                        self.log(format!("{time} request-refused {to} {req:?}"));
                    }
                }
                Event::Synced {
                    node,
                    incarnation,
                    through,
                    fail,
                } => {
                    let slot = self.slot(node);
                    if slot.machine.is_none() || slot.incarnation != incarnation {
                        continue; // the node restarted: these writes were lost
                    }
                    if fail {
                        self.run.failed_fsyncs += 1;
                        self.crash(node, "fsync failed");
                        self.schedule(self.cfg.faults.down_for.max(1), Event::Restart(node));
                    } else {
                        self.synced(node, through);
                    }
                }
            }
        }
        std::mem::replace(&mut self.run, Run::empty(self.cfg.seed))
    }

    /// Node `node`'s machine, if it is up.
    pub fn machine(&self, node: NodeId) -> Option<&M> {
        self.slots.get(node as usize - 1)?.machine.as_ref()
    }

    /// Node `node`'s durable records as they stand.
    pub fn disk(&self, node: NodeId) -> Vec<Vec<u8>> {
        self.slots[node as usize - 1].disk.records()
    }
}
