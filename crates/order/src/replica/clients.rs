//! Client deduplication: what became of each client's latest request, who waits for an answer
//! here, and which of a batch's requests an entry delivers. Pure bookkeeping, with no Raft and
//! no disk: every verdict is a function of the log prefix (and of the log's time), so that
//! every replica and every replay of a log decide a re-sent request alike.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::{Addr, OrderMsg, Request};

/// What became of a client's latest finally delivered request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Last {
    /// It ran; the state machine's answer.
    Answered(Vec<u8>),
    /// It expired (it never ran).
    Expired,
}

impl Last {
    /// What a client that sent request `seq` (the one this is the outcome of) is told.
    pub(super) fn message(&self, client: u64, seq: u64) -> OrderMsg {
        match self {
            Last::Answered(response) => OrderMsg::Reply {
                client,
                seq,
                response: response.clone(),
            },
            Last::Expired => OrderMsg::Expired { client, seq },
        }
    }
}

/// What a replica does with a client's request that reaches it.
#[derive(Debug, PartialEq)]
pub(super) enum Reception {
    /// Answer the sender with this (the request was decided already) and take nothing.
    Answer(OrderMsg),
    /// Drop it: a later request of its client was decided (the client moved on).
    Drop,
    /// Order it: its sender waits here for the answer.
    Order,
}

/// What becomes of a batch's requests at its entry.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Admission {
    /// The requests delivered there, in the batch's order.
    pub(super) admitted: Vec<Request>,
    /// The requests that expired there: (client, seq).
    pub(super) expired: Vec<(u64, u64)>,
}

/// The clients' table of one replica.
#[derive(Default)]
pub(super) struct ClientTable {
    /// Per client: the last finally delivered request number and what became of it (part of
    /// the replicated state: snapshots carry it).
    last: BTreeMap<u64, (u64, Last)>,
    /// Per client: the request waiting for an answer here, and where to send it (local).
    awaiting: BTreeMap<u64, (u64, Addr)>,
}

impl ClientTable {
    /// A table holding `last` (a snapshot's), with nobody waiting.
    pub(super) fn from_last(last: BTreeMap<u64, (u64, Last)>) -> ClientTable {
        ClientTable {
            last,
            awaiting: BTreeMap::new(),
        }
    }

    /// Each client's last finally delivered request and its outcome.
    pub(super) fn last(&self) -> &BTreeMap<u64, (u64, Last)> {
        &self.last
    }

    /// Replaces the delivered part with a snapshot's; who waits here stays.
    pub(super) fn restore(&mut self, last: BTreeMap<u64, (u64, Last)>) {
        self.last = last;
    }

    /// Whether request `seq` of `client` is decided: it or a later one of its client was
    /// finally delivered.
    pub(super) fn decided(&self, client: u64, seq: u64) -> bool {
        self.last.get(&client).is_some_and(|(last, _)| seq <= *last)
    }

    /// Decides what to do with `req` from `from`, when the log's final time is `final_time`.
    /// A request its client already had decided is answered (if it is the latest) or dropped;
    /// one whose deadline is before `final_time` expired wherever it would be ordered now, and
    /// is answered so; any other is ordered, and its sender is remembered to be answered.
    pub(super) fn receive(&mut self, from: Addr, req: &Request, final_time: u64) -> Reception {
        if let Some((last, outcome)) = self.last.get(&req.client) {
            if *last > req.seq {
                return Reception::Drop;
            }
            if *last == req.seq {
                return Reception::Answer(outcome.message(req.client, req.seq));
            }
        }
        if req.deadline_ms < final_time {
            // No copy ran at a final position (its client's table says so), and every later
            // position's time is past the deadline: it never runs.
            return Reception::Answer(OrderMsg::Expired {
                client: req.client,
                seq: req.seq,
            });
        }
        self.awaiting.insert(req.client, (req.seq, from));
        Reception::Order
    }

    /// Request `seq` of `client` was in a batch that lapsed: if its sender waits here for it,
    /// whom to tell what (its outcome if it was decided before, else that it expired). The
    /// table itself does not change.
    pub(super) fn lapsed(&mut self, client: u64, seq: u64) -> Option<(Addr, OrderMsg)> {
        let &(wanted, to) = self.awaiting.get(&client)?;
        if wanted != seq {
            return None;
        }
        let msg = match self.last.get(&client) {
            Some((last, outcome)) if *last == seq => outcome.message(client, seq),
            // The client moved on: a later request of its was decided.
            Some((last, _)) if *last > seq => return None,
            _ => OrderMsg::Expired { client, seq },
        };
        self.awaiting.remove(&client);
        Some((to, msg))
    }

    /// Request `seq` of `client` was finally delivered with `outcome`: the table keeps it if it
    /// is the client's highest. Returns whom to tell, if a sender waits here for it.
    pub(super) fn record(
        &mut self,
        client: u64,
        seq: u64,
        outcome: Last,
    ) -> Option<(Addr, OrderMsg)> {
        let mut tell = None;
        if let Some(&(wanted, to)) = self.awaiting.get(&client) {
            if wanted == seq {
                self.awaiting.remove(&client);
                tell = Some((to, outcome.message(client, seq)));
            }
        }
        if self.last.get(&client).is_none_or(|(last, _)| *last < seq) {
            self.last.insert(client, (seq, outcome));
        }
        tell
    }

    /// Decides a batch's requests at its entry, where the log's time is `time`, in the batch's
    /// order. A request whose number is not above every number its client had delivered
    /// before it in the log (finally, in this table; optimistically and not revoked, in
    /// `pending`; or earlier in this batch) is a duplicate, or older than a request already
    /// ordered, and is dropped. Of the others, one whose deadline is before `time` expires;
    /// the rest are admitted. Both expired and admitted requests count as delivered (they are
    /// added to `pending`). Both tables hold exactly what the entries before this one
    /// delivered and `time` is the log's, so the verdict is a function of the log prefix
    /// alone: the same on every replica and every replay of a log, however a client's numbers
    /// arrive.
    pub(super) fn admit(
        &self,
        batch: &[Request],
        time: u64,
        pending: &mut BTreeSet<(u64, u64)>,
    ) -> Admission {
        let mut admission = Admission::default();
        for r in batch {
            let last_final = self.last.get(&r.client).map_or(0, |(seq, _)| *seq);
            let last_pending = pending
                .range((r.client, 0)..=(r.client, u64::MAX))
                .next_back()
                .map_or(0, |(_, seq)| *seq);
            if r.seq > last_final.max(last_pending) {
                pending.insert((r.client, r.seq));
                if r.deadline_ms < time {
                    admission.expired.push((r.client, r.seq));
                } else {
                    admission.admitted.push(r.clone());
                }
            }
        }
        admission
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::NO_DEADLINE;

    fn req(client: u64, seq: u64, deadline_ms: u64) -> Request {
        Request {
            client,
            seq,
            payload: vec![seq as u8],
            deadline_ms,
        }
    }

    #[test]
    fn a_batch_admits_each_clients_newest_numbers_in_order_and_expires_the_late() {
        let mut table = ClientTable::default();
        table.record(1, 5, Last::Answered(vec![]));
        let mut pending = BTreeSet::from([(2, 3)]);
        let batch = [
            req(1, 5, NO_DEADLINE), // decided finally: a duplicate
            req(1, 6, NO_DEADLINE), // next: admitted
            req(2, 3, NO_DEADLINE), // delivered optimistically before: a duplicate
            req(2, 2, NO_DEADLINE), // older than one ordered: dropped
            req(3, 1, 99),          // past its deadline at time 100: expires
            req(1, 6, NO_DEADLINE), // the same request twice in one batch: once
            req(2, 4, 100),         // due exactly at the log's time: admitted
        ];
        let admission = table.admit(&batch, 100, &mut pending);
        assert_eq!(admission.admitted, vec![batch[1].clone(), batch[6].clone()]);
        assert_eq!(admission.expired, vec![(3, 1)]);
        assert_eq!(pending, BTreeSet::from([(1, 6), (2, 3), (2, 4), (3, 1)]));
    }

    #[test]
    fn a_decided_request_is_answered_with_its_outcome_and_an_older_one_dropped() {
        let mut table = ClientTable::default();
        table.record(7, 2, Last::Answered(b"ok".to_vec()));
        table.record(8, 1, Last::Expired);
        assert_eq!(
            table.receive(50, &req(7, 2, NO_DEADLINE), 0),
            Reception::Answer(OrderMsg::Reply {
                client: 7,
                seq: 2,
                response: b"ok".to_vec()
            })
        );
        assert_eq!(
            table.receive(50, &req(8, 1, NO_DEADLINE), 0),
            Reception::Answer(OrderMsg::Expired { client: 8, seq: 1 })
        );
        assert_eq!(
            table.receive(50, &req(7, 1, NO_DEADLINE), 0),
            Reception::Drop
        );
        assert!(table.decided(7, 1) && table.decided(7, 2) && !table.decided(7, 3));
    }

    #[test]
    fn a_request_past_its_deadline_at_the_final_time_is_answered_expired_and_not_ordered() {
        let mut table = ClientTable::default();
        assert_eq!(
            table.receive(50, &req(1, 1, 10), 11),
            Reception::Answer(OrderMsg::Expired { client: 1, seq: 1 })
        );
        // Nobody waits for it: its delivery elsewhere tells nobody here.
        assert_eq!(table.record(1, 1, Last::Expired), None);
    }

    #[test]
    fn the_waiting_sender_hears_of_its_request_once_and_only_the_highest_outcome_is_kept() {
        let mut table = ClientTable::default();
        assert_eq!(
            table.receive(50, &req(1, 3, NO_DEADLINE), 0),
            Reception::Order
        );
        // An earlier request of the client is decided: the sender of 3 is not told of it.
        assert_eq!(table.record(1, 2, Last::Answered(vec![2])), None);
        assert_eq!(
            table.record(1, 3, Last::Answered(vec![3])),
            Some((
                50,
                OrderMsg::Reply {
                    client: 1,
                    seq: 3,
                    response: vec![3]
                }
            ))
        );
        assert_eq!(table.record(1, 3, Last::Answered(vec![3])), None);
        // A lower number decided late (an older copy) does not replace the latest.
        table.record(1, 1, Last::Expired);
        assert_eq!(table.last().get(&1), Some(&(3, Last::Answered(vec![3]))));
    }
}
