//! The clients' table: deduplication, answers, and sessions that end by the log's time.

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

fn ran(client: u64, seq: u64, deadline: u64) -> Decided {
    Decided {
        client,
        seq,
        deadline,
        runs: true,
    }
}

/// Records `d` as final at `time`, as a replica's final delivery does.
fn finish(
    table: &mut ClientTable,
    d: Decided,
    time: u64,
    outcome: Last,
) -> Option<(Addr, OrderMsg)> {
    table.sweep(time);
    table.record(d, time, outcome)
}

#[test]
fn a_batch_admits_each_clients_newest_numbers_in_order_and_expires_the_late() {
    let mut table = ClientTable::default();
    finish(
        &mut table,
        ran(1, 5, NO_DEADLINE),
        0,
        Last::Answered(vec![]),
    );
    let mut ahead = Ahead::default();
    let earlier = table.admit(&[req(2, 3, NO_DEADLINE)], 50, &mut ahead);
    assert_eq!(earlier.admitted.len(), 1);
    let batch = [
        req(1, 5, NO_DEADLINE), // decided finally: a duplicate
        req(1, 6, NO_DEADLINE), // next: admitted
        req(2, 3, NO_DEADLINE), // delivered optimistically before: a duplicate
        req(2, 2, NO_DEADLINE), // older than one ordered: dropped
        req(3, 1, 99),          // past its deadline at time 100: expires
        req(1, 6, NO_DEADLINE), // the same request twice in one batch: once
        req(2, 4, 100),         // due exactly at the log's time: admitted
    ];
    let admission = table.admit(&batch, 100, &mut ahead);
    assert_eq!(admission.admitted, vec![batch[1].clone(), batch[6].clone()]);
    let decided: Vec<(u64, u64, bool)> = admission
        .decided
        .iter()
        .map(|d| (d.client, d.seq, d.runs))
        .collect();
    assert_eq!(decided, vec![(1, 6, true), (3, 1, false), (2, 4, true)]);
    let counts: BTreeMap<u64, usize> = ahead.touched.iter().map(|(c, t)| (*c, t.decided)).collect();
    assert_eq!(counts, BTreeMap::from([(1, 1), (2, 2), (3, 1)]));
}

#[test]
fn a_decided_request_is_answered_with_its_outcome_and_an_older_one_dropped() {
    let mut table = ClientTable::default();
    finish(
        &mut table,
        ran(7, 2, NO_DEADLINE),
        0,
        Last::Answered(b"ok".to_vec()),
    );
    let expired = Decided {
        runs: false,
        ..ran(8, 1, NO_DEADLINE)
    };
    finish(&mut table, expired, 0, Last::Expired);
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
    // Nobody waits for it: its delivery elsewhere tells nobody here, and it starts no
    // session (it could refuse nothing).
    let expired = Decided {
        runs: false,
        ..ran(1, 1, 10)
    };
    assert_eq!(finish(&mut table, expired, 11, Last::Expired), None);
    assert!(table.sessions().is_empty());
}

#[test]
fn the_waiting_sender_hears_of_its_request_once_and_only_the_highest_outcome_is_kept() {
    let mut table = ClientTable::default();
    assert_eq!(
        table.receive(50, &req(1, 3, NO_DEADLINE), 0),
        Reception::Order
    );
    // An earlier request of the client is decided: the sender of 3 is not told of it.
    assert_eq!(
        finish(
            &mut table,
            ran(1, 2, NO_DEADLINE),
            0,
            Last::Answered(vec![2])
        ),
        None
    );
    assert_eq!(
        finish(
            &mut table,
            ran(1, 3, NO_DEADLINE),
            0,
            Last::Answered(vec![3])
        ),
        Some((
            50,
            OrderMsg::Reply {
                client: 1,
                seq: 3,
                response: vec![3]
            }
        ))
    );
    assert_eq!(
        finish(
            &mut table,
            ran(1, 3, NO_DEADLINE),
            0,
            Last::Answered(vec![3])
        ),
        None
    );
    // A lower number decided late (an older copy) does not replace the latest.
    finish(&mut table, ran(1, 1, NO_DEADLINE), 0, Last::Expired);
    let s = &table.sessions()[&1];
    assert_eq!((s.seq, &s.outcome), (3, &Last::Answered(vec![3])));
}

#[test]
fn a_session_lives_until_its_latest_deadline_and_is_then_forgotten() {
    let mut table = ClientTable::default();
    finish(&mut table, ran(1, 1, 300), 100, Last::Answered(vec![1]));
    finish(&mut table, ran(1, 2, 200), 150, Last::Answered(vec![2]));
    assert_eq!(table.sessions()[&1].until, 300);
    // At 300 it still lives: a re-sent copy is answered.
    assert_eq!(table.sweep(300), 0);
    assert_eq!(
        table.receive(50, &req(1, 2, 200), 300),
        Reception::Answer(OrderMsg::Reply {
            client: 1,
            seq: 2,
            response: vec![2]
        })
    );
    // Past it the session counts as absent; it is swept once its whole step of ends is
    // past. Then a re-sent copy cannot run (its deadline is past) and whether it ran is no
    // longer known.
    assert_eq!(table.sweep(301), 0);
    assert_eq!(table.sweep(ENDING_STEP_MS), 1);
    assert!(table.sessions().is_empty());
    assert_eq!(
        table.receive(50, &req(1, 2, 200), ENDING_STEP_MS),
        Reception::Answer(OrderMsg::Unknown { client: 1, seq: 2 })
    );
    // A request with a later deadline never ran in the forgotten session: it is ordered.
    let later = req(1, 3, 2 * ENDING_STEP_MS);
    assert_eq!(table.receive(50, &later, ENDING_STEP_MS), Reception::Order);
}

#[test]
fn a_request_of_a_client_whose_session_ended_is_admitted_only_before_its_deadline() {
    let mut table = ClientTable::default();
    finish(&mut table, ran(1, 5, 100), 50, Last::Answered(vec![]));
    let mut ahead = Ahead::default();
    // At 101 the session counts as absent, swept or not: an old copy expires there (it
    // cannot run twice), a new request runs.
    let admission = table.admit(&[req(1, 5, 100), req(1, 6, 500)], 101, &mut ahead);
    let decided: Vec<(u64, bool)> = admission.decided.iter().map(|d| (d.seq, d.runs)).collect();
    assert_eq!(decided, vec![(5, false), (6, true)]);
    // The same verdict from a table that swept first.
    let mut swept = ClientTable::default();
    finish(&mut swept, ran(1, 5, 100), 50, Last::Answered(vec![]));
    swept.sweep(101);
    let again = swept.admit(
        &[req(1, 5, 100), req(1, 6, 500)],
        101,
        &mut Ahead::default(),
    );
    assert_eq!(again, admission);
}

#[test]
fn what_is_ahead_leaves_the_final_table_alike_whenever_entries_become_final() {
    // Entries at times 10, 200, 400, decided optimistically ahead of the final table...
    let entries: Vec<(Vec<Request>, u64)> = vec![
        (vec![req(1, 1, 100), req(2, 1, 1000)], 10),
        (vec![req(1, 2, 300), req(1, 1, 100)], 200),
        (vec![req(1, 3, 150), req(2, 1, 1000), req(3, 1, 500)], 400),
    ];
    let mut table = ClientTable::default();
    let mut ahead = Ahead::default();
    let mut admissions = Vec::new();
    for (batch, time) in &entries {
        admissions.push(table.admit(batch, *time, &mut ahead));
    }
    // ...then final one by one: the final table then decides the next batch as `ahead`
    // did.
    let next = [
        req(1, 2, 300),
        req(1, 4, 900),
        req(2, 1, 1000),
        req(2, 2, 1000),
    ];
    let expected = table.admit(&next, 450, &mut ahead.clone());
    for (admission, (_, time)) in admissions.iter().zip(&entries) {
        table.sweep(*time);
        for d in &admission.decided {
            table.record(*d, *time, Last::Answered(vec![]));
        }
        ahead.finished(&admission.decided);
    }
    assert!(ahead.touched.is_empty());
    assert_eq!(table.admit(&next, 450, &mut Ahead::default()), expected);
    // Client 1's session ended at 300 < 400: its request 3 expired there, and starts none.
    assert_eq!(table.sessions().get(&1), None);
}

#[test]
fn forgetting_is_remembered_per_bucket_and_bounded() {
    let mut table = ClientTable::default();
    for c in 0..20_000u64 {
        finish(&mut table, ran(c, 1, c), c, Last::Answered(vec![]));
    }
    table.sweep(u64::MAX);
    assert!(table.sessions().is_empty());
    assert!(table.forgotten().len() <= BUCKETS as usize);
    // A client never seen, in a bucket whose forgotten sessions ended before its
    // request's deadline: that request is known never to have run.
    let fresh = (1u64 << 40..)
        .find(|c| {
            table
                .forgotten()
                .get(&bucket(*c))
                .is_some_and(|f| f.until < 19_999)
        })
        .expect("a bucket ends early");
    assert_eq!(
        table.receive(50, &req(fresh, 1, 19_999), 30_000),
        Reception::Answer(OrderMsg::Expired {
            client: fresh,
            seq: 1
        })
    );
}

#[test]
fn one_request_decided_at_two_pending_entries_stays_ahead_until_both_are_final() {
    // j: (c,5) runs in a session until 100; m: after it ended, (c,3) starts a new one; k: a
    // late copy of (c,5) expires there and raises the session to number 5. j and m become
    // final while k is pending: the next entry must still see number 5.
    let entries: Vec<(Vec<Request>, u64)> = vec![
        (vec![req(1, 5, 100)], 50),
        (vec![req(1, 3, 300)], 150),
        (vec![req(1, 5, 100)], 160),
    ];
    let mut table = ClientTable::default();
    let mut ahead = Ahead::default();
    let admissions: Vec<Admission> = entries
        .iter()
        .map(|(batch, time)| table.admit(batch, *time, &mut ahead))
        .collect();
    assert_eq!(admissions[2].decided.len(), 1, "the late copy expires at k");
    for (admission, (_, time)) in admissions.iter().zip(&entries).take(2) {
        table.sweep(*time);
        for d in &admission.decided {
            table.record(*d, *time, Last::Answered(vec![]));
        }
        ahead.finished(&admission.decided);
    }
    let next = [req(1, 4, 400)];
    let while_pending = table.admit(&next, 170, &mut ahead.clone());
    table.sweep(160);
    for d in &admissions[2].decided {
        table.record(*d, 160, Last::Expired);
    }
    ahead.finished(&admissions[2].decided);
    let once_final = table.admit(&next, 170, &mut ahead);
    assert_eq!(while_pending, once_final);
    assert!(once_final.decided.is_empty(), "4 is below the session's 5");
}

#[test]
fn a_request_after_its_clients_own_ended_session_is_known_never_to_have_run() {
    // A client's request 1 runs (its session lives until 100); request 2, with the same
    // deadline, is ordered only after that session ended, and expires: it did not run in the
    // session, which ended at number 1, so its sender hears Expired, not Unknown.
    let mut table = ClientTable::default();
    assert_eq!(table.receive(50, &req(1, 2, 100), 60), Reception::Order);
    finish(&mut table, ran(1, 1, 100), 60, Last::Answered(vec![]));
    let expired = Decided {
        runs: false,
        ..ran(1, 2, 100)
    };
    assert_eq!(
        finish(&mut table, expired, 150, Last::Expired),
        Some((50, OrderMsg::Expired { client: 1, seq: 2 }))
    );
    // A copy of request 1 sent now may have run: its outcome is unknown.
    assert_eq!(
        table.receive(50, &req(1, 1, 100), 150),
        Reception::Answer(OrderMsg::Unknown { client: 1, seq: 1 })
    );
}

#[test]
fn a_copy_expiring_after_its_ended_session_ran_it_is_unknown_even_before_the_sweep() {
    let mut table = ClientTable::default();
    finish(&mut table, ran(1, 14, 300), 100, Last::Answered(vec![14]));
    // At 400 the session has ended, and is not swept yet (its step of ends is not past).
    assert_eq!(table.sweep(400), 0);
    assert_eq!(table.sessions().len(), 1);
    // A copy of request 14 is decided there: it expires, and its sender waits here.
    table.awaiting.insert(1, (14, 7));
    let copy = Decided {
        client: 1,
        seq: 14,
        deadline: 300,
        runs: false,
    };
    // The ended session ran it: its sender is told the outcome is unknown, never that it
    // expired.
    assert_eq!(
        table.record(copy, 400, Last::Expired),
        Some((7, OrderMsg::Unknown { client: 1, seq: 14 }))
    );
    assert!(table.sessions().is_empty());
}
