//! Optimistic and final delivery. An entry is optimistically delivered when it is in this
//! replica's log (the leader's proposal, persisted), its batch is here, and every earlier entry
//! was optimistically delivered; finally delivered when it is committed, durable here and was
//! optimistically delivered. Raft overwrites a follower's uncommitted entries after a leader
//! change without telling anyone: the log store reports the first replaced index, and every
//! optimistic delivery from there on is revoked.
//!
//! Every entry carries its proposer's clock reading. The log's time at an entry is the latest
//! reading on it and before it: a function of the log alone, which never goes back. A request
//! whose deadline is before the log's time at its entry expires there, on every replica alike.

use std::collections::{BTreeMap, BTreeSet};

use atomos_seam::Output;

use super::clients::{Admission, Ahead, Decided, Last};
use super::config::PlantedBug;
use super::entries::{entry_batch, entry_lapse, entry_stamp};
use super::reconfigure::ConfigEntry;
use super::Replica;
use crate::error::OrderError;
use crate::types::{Action, BatchId, Delivery, Request, StateMachine};

/// An entry optimistically delivered and not yet final.
#[derive(Debug)]
struct Pending {
    batch: Option<BatchId>,
    /// When the batch lapses (see `entries::lapses_at`; `u64::MAX` for an entry that does not
    /// say).
    lapse: u64,
    /// The batch, if it had lapsed at the entry (it orders nothing; `batch` is then `None`).
    lapsed: Option<BatchId>,
    /// The requests that run there, in the batch's order.
    requests: Vec<Request>,
    /// Every request decided there (run or expired), in the batch's order.
    decided: Vec<Decided>,
    /// The log's time at the entry.
    time: u64,
    /// The membership change the entry carries, if it is one (applied when it is final).
    change: Option<ConfigEntry>,
}

/// Where a replica's deliveries stand.
#[derive(Debug)]
pub(super) struct Deliveries {
    /// Entries optimistically delivered and not yet final, by position.
    pending: BTreeMap<u64, Pending>,
    /// The batches those entries carry (each at most once: a duplicate's entry carries none).
    pending_batches: BTreeSet<BatchId>,
    /// What those entries did to the clients' sessions.
    ahead: Ahead,
    /// The next position to deliver optimistically...
    pub(super) opt_next: u64,
    /// ...and finally.
    pub(super) final_next: u64,
    /// The log's time at the last optimistically delivered entry...
    opt_time: u64,
    /// ...and at the last finally delivered one.
    pub(super) final_time: u64,
    /// Entries this step may still deliver optimistically...
    opt_left: usize,
    /// ...and finally ([`crate::ReplicaConfig::deliveries_per_step`]).
    final_left: usize,
    /// This step stopped delivering for its budget with more to deliver.
    pub(super) cut_short: bool,
    /// The highest index Raft reported committed.
    pub(super) commit: u64,
    /// The batch the next optimistic delivery waits for, and since when.
    pub(super) missing: Option<(BatchId, u64)>,
    /// What the log holds past the replica's latest snapshot, in bytes as estimated at final
    /// delivery (requests' payloads and [`ENTRY_BYTES`] per entry): a snapshot rewrites the
    /// whole state, so it waits until the log is worth compacting.
    pub(super) since_snapshot_bytes: u64,
}

/// What one entry costs in a replica's log and memory besides its requests' payloads (Raft's
/// entry, the batch's bookkeeping), as [`Deliveries::since_snapshot_bytes`] counts it.
pub(super) const ENTRY_BYTES: u64 = 128;

impl Deliveries {
    /// Deliveries resuming after position `base` (a snapshot's, or 0), whose log time was
    /// `time`; Raft had committed through `commit`.
    pub(super) fn new(base: u64, time: u64, commit: u64) -> Deliveries {
        Deliveries {
            pending: BTreeMap::new(),
            pending_batches: BTreeSet::new(),
            ahead: Ahead::default(),
            opt_next: base + 1,
            final_next: base + 1,
            opt_time: time,
            final_time: time,
            opt_left: 0,
            final_left: 0,
            cut_short: false,
            commit,
            missing: None,
            since_snapshot_bytes: 0,
        }
    }

    /// Everything through `index` is delivered (a snapshot's state was taken), at log time
    /// `time`; nothing is pending (revoke first).
    pub(super) fn skip_to(&mut self, index: u64, time: u64) {
        self.missing = None;
        self.opt_next = index + 1;
        self.final_next = index + 1;
        self.final_time = time;
        self.opt_time = time;
        self.commit = self.commit.max(index);
        self.since_snapshot_bytes = 0;
    }

    /// Whether `id` was delivered optimistically at a position not yet final.
    fn pending_batch(&self, id: BatchId) -> bool {
        self.pending_batches.contains(&id)
    }

    /// A new step may deliver `budget` entries optimistically and as many finally.
    pub(super) fn new_step(&mut self, budget: usize) {
        self.opt_left = budget.max(1);
        self.final_left = budget.max(1);
        self.cut_short = false;
    }
}

/// How many committed entries past a missing batch a replica asks for the batches of at once.
const FETCH_AHEAD: u64 = 128;

impl<S: StateMachine> Replica<S> {
    /// Delivers what the log and the batches here allow: optimistically, then finally.
    pub(super) fn deliver(&mut self, out: &mut Vec<Action>) -> Result<(), OrderError> {
        self.deliver_optimistically(out);
        self.deliver_finally(out);
        self.maybe_snapshot(out)
    }

    /// Asks for the batches of the committed entries after `seq` (up to [`FETCH_AHEAD`]) that
    /// are not here: a replica catching up from the log (a learner after its snapshot, whose
    /// inbox overflowed while it installed it) would otherwise wait a round trip per entry.
    fn want_ahead(&mut self, seq: u64, out: &mut Vec<Action>) {
        let store = self.raft.store();
        let through = self
            .delivery
            .commit
            .min(store.last())
            .min(seq + FETCH_AHEAD);
        let batches = &self.batches;
        let missing: Vec<BatchId> = (seq + 1..=through)
            .filter_map(|i| store.entry(i))
            // An entry stamped after its batch lapsed orders nothing: no need for its batch.
            .filter(|e| entry_lapse(e).is_none_or(|lapse| entry_stamp(e) <= lapse))
            .filter_map(entry_batch)
            .filter(|id| !batches.held.contains_key(id) && !batches.delivered.contains_key(id))
            .collect();
        for id in missing {
            self.want(id, out);
        }
    }

    fn deliver_optimistically(&mut self, out: &mut Vec<Action>) {
        while self.delivery.opt_next <= self.raft.store().last() {
            if self.delivery.opt_left == 0 {
                self.delivery.cut_short = true;
                break;
            }
            let seq = self.delivery.opt_next;
            let entry = self.raft.store().entry(seq);
            let batch = entry.and_then(entry_batch);
            let change = entry.and_then(ConfigEntry::of);
            let time = self.delivery.opt_time.max(entry.map_or(0, entry_stamp));
            let lapse = entry.and_then(entry_lapse).unwrap_or(u64::MAX);
            // Past its lapse a batch orders nothing, wherever it is delivered (a replica may
            // have forgotten it, or never held it): decided before anything else.
            let lapsed = batch.is_some()
                && time > lapse
                && self.cfg.planted_bug != Some(PlantedBug::LapseIgnored);
            let duplicate = !lapsed
                && batch.is_some_and(|id| {
                    self.batches.delivered.contains_key(&id) || self.delivery.pending_batch(id)
                });
            // What decides expiry: the log's time, unless a planted bug makes it the clock.
            let expiry_time = match self.cfg.planted_bug {
                Some(PlantedBug::ExpireByOwnClock) => self.now_ms,
                _ => time,
            };
            let admission = match batch {
                Some(id) if !duplicate && !lapsed => match self.batches.held.get(&id) {
                    Some(reqs) => self
                        .clients
                        .admit(reqs, expiry_time, &mut self.delivery.ahead),
                    None => {
                        let d = &mut self.delivery;
                        if d.missing.is_none_or(|(m, _)| m != id) {
                            d.missing = Some((id, self.ticks));
                        }
                        self.want(id, out);
                        self.want_ahead(seq, out);
                        break;
                    }
                },
                _ => Admission::default(),
            };
            let requests = admission.admitted;
            self.machine.optimistic(seq, &requests);
            out.push(Output::Deliver(Delivery::Opt {
                seq,
                requests: requests.clone(),
            }));
            let d = &mut self.delivery;
            let lapsed = batch.filter(|_| lapsed);
            let batch = if duplicate || lapsed.is_some() {
                None
            } else {
                batch
            };
            d.pending_batches.extend(batch);
            d.pending.insert(
                seq,
                Pending {
                    batch,
                    lapse,
                    lapsed,
                    requests,
                    decided: admission.decided,
                    time,
                    change,
                },
            );
            d.opt_time = time;
            d.opt_next += 1;
            d.opt_left -= 1;
            d.missing = None;
            self.stats.opt_delivered += 1;
        }
    }

    fn deliver_finally(&mut self, out: &mut Vec<Action>) {
        let d = &self.delivery;
        let committed = match self.cfg.planted_bug {
            Some(PlantedBug::FinalBeforeCommit) => self.raft.store().last(),
            Some(PlantedBug::ApplyBeforeDurable) => d.commit,
            None
            | Some(
                PlantedBug::ExpireByOwnClock
                | PlantedBug::UncheckedStream
                | PlantedBug::FoundingQuorum
                | PlantedBug::SnapshotWhereEncoded
                | PlantedBug::NoSnapshotForLearners
                | PlantedBug::LapseIgnored
                | PlantedBug::SessionEndsEarly,
            ) => d.commit.min(self.disk.durable_index()),
        };
        while self.delivery.final_next <= committed
            && self.delivery.final_next < self.delivery.opt_next
        {
            if self.delivery.final_left == 0 {
                self.delivery.cut_short = true;
                break;
            }
            let seq = self.delivery.final_next;
            let Some(p) = self.delivery.pending.remove(&seq) else {
                break;
            };
            self.delivery.final_left -= 1;
            if let Some(id) = p.lapsed {
                self.stats.batches_lapsed += 1;
                self.lapsed_here(id, p.lapse, out);
            }
            if let Some(id) = p.batch {
                self.delivery.pending_batches.remove(&id);
            }
            // Sessions that ended before this entry are forgotten before it decides anything
            // (they count as absent from its time on, as they did when it was admitted).
            self.stats.sessions_forgotten += self.clients.sweep(p.time);
            let payloads: usize = p.requests.iter().map(|r| r.payload.len()).sum();
            self.delivery.since_snapshot_bytes += ENTRY_BYTES + payloads as u64;
            let mut running = p.requests.iter().enumerate();
            for d in &p.decided {
                // The requests that run are the decided ones that run, in the same order.
                let runs = if d.runs { running.next() } else { None };
                let outcome = match runs {
                    Some((index, r)) => {
                        self.stats.requests_delivered += 1;
                        Last::Answered(self.machine.apply_final(seq, index as u32, r))
                    }
                    None => Last::Expired,
                };
                self.finish_request(*d, p.time, outcome, out);
            }
            self.delivery.ahead.finished(&p.decided);
            if let Some(id) = p.batch {
                // Requests of the batch that were not delivered (older than one of their
                // client's already ordered) are done too: they never run.
                self.batches.finished(id, p.lapse);
            }
            for text in self.machine.take_alarms() {
                out.push(Output::Deliver(Delivery::Alarm { seq, text }));
            }
            if let Some(change) = p.change {
                self.apply_change(seq, change, out);
            }
            out.push(Output::Deliver(Delivery::Final {
                seq,
                time_ms: p.time,
            }));
            self.delivery.final_time = p.time;
            self.delivery.final_next += 1;
            self.stats.final_delivered += 1;
        }
    }

    /// Batch `id` lapsed at a final position: it ordered nothing. Its requests are no longer
    /// in flight here, and a client waiting here for one of them learns its fate now (it did
    /// not run there, nor can it later: its deadline is past every later position's time),
    /// rather than when it sends again. Nothing replicated changes.
    fn lapsed_here(&mut self, id: BatchId, lapse: u64, out: &mut Vec<Action>) {
        if let Some(requests) = self.batches.held.get(&id) {
            for r in requests {
                if let Some((to, msg)) = self.clients.lapsed(r) {
                    out.push(Output::Send { to, msg });
                }
            }
        }
        self.batches.finished(id, lapse);
    }

    /// The log finally decided `d` at log time `time` with `outcome`: the clients' table
    /// records it, and a client waiting for it here hears of it.
    fn finish_request(&mut self, d: Decided, time: u64, outcome: Last, out: &mut Vec<Action>) {
        self.batches.decided(d.client, d.seq);
        if let Some((to, msg)) = self.clients.record(d, time, outcome) {
            out.push(Output::Send { to, msg });
        }
    }

    /// Revokes the optimistic deliveries from position `from` on (those not final).
    pub(super) fn revoke(&mut self, from: u64, out: &mut Vec<Action>) {
        let d = &mut self.delivery;
        if from >= d.opt_next {
            return;
        }
        let from = from.max(d.final_next);
        let revoked = d.pending.split_off(&from);
        self.stats.revoked += revoked.len() as u64;
        for id in revoked.values().filter_map(|p| p.batch) {
            d.pending_batches.remove(&id);
        }
        let still = d.pending.values().map(|p| (p.decided.as_slice(), p.time));
        d.ahead = Ahead::rebuild(&self.clients, still);
        d.opt_time = d
            .pending
            .values()
            .next_back()
            .map_or(d.final_time, |p| p.time);
        d.opt_next = from;
        self.machine.revoked(from);
        out.push(Output::Deliver(Delivery::Revoke { from }));
    }
}
