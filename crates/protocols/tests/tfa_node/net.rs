//! A hand-driven network of TFA nodes: messages queued, delivered or dropped as a test says.

use std::collections::VecDeque;

use atomos_core::Key;
use atomos_protocols::tfa::{Action, Answer, Body, Reply, TfaConfig, TfaMsg, TfaNode};
use atomos_seam::Output;

pub(crate) fn cfg() -> TfaConfig {
    TfaConfig {
        lease: 5,
        abandon: 100,
        resend: 3,
        request_timeout: 20,
        max_hops: 8,
        busy_delay: 1,
        busy_retries: 2,
        lock_writes_at_read: true,
        contention_quiet: 0,
        forward_reads: true,
        planted_bug: None,
    }
}

/// Nodes 1..=n and the messages between them; `cut` drops every message to or from a node.
pub(crate) struct Net {
    pub(crate) nodes: Vec<TfaNode>,
    pub(crate) queue: VecDeque<(u64, u64, TfaMsg)>,
    pub(crate) replies: Vec<(u64, u64, Reply)>,
    pub(crate) cut: Option<u64>,
    pub(crate) now: u64,
}

impl Net {
    pub(crate) fn new(n: u64) -> Net {
        let members: Vec<u64> = (1..=n).collect();
        Net {
            nodes: members
                .iter()
                .map(|&me| TfaNode::new(me, members.clone(), 0, cfg()).unwrap())
                .collect(),
            queue: VecDeque::new(),
            replies: Vec::new(),
            cut: None,
            now: 0,
        }
    }

    pub(crate) fn node(&mut self, id: u64) -> &mut TfaNode {
        &mut self.nodes[id as usize - 1]
    }

    pub(crate) fn absorb(&mut self, from: u64, acts: Vec<Action>) {
        for a in acts {
            match a {
                Output::Send { to, msg } => {
                    if self.cut != Some(to) && self.cut != Some(from) {
                        self.queue.push_back((from, to, msg));
                    }
                }
                Output::Deliver(Answer { h, reply }) => self.replies.push((from, h, reply)),
                Output::Warn(_) => {}
                // Home records; what a restart reads back is the simulation's business.
                Output::Persist(_) => {}
            }
        }
    }

    /// Delivers messages until none is left.
    pub(crate) fn settle(&mut self) {
        while let Some((from, to, msg)) = self.queue.pop_front() {
            let mut acts = Vec::new();
            let now = self.now;
            self.node(to).on_message(now, from, msg, &mut acts);
            self.absorb(to, acts);
        }
    }

    /// Advances time by `n` ticks, settling after each.
    pub(crate) fn ticks(&mut self, n: u64) {
        for _ in 0..n {
            self.now += 1;
            for id in 1..=self.nodes.len() as u64 {
                let mut acts = Vec::new();
                let now = self.now;
                self.node(id).tick(now, &mut acts);
                self.absorb(id, acts);
            }
            self.settle();
        }
    }

    pub(crate) fn take_reply(&mut self, node: u64, h: u64) -> Option<Reply> {
        let i = self
            .replies
            .iter()
            .position(|(n, rh, _)| *n == node && *rh == h)?;
        Some(self.replies.remove(i).2)
    }

    /// Hands `op` to `node` for transaction `h` and runs the network until it is answered.
    pub(crate) fn answer(
        &mut self,
        node: u64,
        h: u64,
        op: impl FnOnce(&mut TfaNode, u64, &mut Vec<Action>),
    ) -> Reply {
        let mut acts = Vec::new();
        let now = self.now;
        op(self.node(node), now, &mut acts);
        self.absorb(node, acts);
        self.settle();
        for _ in 0..100 {
            if let Some(r) = self.take_reply(node, h) {
                return r;
            }
            self.ticks(1);
        }
        panic!("transaction {h} on node {node} got no answer");
    }

    /// Runs a read on `node` to its answer.
    pub(crate) fn read(&mut self, node: u64, h: u64, key: &Key) -> Reply {
        let key = key.clone();
        self.answer(node, h, |n, now, out| n.read(now, h, key, out))
    }

    /// Runs a read made for a write on `node` to its answer.
    pub(crate) fn read_for_write(&mut self, node: u64, h: u64, key: &Key) -> Reply {
        let key = key.clone();
        self.answer(node, h, |n, now, out| n.read_for_write(now, h, key, out))
    }

    /// Abandons transaction `h` of `node` and delivers what that sends.
    pub(crate) fn abort(&mut self, node: u64, h: u64) {
        let mut acts = Vec::new();
        let now = self.now;
        self.node(node).abort(now, h, &mut acts);
        self.absorb(node, acts);
        self.settle();
    }

    pub(crate) fn commit(
        &mut self,
        node: u64,
        h: u64,
        writes: Vec<(Key, Option<Vec<u8>>)>,
    ) -> Reply {
        self.answer(node, h, |n, now, out| n.commit(now, h, writes, out))
    }

    /// A whole transaction on `node`: read every key, write `value` to each.
    pub(crate) fn write_all(&mut self, node: u64, h: u64, keys: &[Key], value: u8) -> Reply {
        self.node(node).begin(h);
        for k in keys {
            if let r @ Reply::Read(Err(_)) = self.read(node, h, k) {
                return r;
            }
        }
        let writes = keys
            .iter()
            .map(|k| (k.clone(), Some(vec![value])))
            .collect();
        self.commit(node, h, writes)
    }

    pub(crate) fn owners(&self, key: &Key) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| n.objects().get(key).is_some_and(|h| h.version > 0))
            .map(TfaNode::id)
            .collect()
    }

    pub(crate) fn locks(&self) -> usize {
        self.nodes.iter().map(|n| n.objects().locks_held()).sum()
    }
}

pub(crate) fn read_value(net: &mut Net, node: u64, h: u64, key: &Key) -> Option<Vec<u8>> {
    net.node(node).begin(h);
    match net.read(node, h, key) {
        Reply::Read(Ok(v)) => {
            net.abort(node, h);
            v
        }
        other => panic!("read failed: {other:?}"),
    }
}

/// Node 2 owns `k`; node 1 reads it and sends its commit (the lock request is queued, not yet
/// delivered), as transaction handle 2.
pub(crate) fn commit_pending(net: &mut Net, k: &Key) {
    assert_eq!(
        net.write_all(2, 1, std::slice::from_ref(k), 1),
        Reply::Commit(Ok(()))
    );
    net.node(1).begin(2);
    assert!(matches!(net.read(1, 2, k), Reply::Read(Ok(_))));
    let mut acts = Vec::new();
    let now = net.now;
    net.node(1)
        .commit(now, 2, vec![(k.clone(), Some(vec![9]))], &mut acts);
    net.absorb(1, acts);
}

/// Counts the queued messages whose body `is`.
pub(crate) fn queued(net: &Net, is: impl Fn(&Body) -> bool) -> usize {
    net.queue.iter().filter(|(_, _, m)| is(&m.body)).count()
}
