//! TFA messages fed to a node of a cluster running transfers of its own.

use std::sync::atomic::Ordering;

use arbitrary::Arbitrary;
use atomos::protocols::tfa::{Reply, TfaConfig, TfaMsg, TfaNode, TfaRequest};
use atomos::Key;
use atomos::NodeMsg;
use atomos_seam::{Input, Machine};

use super::order::*;
use super::wire::*;
use atomos_sim::fuzz::*;

/// Three TFA nodes running transfers among themselves, so the one under fuzzing owns objects,
/// holds locks, tracks keys and coordinates transactions of its own while the inputs arrive.
pub(crate) struct TfaCluster {
    pub(crate) nodes: Vec<TfaNode>,
    pub(crate) queue: std::collections::VecDeque<(u64, u64, TfaMsg)>,
    pub(crate) answers: Vec<(u64, atomos::protocols::tfa::Answer)>,
    pub(crate) next_h: u64,
    pub(crate) now: u64,
    pub(crate) commits: u64,
}

impl TfaCluster {
    pub(crate) fn new() -> TfaCluster {
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

    pub(crate) fn step(&mut self, node: u64, input: Input<TfaMsg, TfaRequest>) {
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
    pub(crate) fn settle(&mut self) {
        for _ in 0..10_000 {
            let Some((from, to, msg)) = self.queue.pop_front() else {
                return;
            };
            self.step(to, Input::Message { from, msg });
        }
    }

    /// The answer to transaction `h` on `node`, once the messages settled.
    pub(crate) fn answer(&mut self, node: u64, h: u64) -> Option<Reply> {
        self.settle();
        let i = self
            .answers
            .iter()
            .position(|(n, a)| *n == node && a.h == h)?;
        Some(self.answers.remove(i).1.reply)
    }

    /// A transfer on `node`: reads both keys, writes each one more than it read.
    pub(crate) fn transfer(&mut self, node: u64, keys: [Key; 2]) {
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

    pub(crate) fn tick(&mut self) {
        self.now += 1;
        for id in 1..=3 {
            self.step(id, Input::Tick);
        }
        self.settle();
    }
}

#[test]
pub(crate) fn tfa_messages_decode_to_steps_or_errors() {
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
