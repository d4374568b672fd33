//! The order layer on one node, as one seam machine: the replica, the node's own clients, and
//! the routing between them. A host hands it submissions with tickets and gets answers by
//! ticket; every message a replica addresses to its own node, and every answer to one of the
//! node's clients, is routed here, so the simulator runs the same routing and deduplication the
//! production node does.
//!
//! The seam's rule holds inside too: a message the replica sends to its own node after a disk
//! write (an answer to one of the node's clients) is acted on only once that write is durable
//! ([`Gate`]), exactly as if it had travelled through the driver.

use std::collections::{BTreeMap, VecDeque};

use atomos_seam::{Gate, Machine, Output};

use crate::client::{Client, ClientAction, ClientInput};
use crate::error::OrderError;
use crate::membership::{MemberChange, Membership};
use crate::replica::{Command, Replica};
use crate::types::{Addr, Delivery, OrderMsg, StateMachine};

/// What a host asks of its endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointRequest {
    /// Order and apply `payload` if that happens by log time `deadline_ms`
    /// ([`crate::NO_DEADLINE`]: whenever); the answer comes back as
    /// [`EndpointDelivery::Answered`] with this `ticket`. Tickets are the host's: any number
    /// not in flight. A request lives in the cluster at most
    /// [`EndpointConfig::request_lifetime_ms`] (its client's session ends with it): one with
    /// a later deadline, or none, is sent again as a new request each time it expires, until
    /// its own deadline.
    Submit {
        /// The host's name for this submission.
        ticket: u64,
        /// What the state machine is asked to do.
        payload: Vec<u8>,
        /// The request's deadline.
        deadline_ms: u64,
    },
    /// Seal the replica's open batch now ([`Command::Flush`]).
    Flush,
    /// Propose a membership change ([`Command::ChangeMembership`]); the answer comes back as
    /// the replica's [`Delivery::MemberChange`] with this `ticket`.
    ChangeMembership {
        /// The host's number for the change.
        ticket: u64,
        /// The change.
        change: MemberChange,
    },
    /// Take a snapshot now ([`Command::SnapshotNow`]).
    SnapshotNow,
    /// The state the replica asked to have encoded at `seq` ([`Delivery::EncodeSnapshot`]),
    /// encoded ([`Command::SnapshotEncoded`]).
    SnapshotEncoded {
        /// The position.
        seq: u64,
        /// The state machine's state there.
        state: Vec<u8>,
    },
}

/// How a submission ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It was ordered and applied; the state machine's answer.
    Applied(Vec<u8>),
    /// It was not ordered before its deadline: it never runs.
    Expired,
    /// Its deadline passed and whether it ran is no longer known: its client was answered
    /// neither way before the cluster forgot its session ([`crate::OrderMsg::Unknown`]).
    Unknown,
}

/// What an endpoint hands to its host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointDelivery {
    /// Submission `ticket` ended.
    Answered {
        /// The submission's ticket.
        ticket: u64,
        /// The client that carried it (unique among this cluster's clients).
        client: u64,
        /// Its number among that client's requests: `(client, seq)` names the request in the
        /// order, on every replica.
        seq: u64,
        /// How it ended.
        outcome: Outcome,
    },
    /// The replica's own delivery (optimistic, final, revoked, installed, alarm).
    Order(Delivery),
}

/// An endpoint's settings beside its replica's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// The ids of this node's clients are `client_base | n` for n = 1, 2, ...: the host draws
    /// it at random (its low 32 bits zero) so that a restarted node reuses an earlier start's
    /// client ids, and their sequence numbers, only with probability about 2^-32.
    pub client_base: u64,
    /// A client re-sends its request to the next replica after this many ticks unanswered.
    pub resend_ticks: u64,
    /// The longest a request lives in the cluster, in the clock's milliseconds: a
    /// submission's deadline is capped to its submission time plus this (and renewed while
    /// its own deadline allows). It bounds how long the cluster keeps a client's session.
    pub request_lifetime_ms: u64,
}

/// [`EndpointConfig::request_lifetime_ms`] unless a host says otherwise: a minute.
pub const REQUEST_LIFETIME_MS: u64 = 60_000;

/// A submission in flight: its ticket, the host's deadline, and whether it is sent again
/// when it expires (its deadline was capped; the client hands its payload back).
struct Submission {
    ticket: u64,
    deadline_ms: u64,
    renew: bool,
}

/// The replica, its node's clients and the routing between them (see the module's doc).
pub struct Endpoint<S: StateMachine> {
    replica: Replica<S>,
    me: Addr,
    /// The replicas, this one first: where a client sends, and then fails over to.
    replicas: Vec<Addr>,
    cfg: EndpointConfig,
    clients_made: u64,
    /// Clients with a submission in flight, by client id.
    busy: BTreeMap<u64, (Client, Submission)>,
    /// Clients with nothing in flight, kept with their numbering.
    idle: Vec<Client>,
    /// A client is retired after this many requests (0: never; see
    /// [`Endpoint::retire_clients_after`]).
    client_requests_max: u64,
    /// Messages to this node held until the writes emitted before them are durable.
    gate: Gate<OrderMsg>,
    /// Messages to this node that may be acted on now.
    local: VecDeque<OrderMsg>,
}

impl<S: StateMachine> Endpoint<S> {
    /// An endpoint around `replica` (opened from its log by the host). Its clients send to
    /// the members the replica's log names, or to `replicas` while it names none.
    pub fn new(replica: Replica<S>, replicas: &[Addr], cfg: EndpointConfig) -> Endpoint<S> {
        let me = replica.id();
        let known = replica.membership().all();
        let replicas = if known.is_empty() {
            own_first(me, replicas)
        } else {
            own_first(me, &known)
        };
        Endpoint {
            replica,
            me,
            replicas,
            cfg,
            clients_made: 0,
            busy: BTreeMap::new(),
            idle: Vec::new(),
            client_requests_max: 0,
            gate: Gate::new(),
            local: VecDeque::new(),
        }
    }

    /// Retires each of this node's clients once it sent `requests` requests (0: never), so
    /// that later submissions come from new clients: load that stands for many short-lived
    /// clients, whose sessions the cluster must forget (benchmarks of its bookkeeping).
    pub fn retire_clients_after(&mut self, requests: u64) {
        self.client_requests_max = requests;
    }

    /// The replica.
    pub fn replica(&self) -> &Replica<S> {
        &self.replica
    }

    /// The replica, to change its state machine's settings (never its order).
    pub fn replica_mut(&mut self) -> &mut Replica<S> {
        &mut self.replica
    }

    /// Submissions in flight.
    pub fn in_flight(&self) -> usize {
        self.busy.len()
    }

    /// Messages to this node waiting for a write to become durable.
    pub fn held(&self) -> usize {
        self.gate.held()
    }

    /// Has `c` send `payload` for `submission`, its deadline capped to the request lifetime
    /// from now: from `now` or the log's time, whichever is later (a log whose time runs
    /// ahead of this node's clock would expire a deadline capped from the clock at once).
    fn send(
        &mut self,
        now: u64,
        mut c: Client,
        mut submission: Submission,
        payload: Vec<u8>,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) {
        let cap = self
            .log_now(now)
            .saturating_add(self.cfg.request_lifetime_ms);
        let deadline_ms = submission.deadline_ms.min(cap);
        submission.renew = deadline_ms < submission.deadline_ms;
        let id = c.id();
        let mut actions = Vec::new();
        c.step(
            ClientInput::Submit {
                payload,
                deadline_ms,
            },
            &mut actions,
        );
        self.busy.insert(id, (c, submission));
        self.client_acted(now, id, actions, out);
    }

    /// The later of `now` and the log's time this replica knows.
    fn log_now(&self, now: u64) -> u64 {
        now.max(self.replica.log_time())
    }

    fn client(&mut self) -> Client {
        self.idle.pop().unwrap_or_else(|| {
            self.clients_made += 1;
            Client::new(
                self.cfg.client_base | self.clients_made,
                self.replicas.clone(),
                0,
                self.cfg.resend_ticks,
            )
        })
    }

    /// Steps the replica and sorts what it asks for: its own node's messages stay here
    /// (behind the gate), the rest goes out.
    fn step_replica(
        &mut self,
        now: u64,
        input: crate::Input,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) -> Result<(), OrderError> {
        let mut inner = Vec::new();
        self.replica.step(now, input, &mut inner)?;
        for output in inner {
            match output {
                Output::Persist(write) => {
                    self.gate.write();
                    out.push(Output::Persist(write));
                }
                Output::Send { to, msg } if to == self.me => {
                    if let Some(msg) = self.gate.pass(msg) {
                        self.local.push_back(msg);
                    }
                }
                Output::Deliver(Delivery::Membership { seq, membership }) => {
                    self.follow(&membership);
                    let d = Delivery::Membership { seq, membership };
                    out.push(Output::Deliver(EndpointDelivery::Order(d)));
                }
                other => out.push(other.map(|m| m, EndpointDelivery::Order)),
            }
        }
        Ok(())
    }

    /// The membership changed: this node's clients send to its members from now on (this
    /// replica first while it is one).
    fn follow(&mut self, membership: &Membership) {
        let members = membership.all();
        let mut replicas = own_first(self.me, &members);
        if !membership.contains(self.me) {
            replicas.remove(0);
        }
        if replicas.is_empty() {
            return;
        }
        for (c, _) in self.busy.values_mut() {
            c.set_replicas(replicas.clone());
        }
        for c in &mut self.idle {
            c.set_replicas(replicas.clone());
        }
        self.replicas = replicas;
    }

    /// Carries out a client's actions: requests to this node's replica stay here, others go
    /// out, an ended submission is answered by ticket.
    fn client_acted(
        &mut self,
        now: u64,
        client: u64,
        actions: Vec<ClientAction>,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) {
        for action in actions {
            let (seq, outcome) = match action {
                ClientAction::Send { to, msg } if to == self.me => {
                    self.local.push_back(msg);
                    continue;
                }
                ClientAction::Send { to, msg } => {
                    out.push(Output::Send { to, msg });
                    continue;
                }
                ClientAction::Done { seq, response } => (seq, Outcome::Applied(response)),
                ClientAction::Expired { seq } => (seq, Outcome::Expired),
                ClientAction::Unknown { seq } => (seq, Outcome::Unknown),
            };
            let Some((mut c, submission)) = self.busy.remove(&client) else {
                continue;
            };
            if outcome == Outcome::Expired
                && submission.renew
                && submission.deadline_ms > self.log_now(now)
            {
                // Only its capped deadline passed, and it never ran: sent again, as a new
                // request.
                if let Some(payload) = c.take_expired(seq) {
                    self.send(now, c, submission, payload, out);
                    continue;
                }
            }
            if self.client_requests_max == 0 || c.next_number() <= self.client_requests_max {
                // An idle client keeps no expired payload.
                let mut c = c;
                let _ = c.take_expired(seq);
                self.idle.push(c);
            }
            out.push(Output::Deliver(EndpointDelivery::Answered {
                ticket: submission.ticket,
                client,
                seq,
                outcome,
            }));
        }
    }

    /// An answer to one of this node's clients (from this replica or another).
    fn answer(
        &mut self,
        now: u64,
        from: Addr,
        msg: OrderMsg,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) {
        let Some(id) = msg.answered_client() else {
            return;
        };
        let Some((c, _)) = self.busy.get_mut(&id) else {
            // An answer to a submission already answered (a re-sent copy's), or to another
            // node's client: nothing waits for it.
            return;
        };
        let mut actions = Vec::new();
        c.step(ClientInput::Message { from, msg }, &mut actions);
        self.client_acted(now, id, actions, out);
    }

    /// Acts on this node's messages to itself until none is left.
    fn drain_local(
        &mut self,
        now: u64,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) -> Result<(), OrderError> {
        while let Some(msg) = self.local.pop_front() {
            if msg.answered_client().is_some() {
                self.answer(now, self.me, msg, out);
            } else {
                let from = self.me;
                self.step_replica(now, crate::Input::Message { from, msg }, out)?;
            }
        }
        Ok(())
    }
}

impl<S: StateMachine> Machine for Endpoint<S> {
    type Msg = OrderMsg;
    type Request = EndpointRequest;
    type Delivery = EndpointDelivery;
    type Error = OrderError;

    /// Reacts to one input as the replica and the node's clients would, routing between them
    /// here; appends what leaves the node (messages to others, disk writes, deliveries and
    /// answers) to `out`.
    fn step(
        &mut self,
        now: u64,
        input: atomos_seam::Input<OrderMsg, EndpointRequest>,
        out: &mut Vec<Output<OrderMsg, EndpointDelivery>>,
    ) -> Result<(), OrderError> {
        use atomos_seam::Input;
        match input {
            Input::Message { from, msg } if msg.answered_client().is_some() => {
                self.answer(now, from, msg, out)
            }
            Input::Message { from, msg } => {
                self.step_replica(now, Input::Message { from, msg }, out)?
            }
            Input::Tick => {
                self.step_replica(now, Input::Tick, out)?;
                let ids: Vec<u64> = self.busy.keys().copied().collect();
                for id in ids {
                    let mut actions = Vec::new();
                    if let Some((c, _)) = self.busy.get_mut(&id) {
                        c.step(ClientInput::Tick, &mut actions);
                    }
                    self.client_acted(now, id, actions, out);
                }
            }
            Input::Request(EndpointRequest::Submit {
                ticket,
                payload,
                deadline_ms,
            }) => {
                let c = self.client();
                let submission = Submission {
                    ticket,
                    deadline_ms,
                    renew: false,
                };
                self.send(now, c, submission, payload, out);
            }
            Input::Request(EndpointRequest::Flush) => {
                self.step_replica(now, Input::Request(Command::Flush), out)?
            }
            Input::Request(EndpointRequest::ChangeMembership { ticket, change }) => {
                let command = Command::ChangeMembership { ticket, change };
                self.step_replica(now, Input::Request(command), out)?
            }
            Input::Request(EndpointRequest::SnapshotNow) => {
                self.step_replica(now, Input::Request(Command::SnapshotNow), out)?
            }
            Input::Request(EndpointRequest::SnapshotEncoded { seq, state }) => {
                let command = Command::SnapshotEncoded { seq, state };
                self.step_replica(now, Input::Request(command), out)?
            }
            Input::Persisted { through } => {
                // What waited for these writes first: its outputs then come before any write
                // the replica makes on hearing of them, so nothing holds them back again.
                self.local.extend(self.gate.durable(through));
                self.drain_local(now, out)?;
                self.step_replica(now, Input::Persisted { through }, out)?;
            }
        }
        self.drain_local(now, out)
    }
}

/// `replicas` with `me` first (whether or not it was among them), each once.
fn own_first(me: Addr, replicas: &[Addr]) -> Vec<Addr> {
    let mut order = vec![me];
    order.extend(replicas.iter().copied().filter(|&r| r != me));
    order
}
