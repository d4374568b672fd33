//! A client of the order layer: numbers its requests, keeps one outstanding, and re-sends it to
//! the next replica when the current one does not answer in time (HiperTM 3.3).

use std::collections::VecDeque;

use crate::types::{Addr, OrderMsg, Request};

/// What a client reacts to.
#[derive(Clone, Debug)]
pub enum ClientInput {
    /// The application wants this payload ordered and applied, if that happens by log time
    /// `deadline_ms` ([`crate::NO_DEADLINE`]: whenever).
    Submit {
        /// What the state machine is asked to do.
        payload: Vec<u8>,
        /// The request's deadline (see [`Request::deadline_ms`]).
        deadline_ms: u64,
    },
    /// Time passed.
    Tick,
    /// A message arrived.
    Message {
        /// The sender.
        from: Addr,
        /// The message.
        msg: OrderMsg,
    },
}

/// What a client asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientAction {
    /// Send `msg` to replica `to`.
    Send {
        /// The replica.
        to: Addr,
        /// The message.
        msg: OrderMsg,
    },
    /// Request `seq` was applied; this is its answer.
    Done {
        /// The request's number.
        seq: u64,
        /// The state machine's answer.
        response: Vec<u8>,
    },
    /// Request `seq` was not ordered before its deadline: it never runs.
    Expired {
        /// The request's number.
        seq: u64,
    },
    /// Request `seq` cannot run any more (its deadline passed), and whether it ran is no
    /// longer known: the cluster forgot its client's session ([`OrderMsg::Unknown`]).
    Unknown {
        /// The request's number.
        seq: u64,
    },
}

/// One client. Deterministic: re-sends are counted in ticks. A request is re-sent until it is
/// answered or reported expired, past its deadline too: a replica answers a late copy with
/// [`OrderMsg::Expired`] once its log's time is past the deadline, or orders it, and it then
/// expires there.
#[derive(Clone, Debug)]
pub struct Client {
    id: u64,
    replicas: Vec<Addr>,
    target: usize,
    next_seq: u64,
    outstanding: Option<(Request, u64)>,
    /// The latest request that expired, with its payload, until taken or the next is sent.
    expired: Option<(u64, Vec<u8>)>,
    queue: VecDeque<(Vec<u8>, u64)>,
    resend_ticks: u64,
    ticks: u64,
    resends: u64,
}

impl Client {
    /// Client `id` (unique among clients), talking first to `replicas[first]`, re-sending after
    /// `resend_ticks` without an answer.
    pub fn new(id: u64, replicas: Vec<Addr>, first: usize, resend_ticks: u64) -> Client {
        let target = if replicas.is_empty() {
            0
        } else {
            first % replicas.len()
        };
        Client {
            id,
            replicas,
            target,
            next_seq: 1,
            outstanding: None,
            expired: None,
            queue: VecDeque::new(),
            resend_ticks: resend_ticks.max(1),
            ticks: 0,
            resends: 0,
        }
    }

    /// Numbers its requests from `first` on (1 by default). A client whose id outlives it (a
    /// program that restarts with the same key) starts above every number it used before,
    /// from its clock for example: a replica drops a number at or below its client's latest
    /// while the client's session lives.
    pub fn numbered_from(mut self, first: u64) -> Client {
        self.next_seq = first.max(1);
        self
    }

    /// The number the next request it sends gets: submissions are numbered from it on, one
    /// after another, in the order they were submitted.
    pub fn next_number(&self) -> u64 {
        self.next_seq + self.queue.len() as u64
    }

    /// Requests submitted and not answered yet (the outstanding one included).
    pub fn unanswered(&self) -> usize {
        self.queue.len() + usize::from(self.outstanding.is_some())
    }

    /// How many times a request was re-sent.
    pub fn resends(&self) -> u64 {
        self.resends
    }

    /// The client's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sends to `replicas` from now on (the membership changed): the replica it sends to now
    /// stays its target if it is among them, else the first one is.
    pub fn set_replicas(&mut self, replicas: Vec<Addr>) {
        let current = self.target();
        self.target = current
            .and_then(|t| replicas.iter().position(|&r| r == t))
            .unwrap_or(0);
        self.replicas = replicas;
    }

    /// The replica the client sends to now: the first one, until one failed to answer in time.
    pub fn target(&self) -> Option<Addr> {
        self.replicas.get(self.target).copied()
    }

    fn send_outstanding(&mut self, out: &mut Vec<ClientAction>) {
        if let (Some((req, sent)), Some(&to)) =
            (self.outstanding.as_mut(), self.replicas.get(self.target))
        {
            *sent = self.ticks;
            out.push(ClientAction::Send {
                to,
                msg: OrderMsg::Request(req.clone()),
            });
        }
    }

    fn next(&mut self, out: &mut Vec<ClientAction>) {
        if self.outstanding.is_some() {
            return;
        }
        if let Some((payload, deadline_ms)) = self.queue.pop_front() {
            let req = Request {
                client: self.id,
                seq: self.next_seq,
                payload,
                deadline_ms,
            };
            self.next_seq += 1;
            self.expired = None;
            self.outstanding = Some((req, self.ticks));
            self.send_outstanding(out);
        }
    }

    /// The outstanding request ended without an answer, if it is `client`'s `seq`.
    fn ended(&mut self, client: u64, seq: u64, how: ClientAction, out: &mut Vec<ClientAction>) {
        let current = self.outstanding.as_ref().map(|(r, _)| r.seq);
        if client == self.id && current == Some(seq) {
            if let (Some((r, _)), ClientAction::Expired { .. }) = (self.outstanding.take(), &how) {
                self.expired = Some((r.seq, r.payload));
            }
            out.push(how);
            self.next(out);
        }
    }

    /// The payload of request `seq` if it is the latest that expired (taken once, and only
    /// until the client sends another): a caller that sends it again as a new request need
    /// not keep a copy of its own.
    pub fn take_expired(&mut self, seq: u64) -> Option<Vec<u8>> {
        match self.expired.take() {
            Some((s, payload)) if s == seq => Some(payload),
            other => {
                self.expired = other;
                None
            }
        }
    }

    /// Reacts to one input.
    pub fn step(&mut self, input: ClientInput, out: &mut Vec<ClientAction>) {
        match input {
            ClientInput::Submit {
                payload,
                deadline_ms,
            } => {
                self.queue.push_back((payload, deadline_ms));
                self.next(out);
            }
            ClientInput::Tick => {
                self.ticks += 1;
                let late = self
                    .outstanding
                    .as_ref()
                    .is_some_and(|(_, sent)| self.ticks - sent >= self.resend_ticks);
                if late && !self.replicas.is_empty() {
                    self.target = (self.target + 1) % self.replicas.len();
                    self.resends += 1;
                    self.send_outstanding(out);
                }
            }
            ClientInput::Message {
                msg:
                    OrderMsg::Reply {
                        client,
                        seq,
                        response,
                    },
                ..
            } => {
                let current = self.outstanding.as_ref().map(|(r, _)| r.seq);
                if client == self.id && current == Some(seq) {
                    self.outstanding = None;
                    out.push(ClientAction::Done { seq, response });
                    self.next(out);
                }
            }
            ClientInput::Message {
                msg: OrderMsg::Expired { client, seq },
                ..
            } => self.ended(client, seq, ClientAction::Expired { seq }, out),
            ClientInput::Message {
                msg: OrderMsg::Unknown { client, seq },
                ..
            } => self.ended(client, seq, ClientAction::Unknown { seq }, out),
            ClientInput::Message { .. } => {}
        }
    }
}
