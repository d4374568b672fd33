//! One replica stepped by hand, its writes confirmed at once, and a link between a leader
//! and a learner: what the order layer's single-replica tests share.

// Each test binary uses a part of what is here.
#![allow(dead_code)]

use atomos_order::{
    decode_log, ChangeRefused, Command, Delivery, Input, MemberChange, OrderMsg, Register, Replica,
    ReplicaConfig,
};
use atomos_seam::{Machine, Output, Write};

/// A replica, with every record it wrote (each write confirmed at once).
pub struct Solo {
    pub replica: Replica<Register>,
    pub log: Vec<Vec<u8>>,
    pub written: u64,
    pub deliveries: Vec<Delivery>,
    /// Messages sent, oldest first.
    pub sent: Vec<(u64, OrderMsg)>,
    /// Requests [`Solo::put`] submitted (its client's numbers).
    pub puts: u64,
    /// The clock every step reads (milliseconds).
    pub now: u64,
}

impl Solo {
    pub fn open(cfg: ReplicaConfig, log: Vec<Vec<u8>>) -> Solo {
        Solo::open_with(cfg, log, Register::new())
    }

    pub fn open_with(cfg: ReplicaConfig, log: Vec<Vec<u8>>, machine: Register) -> Solo {
        let records = decode_log(&log).expect("decodes");
        let replica = Replica::open(cfg, records, machine).expect("opens");
        Solo {
            replica,
            log,
            written: 0,
            deliveries: Vec::new(),
            sent: Vec::new(),
            puts: 0,
            now: 0,
        }
    }

    pub fn step(&mut self, input: Input) {
        let mut out = Vec::new();
        self.replica.step(self.now, input, &mut out).expect("steps");
        let mut writes = 0;
        for o in out {
            match o {
                Output::Persist(Write::Append(records)) => {
                    self.log.extend(records.iter().map(|r| r.to_vec()));
                    writes += 1;
                }
                Output::Persist(Write::Rewrite(records) | Write::Compact(records)) => {
                    self.log = records.iter().map(|r| r.to_vec()).collect();
                    writes += 1;
                }
                Output::Deliver(d) => self.deliveries.push(d),
                Output::Send { to, msg } => self.sent.push((to, msg)),
                Output::Warn(_) => {}
            }
        }
        if writes > 0 {
            self.written += writes;
            let through = self.written;
            self.step(Input::Persisted { through });
        }
    }

    /// Orders a write of `bytes` bytes to register `key` (client 100's next request) and seals
    /// its batch.
    pub fn put(&mut self, key: &str, bytes: usize) {
        let value = vec![(self.puts + 1) as u8; bytes];
        self.order(atomos_order::RegisterOp::Put {
            key: key.into(),
            value,
        });
    }

    /// Orders `op` as client 100's next request and seals its batch.
    pub fn order(&mut self, op: atomos_order::RegisterOp) {
        self.order_until(op, atomos_order::NO_DEADLINE);
    }

    /// Orders `op` as client 100's next request, which expires after `deadline_ms`, and
    /// seals its batch.
    pub fn order_until(&mut self, op: atomos_order::RegisterOp, deadline_ms: u64) {
        self.puts += 1;
        let request = atomos_order::Request {
            client: 100,
            seq: self.puts,
            payload: op.encode(),
            deadline_ms,
        };
        self.send(request);
    }

    /// Sends `request` (from its client, at the address of the client's id) and seals its
    /// batch.
    pub fn send(&mut self, request: atomos_order::Request) {
        self.step(Input::Message {
            from: request.client,
            msg: OrderMsg::Request(request),
        });
        self.step(Input::Request(Command::Flush));
    }

    /// Ticks until the replica leads (a cluster of one elects itself).
    pub fn lead(&mut self) {
        for _ in 0..200 {
            if self.replica.is_leader() {
                return;
            }
            self.step(Input::Tick);
        }
        panic!("never led: {}", self.replica.describe());
    }

    /// Asks (as ticket 1) to add replica 2 as a learner at address 10.0.0.2:7400; panics if
    /// the change is refused.
    pub fn add_learner_2(&mut self) {
        let add = MemberChange::AddLearner {
            id: 2,
            context: b"10.0.0.2:7400".to_vec(),
        };
        self.ask(1, add).expect("proposed");
    }

    /// Asks for `change` and returns the answer.
    pub fn ask(&mut self, ticket: u64, change: MemberChange) -> Result<u64, ChangeRefused> {
        self.step(Input::Request(Command::ChangeMembership { ticket, change }));
        self.deliveries
            .iter()
            .rev()
            .find_map(|d| match d {
                Delivery::MemberChange { ticket: t, result } if *t == ticket => {
                    Some(result.clone())
                }
                _ => None,
            })
            .expect("answered")
    }
}

/// Appends `n` values to register `k` as client 100's next requests, one batch each.
pub fn append_values(solo: &mut Solo, n: u64) {
    for _ in 0..n {
        let value = vec![(solo.puts + 1) as u8; 32];
        solo.order(atomos_order::RegisterOp::Append {
            key: "k".into(),
            value,
        });
    }
}

/// The messages between a leader (replica 1) and a learner (replica 2), delivered in order.
#[derive(Default)]
pub struct Link {
    pub to_learner: std::collections::VecDeque<OrderMsg>,
    pub to_leader: std::collections::VecDeque<OrderMsg>,
}

/// What `solo` sent to replica `id`, oldest first (the rest is dropped).
pub fn sent_to(solo: &mut Solo, id: u64) -> Vec<OrderMsg> {
    solo.sent
        .drain(..)
        .filter(|(to, _)| *to == id)
        .map(|(_, msg)| msg)
        .collect()
}

impl Link {
    /// One round: both tick, the leader takes what the learner sent, and the learner what
    /// the leader sent, unless `held`. Returns the stream chunks the learner received.
    pub fn pump(&mut self, leader: &mut Solo, learner: &mut Solo, held: bool) -> usize {
        let mut chunks = 0;
        leader.step(Input::Tick);
        learner.step(Input::Tick);
        self.to_learner.extend(sent_to(leader, 2));
        self.to_leader.extend(sent_to(learner, 1));
        while let Some(msg) = self.to_leader.pop_front() {
            leader.step(Input::Message { from: 2, msg });
        }
        self.to_learner.extend(sent_to(leader, 2));
        if !held {
            while let Some(msg) = self.to_learner.pop_front() {
                chunks += usize::from(matches!(msg, OrderMsg::StreamChunk { .. }));
                learner.step(Input::Message { from: 1, msg });
            }
        }
        chunks
    }

    /// Rounds until the learner delivered as far as the leader (at most `rounds`).
    pub fn catch_up(&mut self, leader: &mut Solo, learner: &mut Solo, rounds: usize) {
        for _ in 0..rounds {
            if learner.replica.final_next() == leader.replica.final_next() {
                break;
            }
            self.pump(leader, learner, false);
        }
        assert_eq!(
            learner.replica.final_next(),
            leader.replica.final_next(),
            "the learner caught up: {}",
            learner.replica.describe()
        );
    }
}

/// `cfg` for replica 2, joining.
pub fn learner_cfg(cfg: &ReplicaConfig) -> ReplicaConfig {
    ReplicaConfig {
        id: 2,
        replicas: Vec::new(),
        ..cfg.clone()
    }
}

/// A fresh learner, replica 2, configured as `cfg` but joining.
pub fn learner_of(cfg: &ReplicaConfig) -> Solo {
    Solo::open(learner_cfg(cfg), Vec::new())
}
