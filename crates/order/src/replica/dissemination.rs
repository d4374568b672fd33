//! S-Paxos batch dissemination: a replica batches its clients' requests, persists each batch
//! and sends it to every member (learners too: they deliver what the voters do); each
//! persists it and acknowledges; once a quorum of the configuration in force holds it (a
//! majority of the voters, of both sets while joint; learners never count), its id is
//! proposed to Raft. When the leader and the origin are a quorum by themselves (three voters,
//! say) the leader proposes the batch on receipt, and a follower origin leaves it to the
//! leader (proposing it itself only if it is not in the log after `retry_ticks`). Lost
//! batches, acknowledgements and proposals are re-sent every `retry_ticks`; a batch an entry
//! needs and this replica lacks is fetched from the others.

use std::collections::{BTreeMap, BTreeSet};

use atomos_seam::Output;

use super::entries::{encode_batch, encode_stamp, lapses_at};
use super::Replica;
use crate::record::Record;
use crate::types::{Action, Addr, BatchId, OrderMsg, Request, StateMachine};

/// What a request holds besides its payload, in bytes (client, number, deadline), as counted
/// towards the batches a replica keeps.
const REQUEST_OVERHEAD: u64 = 24;

/// The batches a replica holds, forms and waits for.
#[derive(Debug, Default)]
pub(super) struct Batches {
    /// The contents of every batch this replica holds (formed here or received).
    pub(super) held: BTreeMap<BatchId, Vec<Request>>,
    /// Batches delivered finally, with when each lapses (their contents may be forgotten
    /// once compacted; the id itself once the final log time is past its lapse and no entry
    /// in the log holds it: see [`Batches::forget_lapsed`]).
    pub(super) delivered: BTreeMap<BatchId, u64>,
    /// The latest log index holding each batch id.
    pub(super) in_log: BTreeMap<BatchId, u64>,
    /// Batches asked of the others, and when.
    fetch_sent: BTreeMap<BatchId, u64>,
    /// Requests of the batch being formed, and since when it has been open.
    open: Vec<Request>,
    open_since: u64,
    /// The next number of a batch formed here.
    next_n: u64,
    /// Own batches not yet held by a quorum: who acknowledged, when last sent.
    unacked: BTreeMap<BatchId, (BTreeSet<Addr>, u64)>,
    /// Own batches held by a quorum and not yet delivered: when last proposed.
    proposed: BTreeMap<BatchId, u64>,
    /// Requests in this replica's batches that are not delivered yet.
    in_flight: BTreeSet<(u64, u64)>,
}

impl Batches {
    /// The batches a log held at start (`held`, of which `delivered` were delivered and
    /// `in_log` are ordered): own batches neither delivered nor ordered may never have reached
    /// a quorum, and go round again. This start numbers its batches from `next_n`.
    pub(super) fn new(
        me: Addr,
        held: BTreeMap<BatchId, Vec<Request>>,
        delivered: BTreeMap<BatchId, u64>,
        in_log: BTreeMap<BatchId, u64>,
        next_n: u64,
    ) -> Batches {
        let unacked = held
            .keys()
            .filter(|id| id.origin == me && !delivered.contains_key(id) && !in_log.contains_key(id))
            .map(|id| (*id, (BTreeSet::from([me]), 0)))
            .collect();
        let mut batches = Batches {
            held,
            delivered,
            in_log,
            next_n,
            unacked,
            ..Batches::default()
        };
        // Delivered batches the log holds no entry for (written before a snapshot covered
        // them) are not needed any more.
        batches.forget_covered(0);
        batches
    }

    /// Requests taken into this replica's batches and not yet delivered or dropped.
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether `id` is ordered in this replica's log or was delivered.
    pub(super) fn ordered(&self, id: &BatchId) -> bool {
        self.in_log.contains_key(id) || self.delivered.contains_key(id)
    }

    /// Whether `id` needs no more of this replica: it is delivered, or ordered, or unknown.
    fn settled(&self, id: &BatchId) -> bool {
        !self.held.contains_key(id)
            || self.in_log.contains_key(id)
            || self.delivered.contains_key(id)
    }

    /// Batch `id`, at a final position, is done: its requests (delivered or not) are no longer
    /// in flight, and nothing of it is re-sent or fetched. It lapses at `lapse`.
    pub(super) fn finished(&mut self, id: BatchId, lapse: u64) {
        if let Some(requests) = self.held.get(&id) {
            for r in requests {
                self.in_flight.remove(&(r.client, r.seq));
            }
        }
        self.delivered.insert(id, lapse);
        self.proposed.remove(&id);
        self.fetch_sent.remove(&id);
    }

    /// A request of this replica's batches was decided at a final position.
    pub(super) fn decided(&mut self, client: u64, seq: u64) {
        self.in_flight.remove(&(client, seq));
    }

    /// Keeps in flight only the requests `still` holds undecided (after a snapshot).
    pub(super) fn retain_in_flight(&mut self, still: impl Fn(u64, u64) -> bool) {
        self.in_flight.retain(|&(c, seq)| still(c, seq));
    }

    /// Where a snapshot at `through` compacts the log to keep the newest entries after `after`
    /// whose batches hold at most `budget` bytes: the earliest `k` in `after..=through` such
    /// that the batches held for entries in `k + 1..=through` fit the budget.
    pub(super) fn keep_within(&self, after: u64, through: u64, budget: u64) -> u64 {
        let mut held: Vec<(u64, u64)> = self
            .in_log
            .iter()
            .filter(|(_, at)| **at > after && **at <= through)
            .filter_map(|(id, at)| {
                let bytes = self.held.get(id)?.iter();
                Some((
                    *at,
                    bytes
                        .map(|r| r.payload.len() as u64 + REQUEST_OVERHEAD)
                        .sum(),
                ))
            })
            .collect();
        held.sort_unstable_by_key(|&(at, _)| std::cmp::Reverse(at));
        let mut total = 0u64;
        for (at, bytes) in held {
            total += bytes;
            if total > budget {
                return at;
            }
        }
        after
    }

    /// Forgets the contents of every delivered batch that no entry after `index` holds (a
    /// snapshot of `index` was installed or adopted): its entries are gone, and a batch that
    /// came by dissemination while this replica's log lagged was never in it.
    pub(super) fn forget_covered(&mut self, index: u64) {
        self.in_log.retain(|_, at| *at > index);
        let (delivered, in_log) = (&self.delivered, &self.in_log);
        self.held
            .retain(|id, _| !delivered.contains_key(id) || in_log.contains_key(id));
    }

    /// Forgets every batch that lapsed before `final_time` and that no entry in the log holds:
    /// delivered ids, contents held, own batches waiting for acknowledgements or for the log.
    /// Any later entry ordering one of them has a log time of at least `final_time`, past its
    /// lapse, and orders nothing whatever this replica remembers.
    /// Returns how many ids and batches it forgot.
    pub(super) fn forget_lapsed(&mut self, final_time: u64) -> u64 {
        let in_log = &self.in_log;
        let gone = |id: &BatchId, lapse: u64| lapse < final_time && !in_log.contains_key(id);
        let before = self.delivered.len();
        self.delivered.retain(|id, lapse| !gone(id, *lapse));
        let mut forgotten = (before - self.delivered.len()) as u64;
        let dead: Vec<BatchId> = self
            .held
            .iter()
            .filter(|(id, requests)| gone(id, lapses_at(requests)))
            .map(|(id, _)| *id)
            .collect();
        forgotten += dead.len() as u64;
        for id in dead {
            if let Some(requests) = self.held.remove(&id) {
                for r in requests {
                    self.in_flight.remove(&(r.client, r.seq));
                }
            }
            self.unacked.remove(&id);
            self.proposed.remove(&id);
            self.fetch_sent.remove(&id);
        }
        forgotten
    }

    /// Forgets the contents of delivered batches whose entries are at or before `index`: only
    /// entries still in the log need them.
    pub(super) fn forget_delivered(&mut self, index: u64) {
        let gone: Vec<BatchId> = self
            .in_log
            .iter()
            .filter(|(id, at)| **at <= index && self.delivered.contains_key(id))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.in_log.remove(&id);
            self.held.remove(&id);
        }
    }
}

impl<S: StateMachine> Replica<S> {
    /// A client's request to order: into the open batch (once), sealed when full.
    pub(super) fn take_request(&mut self, req: Request, out: &mut Vec<Action>) {
        let b = &mut self.batches;
        if b.in_flight.insert((req.client, req.seq)) {
            if b.open.is_empty() {
                b.open_since = self.ticks;
            }
            b.open.push(req);
            if b.open.len() >= self.cfg.batch_max {
                self.seal(out);
            }
        }
    }

    /// Seals the open batch if it holds requests (`now`), or if it has been open
    /// `batch_delay_ticks`.
    pub(super) fn seal_due(&mut self, now: bool, out: &mut Vec<Action>) {
        let b = &self.batches;
        let due = now || self.ticks - b.open_since >= self.cfg.batch_delay_ticks;
        if !b.open.is_empty() && due {
            self.seal(out);
        }
    }

    /// Persists the open batch and sends it to every other replica.
    fn seal(&mut self, out: &mut Vec<Action>) {
        let id = BatchId {
            origin: self.cfg.id,
            n: self.batches.next_n,
        };
        self.batches.next_n += 1;
        let requests = std::mem::take(&mut self.batches.open);
        self.write(&Record::Batch {
            id,
            requests: requests.clone(),
        });
        self.flush(out);
        for to in self.others() {
            out.push(Output::Send {
                to,
                msg: OrderMsg::Batch {
                    id,
                    requests: requests.clone(),
                },
            });
        }
        self.batches.held.insert(id, requests);
        if self.quorum(&BTreeSet::from([self.cfg.id])) {
            self.propose(id);
        } else {
            self.batches
                .unacked
                .insert(id, (BTreeSet::from([self.cfg.id]), self.ticks));
        }
    }

    /// Re-sends, every `retry_ticks`, the batches not yet held by a quorum (to those that
    /// did not acknowledge) and the proposals not yet in the log.
    pub(super) fn retry_dissemination(&mut self, out: &mut Vec<Action>) {
        // Batches delivered meanwhile (a snapshot can deliver them wholesale) are done; their
        // contents may already be forgotten, so they must not be re-sent below.
        let b = &mut self.batches;
        let delivered = &b.delivered;
        b.proposed.retain(|id, _| !delivered.contains_key(id));
        b.unacked.retain(|id, _| !delivered.contains_key(id));
        // The configuration may have changed since: acknowledgements in hand may be a quorum
        // now (and nobody else left to acknowledge).
        let held: Vec<BatchId> = self
            .batches
            .unacked
            .iter()
            .filter(|(_, (acks, _))| self.quorum(acks))
            .map(|(id, _)| *id)
            .collect();
        for id in held {
            self.held_by_quorum(id);
        }
        let b = &mut self.batches;
        let (now, retry) = (self.ticks, self.cfg.retry_ticks);
        for (id, (acks, sent)) in &mut b.unacked {
            if now < *sent + retry {
                continue;
            }
            *sent = now;
            // Never a batch without its contents: a replica taking one would deliver nothing
            // where the others deliver the requests.
            let Some(requests) = b.held.get(id) else {
                continue;
            };
            for to in self.members.all().into_iter().filter(|r| !acks.contains(r)) {
                out.push(Output::Send {
                    to,
                    msg: OrderMsg::Batch {
                        id: *id,
                        requests: requests.clone(),
                    },
                });
            }
        }
        let repropose: Vec<BatchId> = b
            .proposed
            .iter()
            .filter(|(id, at)| !b.in_log.contains_key(id) && now >= **at + retry)
            .map(|(id, _)| *id)
            .collect();
        for id in repropose {
            self.propose(id);
        }
    }

    /// A batch from a replica: persisted (if new) and acknowledged to its origin; a leader
    /// that with the origin makes a quorum proposes it at once.
    pub(super) fn on_batch(
        &mut self,
        from: Addr,
        id: BatchId,
        requests: Vec<Request>,
        out: &mut Vec<Action>,
    ) {
        if lapses_at(&requests) < self.delivery.final_time {
            // It lapsed here: an entry ordering it would order nothing, so it is neither kept
            // nor acknowledged (its origin forgets it too).
            return;
        }
        if !self.batches.held.contains_key(&id) && !self.batches.delivered.contains_key(&id) {
            self.write(&Record::Batch {
                id,
                requests: requests.clone(),
            });
            // The acknowledgement below promises the batch is durable here.
            self.flush(out);
            self.batches.held.insert(id, requests);
        }
        if id.origin == from {
            out.push(Output::Send {
                to: from,
                msg: OrderMsg::BatchAck { id },
            });
            if self.leader_orders_for(from) && !self.batches.settled(&id) {
                // The origin persisted the batch before sending it and this replica has just
                // persisted it (the proposal's messages wait for that write): a majority
                // holds it.
                self.propose_entry(id);
            }
        }
    }

    /// A replica holds batch `id`: once a quorum does, it is proposed.
    pub(super) fn on_batch_ack(&mut self, from: Addr, id: BatchId) {
        let Some((acks, _)) = self.batches.unacked.get_mut(&id) else {
            return;
        };
        acks.insert(from);
        let acks = acks.clone();
        if self.quorum(&acks) {
            self.held_by_quorum(id);
        }
    }

    /// Own batch `id` is held by a quorum: proposed (unless the leader did on receipt).
    fn held_by_quorum(&mut self, id: BatchId) {
        self.batches.unacked.remove(&id);
        let leader = self.raft.raft.leader_id;
        if leader != 0
            && leader != self.cfg.id
            && self.quorum(&BTreeSet::from([leader, self.cfg.id]))
        {
            // The leader proposed it when the batch reached it; proposing here too would order
            // it twice. It is proposed from here only if it is not in the log after
            // `retry_ticks` (the leader changed, say).
            self.batches.proposed.insert(id, self.ticks);
        } else {
            self.propose(id);
        }
    }

    /// A replica asks for batch `id`: sent if held here.
    pub(super) fn on_fetch_batch(&mut self, from: Addr, id: BatchId, out: &mut Vec<Action>) {
        if let Some(requests) = self.batches.held.get(&id) {
            out.push(Output::Send {
                to: from,
                msg: OrderMsg::Batch {
                    id,
                    requests: requests.clone(),
                },
            });
        }
    }

    /// Asks the others for batch `id`, at most every `retry_ticks`.
    pub(super) fn want(&mut self, id: BatchId, out: &mut Vec<Action>) {
        let due = self
            .batches
            .fetch_sent
            .get(&id)
            .is_none_or(|at| self.ticks >= at + self.cfg.retry_ticks);
        if due {
            self.batches.fetch_sent.insert(id, self.ticks);
            for to in self.others() {
                out.push(Output::Send {
                    to,
                    msg: OrderMsg::FetchBatch { id },
                });
            }
        }
    }

    fn propose(&mut self, id: BatchId) {
        self.batches.proposed.insert(id, self.ticks);
        // Dropped when there is no leader: retried after `retry_ticks`.
        self.propose_entry(id);
    }

    /// Proposes an entry ordering batch `id`, stamped with this replica's clock reading (a
    /// leader that has it in its log already or delivered it does not order it again).
    fn propose_entry(&mut self, id: BatchId) {
        if self.is_leader() && self.batches.ordered(&id) {
            return;
        }
        // Only a batch held here is proposed: its entry says when it lapses.
        let Some(lapse) = self.batches.held.get(&id).map(|r| lapses_at(r)) else {
            return;
        };
        let _ = self
            .raft
            .propose(encode_stamp(self.now_ms), encode_batch(id, lapse));
    }

    /// Whether this replica, as leader, proposes the batches `origin` sends it on receipt: it
    /// leads, `origin` is another replica, and the two of them are a quorum.
    fn leader_orders_for(&self, origin: Addr) -> bool {
        self.is_leader()
            && origin != self.cfg.id
            && self.quorum(&BTreeSet::from([self.cfg.id, origin]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> BatchId {
        BatchId { origin: 1, n }
    }

    /// After a snapshot of 10 is installed, only batches still needed stay: undelivered ones
    /// and those an entry after 10 holds, not a delivered one that came by dissemination and
    /// was never in this replica's log.
    #[test]
    fn a_snapshot_installed_forgets_every_delivered_batch_no_later_entry_holds() {
        let held = (1..=4).map(|n| (id(n), Vec::new())).collect();
        let delivered = [1, 2, 4].map(|n| (id(n), u64::MAX)).into_iter().collect();
        let in_log = [(id(1), 5), (id(4), 12)].into_iter().collect();
        let mut batches = Batches::new(2, held, delivered, in_log, 100);
        batches.forget_covered(10);
        assert_eq!(
            batches.held.keys().copied().collect::<Vec<_>>(),
            [3, 4].map(id)
        );
        assert_eq!(batches.in_log.keys().copied().collect::<Vec<_>>(), [id(4)]);
    }
}
