//! The simulated cluster: three founding replicas (and, in membership runs, two that join
//! later while an operator replaces members), well-behaved clients and adversarial ones, the
//! run's settings, and what a run leaves to check.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use atomos_order::{
    decode_log, Client, ClientAction, ClientInput, Delivery, Endpoint, EndpointConfig,
    EndpointDelivery, EndpointRequest, MemberChange, Membership, OrderError, OrderMsg, PlantedBug,
    Register, RegisterOp, Replica, ReplicaConfig, Request, SnapshotJob, NO_DEADLINE,
};
use atomos_sim::{Boot, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig, SimRng};

use crate::operator::{last_membership, next_change, removed};

/// The replicas that found the cluster (nodes 1 to 3).
pub const REPLICAS: usize = 3;
/// Replica slots in membership runs: the founders and two that join (nodes 4 and 5).
const MEMBERSHIP_SLOTS: usize = 5;
pub const CLIENTS: usize = 4;
pub const REQUESTS_PER_CLIENT: u64 = 25;

/// The highest number an adversarial client uses.
const ADVERSARY_MAX_SEQ: u64 = 60;

#[derive(Clone, Debug)]
pub enum Note {
    Started {
        base: u64,
    },
    Delivered(Delivery),
    Done {
        client: u64,
        seq: u64,
        response: Vec<u8>,
    },
    /// The client heard that its request expired.
    Expired {
        client: u64,
        seq: u64,
    },
    /// The client heard that its request's outcome is no longer known (its session ended).
    Unknown {
        client: u64,
        seq: u64,
    },
    /// This replica, leading, proposed a change of the operator's script.
    Proposed(MemberChange),
}

/// A client that numbers its requests as no well-behaved client does: an older number after a
/// newer one, gaps, the same request to several replicas in one tick, and the same requests
/// again across failovers and restarts. Its numbers drift upwards with time, so new and old
/// ones keep mixing while the faults last. What it is answered becomes [`Note::Done`].
pub struct Adversary {
    id: u64,
    /// The replica slots it sends to.
    slots: u64,
    rng: SimRng,
    /// The longest time a request of its may live, if its requests have deadlines.
    ttl_max: Option<u64>,
    /// Whether it falls silent every other [`QUIET_SPAN`] (so that its session ends) and
    /// then sends old numbers again.
    quiet: bool,
}

/// How long a quiet adversary talks, then keeps silent, in turn.
const QUIET_SPAN: u64 = 700;

impl Adversary {
    fn new(id: u64, seed: u64, setup: Setup) -> Adversary {
        Adversary {
            id,
            slots: setup.slots() as u64,
            rng: SimRng::new(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            ttl_max: setup.ttl_max,
            quiet: setup.quiet,
        }
    }

    fn random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn step(
        &mut self,
        now: u64,
        input: Input<OrderMsg, Vec<u8>>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) {
        match input {
            Input::Tick if now < FAULT_UNTIL => {
                if !self.random().is_multiple_of(3) {
                    return;
                }
                let silent = self.quiet && (now / QUIET_SPAN) % 2 == 1;
                if silent {
                    return;
                }
                // Around a number that grows with time, up to four below or above it; a
                // quiet one also goes back to numbers of its earlier turns, which may have
                // run in a session since ended.
                let centre = 5 + now * ADVERSARY_MAX_SEQ / FAULT_UNTIL;
                let back = if self.quiet && self.random().is_multiple_of(3) {
                    5 + self.random() % 20
                } else {
                    0
                };
                let seq = (centre + self.random() % 9)
                    .saturating_sub(4 + back)
                    .clamp(1, ADVERSARY_MAX_SEQ);
                // One deadline per number, as a client gives every copy of a request (a copy
                // with another deadline would be told of its own fate only): from about when
                // the number comes up, plus a time of its own.
                let deadline_ms = match self.ttl_max {
                    Some(max) => {
                        let spread = self.id.wrapping_mul(31).wrapping_add(seq * 7919) % max;
                        (seq.saturating_sub(5) * FAULT_UNTIL / ADVERSARY_MAX_SEQ) + spread
                    }
                    None => NO_DEADLINE,
                };
                let request = Request {
                    client: self.id,
                    seq,
                    payload: adversary_payload(self.id, seq),
                    deadline_ms,
                };
                // To one replica, several or all of them at once.
                let mask = 1 + self.random() % ((1 << self.slots) - 1);
                for r in 1..=self.slots {
                    if mask & (1 << (r - 1)) != 0 {
                        out.push(Output::Send {
                            to: r,
                            msg: OrderMsg::Request(request.clone()),
                        });
                    }
                }
            }
            Input::Message {
                msg:
                    OrderMsg::Reply {
                        client,
                        seq,
                        response,
                    },
                ..
            } if client == self.id => out.push(Output::Deliver(Note::Done {
                client,
                seq,
                response,
            })),
            Input::Message {
                msg: OrderMsg::Expired { client, seq },
                ..
            } if client == self.id => out.push(Output::Deliver(Note::Expired { client, seq })),
            Input::Message {
                msg: OrderMsg::Unknown { client, seq },
                ..
            } if client == self.id => out.push(Output::Deliver(Note::Unknown { client, seq })),
            _ => {}
        }
    }
}

fn adversary_payload(client: u64, seq: u64) -> Vec<u8> {
    RegisterOp::Append {
        key: format!("k{}", seq % 3),
        value: vec![client as u8, seq as u8, 0xad],
    }
    .encode()
}

/// A simulated node: a replica (nodes 1..=3), a client (the next [`CLIENTS`]) or an adversarial
/// client (the rest). Each replica announces itself on its first step after (re)starting.
pub enum Node {
    /// The replica in the production endpoint (it has no clients of its own here: the
    /// clients are nodes of their own), so what the node runtime routes is routed here too.
    Replica {
        endpoint: Box<Endpoint<Register>>,
        announced: bool,
        /// Where this node's reads go, and the position of its latest one.
        reads: Reads,
        last_read: u64,
        /// What sets this replica's clock apart (see [`replica_clock`]).
        clock: (u64, Setup),
        /// Membership changes this replica asked for as leader (the operator's script).
        tickets: u64,
        /// Snapshots the replica asked to have encoded (odd seeds: see [`Node::boot`]), each
        /// with the ticks left before its job runs: the replica goes on meanwhile, as it does
        /// beside a real encoding thread. A crash loses them.
        encoding: Vec<(u64, u64, SnapshotJob)>,
    },
    /// A replica removed from the cluster: decommissioned, it takes no input any more.
    Gone,
    /// A client and the payloads it has yet to submit (all at its start without deadlines;
    /// one at a time, each when the one before is answered, with deadlines).
    Client(Box<SimClient>),
    Adversary(Adversary),
}

/// A well-behaved client, what it has yet to submit, and the deadlines it gives.
pub struct SimClient {
    client: Client,
    to_submit: Vec<Vec<u8>>,
    ttl_max: Option<u64>,
    rng: SimRng,
}

impl SimClient {
    /// Submits what is due: everything at once without deadlines; with deadlines, the next
    /// payload when nothing is outstanding, to live up to `now` plus a random time.
    fn submit_due(&mut self, now: u64, actions: &mut Vec<ClientAction>) {
        match self.ttl_max {
            None => {
                for payload in self.to_submit.drain(..) {
                    let submit = ClientInput::Submit {
                        payload,
                        deadline_ms: NO_DEADLINE,
                    };
                    self.client.step(submit, actions);
                }
            }
            Some(max) => {
                if self.client.unanswered() == 0 && !self.to_submit.is_empty() {
                    let payload = self.to_submit.remove(0);
                    let deadline_ms = now + 1 + self.rng.next_u64() % max;
                    let submit = ClientInput::Submit {
                        payload,
                        deadline_ms,
                    };
                    self.client.step(submit, actions);
                }
            }
        }
    }

    /// Requests not answered yet, submitted or not.
    pub fn unanswered(&self) -> usize {
        self.client.unanswered() + self.to_submit.len()
    }
}

/// How a run is set up.
#[derive(Clone, Copy)]
pub struct Setup {
    pub snapshot_every: u64,
    pub faults: fn() -> Faults,
    pub bug: Option<PlantedBug>,
    /// Adversarial clients besides the well-behaved ones.
    pub adversaries: usize,
    /// Requests live up to this long (a random time up to it, per request); `None`: forever.
    pub ttl_max: Option<u64>,
    /// Each replica's clock is off the simulation's by up to this much, either way.
    pub clock_skew: u64,
    /// Two more replicas join and an operator replaces members while faults last (see
    /// [`operator_script`]).
    pub membership: bool,
    /// Adversarial clients fall silent in turns, long enough for their sessions to end, and
    /// then send old numbers again.
    pub quiet: bool,
}

impl Setup {
    pub fn new(snapshot_every: u64) -> Setup {
        Setup {
            snapshot_every,
            faults: Faults::harsh,
            bug: None,
            adversaries: 0,
            ttl_max: None,
            clock_skew: 0,
            membership: false,
            quiet: false,
        }
    }

    /// Membership changes under every fault.
    pub fn membership(snapshot_every: u64) -> Setup {
        Setup {
            membership: true,
            ..Setup::new(snapshot_every)
        }
    }

    /// The replica slots: nodes 1 to this.
    pub fn slots(&self) -> usize {
        if self.membership {
            MEMBERSHIP_SLOTS
        } else {
            REPLICAS
        }
    }

    /// Deadlines as [`Setup::deadlines`], with adversaries that fall silent in turns (their
    /// sessions end meanwhile) and then send old numbers again.
    pub fn sessions(snapshot_every: u64) -> Setup {
        Setup {
            quiet: true,
            ..Setup::deadlines(snapshot_every)
        }
    }

    /// Requests living up to 400 ms, replicas' clocks off by up to 150 ms, two adversarial
    /// clients.
    pub fn deadlines(snapshot_every: u64) -> Setup {
        Setup {
            ttl_max: Some(400),
            clock_skew: 150,
            adversaries: 2,
            ..Setup::new(snapshot_every)
        }
    }
}

/// What replica `node`'s clock reads when the simulation's reads `now`: off by a constant of
/// its own, up to `setup.clock_skew` either way (never below 0).
fn replica_clock(seed: u64, node: NodeId, setup: Setup, now: u64) -> u64 {
    if setup.clock_skew == 0 {
        return now;
    }
    let span = 2 * setup.clock_skew + 1;
    let offset = SimRng::new(seed ^ node.wrapping_mul(0xA076_1D64_78BD_642F)).next_u64() % span;
    (now + offset).saturating_sub(setup.clock_skew)
}

/// Faults are injected until this time.
const FAULT_UNTIL: u64 = 4_000;

pub fn replica_config(seed: u64, node: NodeId, setup: Setup) -> ReplicaConfig {
    // The founders know each other; a replica that joins knows nobody yet.
    let founders = if node as usize <= REPLICAS {
        (1..=REPLICAS as u64).collect()
    } else {
        Vec::new()
    };
    let mut cfg = ReplicaConfig::new(node, founders);
    cfg.seed = seed.wrapping_mul(31).wrapping_add(node);
    cfg.batch_max = 8;
    cfg.retry_ticks = 5;
    cfg.snapshot_every = setup.snapshot_every;
    // Snapshots stream in small chunks (from 16 to 271 bytes by seed), so that every state
    // transfer crosses many messages the faults can lose, repeat and reorder.
    cfg.snapshot_chunk_bytes = 16 + (seed % 256) as usize;
    // A few entries per step (1 to 8 by seed): catching up spans many steps, between which
    // messages, crashes and snapshots arrive.
    cfg.deliveries_per_step = 1 + (seed % 8) as usize;
    cfg.planted_bug = setup.bug;
    cfg
}

fn client_payloads(c: u64) -> Vec<Vec<u8>> {
    (1..=REQUESTS_PER_CLIENT)
        .map(|s| {
            RegisterOp::Append {
                key: format!("k{}", (c + s) % 3),
                value: vec![c as u8, s as u8],
            }
            .encode()
        })
        .collect()
}

fn client_id(node: NodeId) -> u64 {
    100 + node
}

/// Whether `client` is one of the adversarial clients of a run set up as `setup`.
pub fn is_adversary(client: u64, setup: Setup) -> bool {
    client > client_id((setup.slots() + CLIENTS) as NodeId)
}

/// What local readers saw: (node, entries applied, the state then), recorded the moment a
/// replica's state changed (a reader on the node sees it at once, whatever its disk holds).
pub type Reads = Rc<RefCell<Vec<(NodeId, u64, Register)>>>;

impl Node {
    fn boot(seed: u64, setup: Setup, boot: Boot, reads: Reads) -> Result<Node, String> {
        let slots = setup.slots();
        if boot.node as usize > slots + CLIENTS {
            // Clients never crash: this is their only start.
            let id = client_id(boot.node);
            return Ok(Node::Adversary(Adversary::new(id, seed, setup)));
        }
        if boot.node as usize > slots {
            let c = boot.node - slots as u64 - 1;
            let replicas = (1..=slots as u64).collect();
            let client = Client::new(client_id(boot.node), replicas, c as usize, 15);
            return Ok(Node::Client(Box::new(SimClient {
                client,
                to_submit: client_payloads(c),
                ttl_max: setup.ttl_max,
                rng: SimRng::new(seed ^ boot.node),
            })));
        }
        let mut cfg = replica_config(seed, boot.node, setup);
        cfg.seed ^= boot.incarnation << 32;
        let log = decode_log(&boot.log).map_err(|e| e.to_string())?;
        // Odd seeds encode snapshots off the replica's step, as the replicated store does.
        let machine = if seed % 2 == 1 {
            Register::encoding_later()
        } else {
            Register::new()
        };
        let replica = Replica::open(cfg, log, machine).map_err(|e| e.to_string())?;
        if removed(&replica) {
            return Ok(Node::Gone);
        }
        let last_read = replica.final_next() - 1;
        let replicas: Vec<NodeId> = replica.membership().all();
        let endpoint_cfg = EndpointConfig {
            client_base: (boot.node << 40) | (boot.incarnation << 32),
            resend_ticks: 15,
            request_lifetime_ms: atomos_order::REQUEST_LIFETIME_MS,
        };
        Ok(Node::Replica {
            endpoint: Box::new(Endpoint::new(replica, &replicas, endpoint_cfg)),
            announced: false,
            reads,
            last_read,
            clock: (seed, setup),
            tickets: 0,
            encoding: Vec::new(),
        })
    }
}

fn push_client_actions(
    client: u64,
    actions: Vec<ClientAction>,
    out: &mut Vec<Output<OrderMsg, Note>>,
) {
    for a in actions {
        match a {
            ClientAction::Send { to, msg } => out.push(Output::Send { to, msg }),
            ClientAction::Done { seq, response } => out.push(Output::Deliver(Note::Done {
                client,
                seq,
                response,
            })),
            ClientAction::Expired { seq } => {
                out.push(Output::Deliver(Note::Expired { client, seq }))
            }
            ClientAction::Unknown { seq } => {
                out.push(Output::Deliver(Note::Unknown { client, seq }))
            }
        }
    }
}

impl Machine for Node {
    type Msg = OrderMsg;
    type Request = Vec<u8>;
    type Delivery = Note;
    type Error = OrderError;

    fn step(
        &mut self,
        now: u64,
        input: Input<OrderMsg, Vec<u8>>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) -> Result<(), OrderError> {
        match self {
            Node::Replica {
                endpoint,
                announced,
                reads,
                last_read,
                clock,
                tickets,
                encoding,
            } => {
                if !*announced {
                    *announced = true;
                    out.push(Output::Deliver(Note::Started {
                        base: endpoint.replica().final_next() - 1,
                    }));
                }
                let input = match input {
                    Input::Request(_) => return Ok(()),
                    Input::Message { from, msg } => Input::Message { from, msg },
                    Input::Tick => Input::Tick,
                    Input::Persisted { through } => Input::Persisted { through },
                };
                let mut outputs = Vec::new();
                let node = endpoint.replica().id();
                let sim_now = now;
                let now = replica_clock(clock.0, node, clock.1, now);
                let tick = matches!(input, Input::Tick);
                endpoint.step(now, input, &mut outputs)?;
                // Encodings whose time came hand their state back (a few ticks after the ask,
                // by position: the replica applied more meanwhile).
                if tick {
                    for (_, left, _) in encoding.iter_mut() {
                        *left = left.saturating_sub(1);
                    }
                    while let Some(i) = encoding.iter().position(|(_, left, _)| *left == 0) {
                        let (seq, _, job) = encoding.remove(i);
                        let state = job();
                        let back = EndpointRequest::SnapshotEncoded { seq, state };
                        endpoint.step(now, Input::Request(back), &mut outputs)?;
                    }
                }
                // The operator asks the leader for the next change of its script.
                let replica = endpoint.replica();
                if clock.1.membership && tick && replica.is_leader() {
                    if let Some(change) = next_change(sim_now, replica.membership()) {
                        *tickets += 1;
                        let ticket = *tickets;
                        let ask = EndpointRequest::ChangeMembership {
                            ticket,
                            change: change.clone(),
                        };
                        endpoint.step(now, Input::Request(ask), &mut outputs)?;
                        let proposed = outputs.iter().any(|o| {
                            matches!(o, Output::Deliver(EndpointDelivery::Order(
                                Delivery::MemberChange { ticket: t, result: Ok(_) }
                            )) if *t == ticket)
                        });
                        if proposed {
                            out.push(Output::Deliver(Note::Proposed(change)));
                        }
                    }
                }
                let replica = endpoint.replica();
                let applied = replica.final_next() - 1;
                if applied != *last_read {
                    *last_read = applied;
                    reads
                        .borrow_mut()
                        .push((node, applied, replica.machine().clone()));
                }
                for o in outputs {
                    match o {
                        Output::Deliver(EndpointDelivery::Order(Delivery::EncodeSnapshot {
                            seq,
                            job,
                        })) => {
                            if let Some(job) = job.take() {
                                encoding.push((seq, 1 + seq % 7, job));
                            }
                        }
                        Output::Deliver(EndpointDelivery::Order(d)) => {
                            out.push(Output::Deliver(Note::Delivered(d)))
                        }
                        // The endpoint carries no submissions here.
                        Output::Deliver(EndpointDelivery::Answered { .. }) => {}
                        Output::Send { to, msg } => out.push(Output::Send { to, msg }),
                        Output::Persist(write) => out.push(Output::Persist(write)),
                        Output::Warn(text) => out.push(Output::Warn(text)),
                    }
                }
            }
            Node::Client(sim_client) => {
                let mut actions = Vec::new();
                sim_client.submit_due(now, &mut actions);
                let input = match input {
                    Input::Tick => Some(ClientInput::Tick),
                    Input::Message { from, msg } => Some(ClientInput::Message { from, msg }),
                    Input::Request(_) | Input::Persisted { .. } => None,
                };
                if let Some(input) = input {
                    sim_client.client.step(input, &mut actions);
                }
                sim_client.submit_due(now, &mut actions);
                push_client_actions(sim_client.client.id(), actions, out);
            }
            Node::Adversary(adversary) => adversary.step(now, input, out),
            Node::Gone => {}
        }
        if matches!(self, Node::Replica { endpoint, .. } if removed(endpoint.replica())) {
            *self = Node::Gone;
        }
        Ok(())
    }
}

/// A replica rebuilt from its disk: its state and how many entries it applied, or why not.
pub type Rebuilt = Result<(Register, u64), String>;

pub struct Outcome {
    pub run: Run<Note>,
    /// Requests (client, seq) with their payloads, as submitted.
    pub payloads: BTreeMap<(u64, u64), Vec<u8>>,
    pub unanswered: usize,
    /// The final position and state of each member of the configuration the run ended
    /// with (replicas removed, and those never added, are left out).
    pub finals: Vec<(u64, Register)>,
    /// That configuration: the one applied at the highest position any replica reported.
    pub membership: Membership,
    pub states: Vec<String>,
    /// Each replica's state rebuilt from its disk alone (`Replica::recover`), with the number
    /// of entries it applied, or why it could not be rebuilt.
    pub recovered: Vec<(NodeId, Rebuilt)>,
    pub reads: Vec<(NodeId, u64, Register)>,
    /// Over the final members: entries whose batch had lapsed, and batches forgotten.
    pub lapsed: u64,
    pub forgotten: u64,
    /// Over the final members: client sessions forgotten, and the most any one holds at the
    /// end.
    pub sessions_forgotten: u64,
    pub sessions_held: usize,
}

pub fn simulate(seed: u64, setup: Setup) -> Outcome {
    let slots = setup.slots();
    let clients_end = slots + CLIENTS;
    let nodes = clients_end + setup.adversaries;
    let mut payloads = BTreeMap::new();
    for node in slots as u64 + 1..=clients_end as u64 {
        let c = node - slots as u64 - 1;
        for (s, op) in (1..).zip(client_payloads(c)) {
            payloads.insert((client_id(node), s), op);
        }
    }
    for node in clients_end as u64 + 1..=nodes as u64 {
        let id = client_id(node);
        for s in 1..=ADVERSARY_MAX_SEQ {
            payloads.insert((id, s), adversary_payload(id, s));
        }
    }
    let cfg = SimConfig {
        seed,
        nodes,
        crashable: slots,
        tick_every: 10,
        fault_until: FAULT_UNTIL,
        settle: 6_000,
        faults: (setup.faults)(),
    };
    let reads = Reads::default();
    let recorder = reads.clone();
    let mut sim = Sim::new(cfg, move |boot| {
        Node::boot(seed, setup, boot, recorder.clone())
    });
    let run = sim.run();
    let delivered = run.notes.iter().filter_map(|(_, _, n)| match n {
        Note::Delivered(Delivery::Membership { seq, membership }) => Some((*seq, membership)),
        _ => None,
    });
    let membership = last_membership(delivered, REPLICAS as u64);
    let mut unanswered = 0;
    let (mut lapsed, mut forgotten) = (0, 0);
    let (mut sessions_forgotten, mut sessions_held) = (0, 0);
    let mut finals = Vec::new();
    let mut states = Vec::new();
    for node in 1..=nodes as NodeId {
        match sim.machine(node) {
            Some(Node::Client(c)) => unanswered += c.unanswered(),
            Some(Node::Replica { endpoint, .. }) if membership.contains(node) => {
                let replica = endpoint.replica();
                states.push(replica.describe());
                lapsed += replica.stats().batches_lapsed;
                forgotten += replica.stats().batches_forgotten;
                sessions_forgotten += replica.stats().sessions_forgotten;
                sessions_held = sessions_held.max(replica.sessions());
                finals.push((replica.final_next(), replica.machine().clone()));
            }
            Some(Node::Replica { .. } | Node::Gone | Node::Adversary(_)) | None => {}
        }
    }
    let recovered = (1..=slots as NodeId)
        .map(|node| {
            let rebuilt = decode_log(sim.disk(node))
                .map_err(|e| e.to_string())
                .and_then(|log| {
                    let cfg = replica_config(seed, node, setup);
                    Replica::recover(cfg, log, Register::new()).map_err(|e| e.to_string())
                });
            (node, rebuilt)
        })
        .collect();
    Outcome {
        run,
        payloads,
        unanswered,
        finals,
        membership,
        states,
        recovered,
        reads: reads.take(),
        lapsed,
        forgotten,
        sessions_forgotten,
        sessions_held,
    }
}
