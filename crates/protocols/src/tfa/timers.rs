//! What a TFA node does as time passes: re-sends, timeouts, batched directory updates and
//! confirmations, and questions about locks held past their lease.

use std::collections::{BTreeMap, BTreeSet};

use atomos_core::Key;
use atomos_seam::Output;

use super::directory::{Directory, NodeId};
use super::msg::Body;
use super::node::*;
use super::roles::*;

impl TfaNode {
    /// Time passes: re-sends what is unanswered, fails transactions whose requests timed out,
    /// and asks committers about locks past their lease.
    pub fn tick(&mut self, now: u64, out: &mut Vec<Action>) {
        self.start(now, out);
        self.greet(now, out);
        let mut expired = Vec::new();
        let mut resend = Vec::new();
        let mut refetch = Vec::new();
        for (&h, tx) in &mut self.coord.active {
            if let Some(o) = tx.outstanding.get(&BUSY_WAIT) {
                if now >= o.deadline {
                    refetch.push((h, o.key.clone(), o.to));
                }
                continue;
            }
            for o in tx.outstanding.values_mut() {
                if now >= o.deadline {
                    expired.push((
                        h,
                        Failure::Unavailable {
                            key: o.key.clone(),
                            node: o.to,
                        },
                    ));
                    break;
                }
                if now >= o.sent + self.cfg.resend {
                    o.sent = now;
                    resend.push((o.to, o.body.clone()));
                }
            }
        }
        expired.sort_by_key(|(h, _)| *h);
        for (to, body) in resend {
            self.send(to, body, out);
        }
        for (h, failure) in expired {
            self.fail(now, h, failure, out);
        }
        for (h, key, to) in refetch {
            if let Some(tx) = self.coord.active.get_mut(&h) {
                tx.outstanding.remove(&BUSY_WAIT);
            }
            self.fetch_from(now, h, key, to, out);
        }
        let mut gone = Vec::new();
        let mut repeat = Vec::new();
        for (tx, p) in &mut self.coord.decided {
            // Kept well past the owners' abandon time: an owner asking later must never be told
            // "abort" about a committed transaction.
            if now >= p.since + self.cfg.abandon.saturating_mul(2) {
                gone.push(*tx);
            } else if now >= p.sent + self.cfg.resend {
                p.sent = now;
                for &owner in &p.waiting {
                    let taken = p.taken.get(&owner).cloned().unwrap_or_default();
                    repeat.push((
                        owner,
                        Body::Decided {
                            tx: *tx,
                            decision: p.decision,
                            taken,
                        },
                    ));
                }
            }
        }
        for tx in gone {
            self.coord.decided.remove(&tx);
        }
        repeat.sort_by_key(|(to, _)| *to);
        for (to, body) in repeat {
            self.send(to, body, out);
        }
        let mut tracks: BTreeMap<NodeId, Vec<(Key, u64)>> = BTreeMap::new();
        let mut losses: BTreeMap<NodeId, Vec<(Key, u64, NodeId)>> = BTreeMap::new();
        let (dir, resend, abandon) = (&self.dir, self.cfg.resend, self.cfg.abandon);
        self.owner.tracking.retain(|key, t| {
            // A loss report is kept until confirmed: given up, the home would go on naming a
            // node that holds nothing.
            if t.lost_with.is_none() && now >= t.since + abandon {
                return false;
            }
            if t.sent.is_none_or(|s| now >= s + resend) {
                t.sent = Some(now);
                let home = dir.home(key);
                match t.lost_with {
                    None => tracks
                        .entry(home)
                        .or_default()
                        .push((key.clone(), t.version)),
                    Some(node) => {
                        losses
                            .entry(home)
                            .or_default()
                            .push((key.clone(), t.version, node))
                    }
                }
            }
            true
        });
        for (home, entries) in tracks {
            self.send(home, Body::Track { entries }, out);
        }
        for (home, entries) in losses {
            self.send(home, Body::Lost { entries }, out);
        }
        for (to, acks) in std::mem::take(&mut self.acks) {
            if !acks.done.is_empty() {
                self.send(to, Body::Done { txs: acks.done }, out);
            }
            if !acks.tracked.is_empty() {
                self.send(
                    to,
                    Body::Tracked {
                        entries: acks.tracked,
                    },
                    out,
                );
            }
        }
        let mut ask: BTreeSet<(NodeId, u64)> = BTreeSet::new();
        let mut gone: BTreeSet<(NodeId, u64)> = BTreeSet::new();
        let heard = &self.home.heard;
        for hold in self.home.abstract_held.values_mut() {
            if hold.ask_at <= now {
                hold.ask_at = now + self.cfg.lease;
                let last = heard.get(&hold.holder).copied().unwrap_or(0);
                // A family of this node is asked directly: it is never silent.
                if hold.holder.0 != self.me && now >= last + self.cfg.abandon {
                    gone.insert(hold.holder);
                } else {
                    ask.insert(hold.holder);
                }
            }
        }
        for holder in gone {
            self.free_abstract_of(holder, u64::MAX);
            out.push(Output::Warn(format!(
                "released the abstract locks of family {} of node {} after no answer",
                holder.1, holder.0
            )));
        }
        for (node, family) in ask {
            if node != self.me {
                self.send(node, Body::FamilyAlive { family }, out);
            } else if self.coord.family_runs(family) {
                self.heard_from(now, (node, family));
            } else {
                self.free_abstract_of((node, family), u64::MAX);
            }
        }
        // Holders with no lock left here are forgotten.
        let holders: BTreeSet<(NodeId, u64)> =
            self.home.abstract_held.values().map(|h| h.holder).collect();
        self.home.heard.retain(|h, _| holders.contains(h));
        for (tx, held_for) in self.owner.objects.overdue(now, self.cfg.lease) {
            if tx.node == self.me {
                // Our own transaction. Committing, it ends its locks itself (decision or
                // timeout). Still working, it gives up the locks it took with reads, as it
                // does when another node's owner asks: its application may be busy, or its
                // task preempted behind the very transactions its locks refuse.
                if let Standing::Working(h) = self.standing(tx) {
                    self.give_up_number(now, h, out);
                }
                continue;
            }
            if held_for >= self.cfg.abandon {
                // Released, the old copies could fork from what the committer took: in doubt.
                let before = self.counters.dropped_lost;
                self.drop_in_doubt(now, tx, out);
                self.counters.abandoned_locks += self.counters.dropped_lost - before;
            } else {
                self.send(tx.node, Body::Ask { tx }, out);
            }
        }
    }
}
