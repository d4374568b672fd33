//! OS-Paxos in the simulator: 3 replicas and 4 clients under loss, duplication, reordering,
//! partitions, crashes and restarts (replicas keep only what they synced).
//!
//! Checked on every run: each replica finally delivers in order, without gaps, only what it
//! optimistically delivered and did not revoke; every replica (and every incarnation of it)
//! finally delivers the same requests at the same position; no request is delivered twice;
//! every client gets every answer once the faults stop, and each answer is what the final order
//! implies; all replicas end in the same state.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-order --test sim`.

use std::collections::{BTreeMap, BTreeSet};

use atomos_order::{
    decode_log, Action, Client, ClientAction, ClientInput, Delivery, Input as ReplicaInput,
    OrderMsg, Register, RegisterOp, Replica, ReplicaConfig, Request, StateMachine,
};
use atomos_seam::Write;
use atomos_sim::{check_seeds, Faults, Input, Machine, NodeId, Output, Run, Sim, SimConfig};

const REPLICAS: usize = 3;
const CLIENTS: usize = 4;
const REQUESTS_PER_CLIENT: u64 = 25;

fn addr(node: NodeId) -> u64 {
    node as u64 + 1
}

fn node_of(addr: u64) -> NodeId {
    addr as NodeId - 1
}

#[derive(Clone, Debug)]
enum Note {
    Started {
        base: u64,
    },
    Delivered(Delivery),
    Done {
        client: u64,
        seq: u64,
        response: Vec<u8>,
    },
    Failed(String),
}

enum Node {
    Replica {
        cfg: ReplicaConfig,
        replica: Option<Box<Replica<Register>>>,
        /// The records on the replica's disk (every write is durable at once).
        disk: Vec<Vec<u8>>,
        incarnation: u64,
    },
    /// A client and the payloads it submits when it first starts.
    Client(Client, Vec<Vec<u8>>),
}

impl Node {
    fn push_actions(
        actions: Vec<Action>,
        disk: &mut Vec<Vec<u8>>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) {
        for a in actions {
            match a {
                Action::Send { to, msg } => out.push(Output::Send {
                    to: node_of(to),
                    msg,
                }),
                Action::Deliver(d) => out.push(Output::Note(Note::Delivered(d))),
                Action::Persist(Write::Append(records)) => disk.extend(records),
                Action::Persist(Write::Rewrite(records)) => *disk = records,
                Action::Warn(_) => {}
            }
        }
    }
}

impl Node {
    fn push_client_actions(
        client: u64,
        actions: Vec<ClientAction>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) {
        for a in actions {
            match a {
                ClientAction::Send { to, msg } => out.push(Output::Send {
                    to: node_of(to),
                    msg,
                }),
                ClientAction::Done { seq, response } => out.push(Output::Note(Note::Done {
                    client,
                    seq,
                    response,
                })),
            }
        }
    }
}

impl Machine for Node {
    type Msg = OrderMsg;
    type Request = Vec<u8>;
    type Note = Note;

    fn step(
        &mut self,
        _now: u64,
        input: Input<OrderMsg, Vec<u8>>,
        out: &mut Vec<Output<OrderMsg, Note>>,
    ) {
        match self {
            Node::Replica {
                cfg,
                replica,
                disk,
                incarnation,
            } => {
                if let Input::Start = input {
                    let mut c = cfg.clone();
                    c.seed = cfg.seed ^ (*incarnation << 32);
                    let log = match decode_log(disk) {
                        Ok(log) => log,
                        Err(e) => {
                            out.push(Output::Note(Note::Failed(e.to_string())));
                            return;
                        }
                    };
                    match Replica::open(c, log, Register::new()) {
                        Ok(r) => {
                            out.push(Output::Note(Note::Started {
                                base: r.final_next() - 1,
                            }));
                            *replica = Some(Box::new(r));
                        }
                        Err(e) => out.push(Output::Note(Note::Failed(e.to_string()))),
                    }
                    return;
                }
                let Some(r) = replica.as_mut() else { return };
                let input = match input {
                    Input::Tick => ReplicaInput::Tick,
                    Input::Message { from, msg } => ReplicaInput::Message {
                        from: addr(from),
                        msg,
                    },
                    Input::Request(_) | Input::Start => return,
                };
                let mut actions = Vec::new();
                if let Err(e) = r.step(0, input, &mut actions) {
                    out.push(Output::Note(Note::Failed(e.to_string())));
                }
                Node::push_actions(actions, disk, out);
            }
            Node::Client(client, to_submit) => {
                let input = match input {
                    Input::Start => {
                        let mut actions = Vec::new();
                        for payload in to_submit.drain(..) {
                            client.step(ClientInput::Submit(payload), &mut actions);
                        }
                        Node::push_client_actions(client.id(), actions, out);
                        return;
                    }
                    Input::Tick => ClientInput::Tick,
                    Input::Message { from, msg } => ClientInput::Message {
                        from: addr(from),
                        msg,
                    },
                    Input::Request(payload) => ClientInput::Submit(payload),
                };
                let mut actions = Vec::new();
                client.step(input, &mut actions);
                Node::push_client_actions(client.id(), actions, out);
            }
        }
    }

    fn crash(&mut self) {
        // Clients keep their state (the property is about correct clients); replicas keep what
        // they synced.
        if let Node::Replica {
            replica,
            incarnation,
            ..
        } = self
        {
            *replica = None;
            *incarnation += 1;
        }
    }
}

struct Outcome {
    run: Run<Note>,
    /// Requests (client, seq) with their payloads, as submitted.
    payloads: BTreeMap<(u64, u64), Vec<u8>>,
    unanswered: usize,
    finals: Vec<(u64, Register)>,
    states: Vec<String>,
}

fn simulate(seed: u64, snapshot_every: u64) -> Outcome {
    let replicas: Vec<u64> = (0..REPLICAS).map(addr).collect();
    let mut nodes = Vec::new();
    for i in 0..REPLICAS {
        let mut cfg = ReplicaConfig::new(addr(i), replicas.clone());
        cfg.seed = seed.wrapping_mul(31).wrapping_add(i as u64);
        cfg.batch_max = 8;
        cfg.retry_ticks = 5;
        cfg.snapshot_every = snapshot_every;
        nodes.push(Node::Replica {
            cfg,
            replica: None,
            disk: Vec::new(),
            incarnation: 0,
        });
    }
    let mut payloads = BTreeMap::new();
    for c in 0..CLIENTS {
        let id = 100 + c as u64;
        let ops: Vec<Vec<u8>> = (1..=REQUESTS_PER_CLIENT)
            .map(|s| {
                RegisterOp::Append {
                    key: format!("k{}", (c as u64 + s) % 3),
                    value: vec![c as u8, s as u8],
                }
                .encode()
            })
            .collect();
        for (s, op) in (1..).zip(&ops) {
            payloads.insert((id, s), op.clone());
        }
        nodes.push(Node::Client(Client::new(id, replicas.clone(), c, 15), ops));
    }
    let cfg = SimConfig {
        seed,
        nodes: REPLICAS + CLIENTS,
        tick_every: 10,
        fault_until: 4_000,
        settle: 6_000,
        faults: Faults::harsh(),
    };
    let mut sim = Sim::new(cfg, nodes);
    let run = sim.run();
    let mut unanswered = 0;
    let mut finals = Vec::new();
    let mut states = Vec::new();
    for m in sim.machines() {
        if let Node::Replica {
            replica: Some(r), ..
        } = m
        {
            states.push(r.describe());
        }
        match m {
            Node::Client(c, _) => unanswered += c.unanswered(),
            Node::Replica {
                replica: Some(r), ..
            } => finals.push((r.final_next(), r.machine().clone())),
            Node::Replica { .. } => {}
        }
    }
    Outcome {
        run,
        payloads,
        unanswered,
        finals,
        states,
    }
}

fn check(o: &Outcome) -> Result<(), String> {
    // seq -> the requests finally delivered there (by any replica, any incarnation).
    let mut final_order: BTreeMap<u64, Vec<Request>> = BTreeMap::new();
    #[derive(Default)]
    struct View {
        opt: BTreeMap<u64, Vec<Request>>,
        opt_next: u64,
        final_next: u64,
    }
    let mut views: BTreeMap<NodeId, View> = BTreeMap::new();
    for (t, node, note) in &o.run.notes {
        let v = views.entry(*node).or_default();
        match note {
            Note::Failed(e) => return Err(format!("node {node} failed at {t}: {e}")),
            Note::Started { base } => {
                *v = View {
                    opt: BTreeMap::new(),
                    opt_next: base + 1,
                    final_next: base + 1,
                };
            }
            Note::Delivered(Delivery::Opt { seq, requests }) => {
                if *seq != v.opt_next {
                    return Err(format!(
                        "node {node} at {t}: opt-delivered {seq}, expected {}",
                        v.opt_next
                    ));
                }
                v.opt.insert(*seq, requests.clone());
                v.opt_next += 1;
            }
            Note::Delivered(Delivery::Revoke { from }) => {
                if *from < v.final_next {
                    return Err(format!("node {node} at {t}: revoked final entry {from}"));
                }
                v.opt.split_off(from);
                v.opt_next = *from;
            }
            Note::Delivered(Delivery::Installed { seq }) => {
                v.opt.clear();
                v.opt_next = seq + 1;
                v.final_next = seq + 1;
            }
            Note::Delivered(Delivery::Final { seq }) => {
                if *seq != v.final_next {
                    return Err(format!(
                        "node {node} at {t}: final-delivered {seq}, expected {}",
                        v.final_next
                    ));
                }
                let Some(requests) = v.opt.remove(seq) else {
                    return Err(format!(
                        "node {node} at {t}: final-delivered {seq} before opt-delivering it"
                    ));
                };
                match final_order.get(seq) {
                    Some(other) if *other != requests => {
                        return Err(format!(
                            "node {node} at {t}: position {seq} holds {requests:?}, elsewhere {other:?}"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        final_order.insert(*seq, requests);
                    }
                }
                v.final_next += 1;
            }
            Note::Done { .. } => {}
        }
    }
    // Integrity: at most once, and only what clients sent.
    let mut seen = BTreeSet::new();
    for (seq, requests) in &final_order {
        for r in requests {
            if !seen.insert((r.client, r.seq)) {
                return Err(format!(
                    "request {}:{} delivered twice (again at {seq})",
                    r.client, r.seq
                ));
            }
            if o.payloads.get(&(r.client, r.seq)) != Some(&r.payload) {
                return Err(format!(
                    "request {}:{} was not sent like that",
                    r.client, r.seq
                ));
            }
        }
    }
    // Validity: every request answered once the faults stopped.
    if o.unanswered > 0 {
        return Err(format!("{} requests never answered", o.unanswered));
    }
    // Answers agree with the final order (when no position is missing from every view).
    let contiguous = final_order.keys().copied().eq(1..=final_order.len() as u64);
    if contiguous {
        let mut reg = Register::new();
        let mut answers = BTreeMap::new();
        for requests in final_order.values() {
            for r in requests {
                answers.insert((r.client, r.seq), reg.apply(r));
            }
        }
        for (_, _, note) in &o.run.notes {
            if let Note::Done {
                client,
                seq,
                response,
            } = note
            {
                if answers.get(&(*client, *seq)) != Some(response) {
                    return Err(format!(
                        "answer to {client}:{seq} disagrees with the final order"
                    ));
                }
            }
        }
    }
    // Convergence: every live replica ends at the same place with the same state.
    if let Some((next, reg)) = o.finals.first() {
        for (n, r) in &o.finals {
            if (n, r) != (next, reg) {
                return Err(format!(
                    "replicas ended apart: at {n} vs {next}:\n{}",
                    o.states.join("\n")
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn total_order_with_optimistic_delivery_survives_every_fault() {
    let mut revoked = 0;
    check_seeds(40, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, 10_000);
        revoked += o
            .run
            .notes
            .iter()
            .filter(|(_, _, n)| matches!(n, Note::Delivered(Delivery::Revoke { .. })))
            .count();
        check(&o)
    });
    println!("revocations over the seeds: {revoked}");
}

#[test]
fn replicas_far_behind_catch_up_by_snapshot() {
    let mut installs = 0;
    check_seeds(40, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, 5);
        installs += o
            .run
            .notes
            .iter()
            .filter(|(_, _, n)| matches!(n, Note::Delivered(Delivery::Installed { .. })))
            .count();
        check(&o)
    });
    assert!(installs > 0, "no replica ever needed a snapshot");
    println!("snapshot installs over the seeds: {installs}");
}

#[test]
fn one_seed_gives_one_trace() {
    let a = simulate(7, 5);
    let b = simulate(7, 5);
    assert_eq!(a.run.trace, b.run.trace);
    let c = simulate(8, 5);
    assert_ne!(a.run.trace, c.run.trace);
}
