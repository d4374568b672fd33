//! OS-Paxos in the simulator: 3 replicas and 4 clients under loss, duplication, reordering,
//! partitions, crashes and restarts, on disks that lose unsynced writes, tear the last one and
//! fail fsyncs (a replica keeps only what reached its disk, and is rebuilt from it), and in one
//! test a log damaged in the middle.
//!
//! Checked on every run: each replica finally delivers in order, without gaps, only what it
//! optimistically delivered and did not revoke; every replica (and every incarnation of it)
//! finally delivers the same requests at the same position; no request is delivered twice;
//! every client gets every answer once the faults stop, and each answer is what the final order
//! implies; all replicas end in the same state, and each replica rebuilt from its disk alone
//! holds what the final order implies where it stops; no replica fails, and exactly the
//! replicas whose log was damaged refuse to start. Some runs add adversarial clients, which
//! send old numbers after new ones, skip numbers, and send one request to several replicas at
//! once.
//!
//! Replay one seed: `ATOMOS_SIM_SEED=N cargo test -p atomos-order --test sim`.

#[path = "sim/check.rs"]
mod check;
#[path = "sim/harness.rs"]
mod harness;
#[path = "sim/operator.rs"]
mod operator;

use atomos_order::{Delivery, MemberChange, PlantedBug};
use atomos_sim::{check_seeds, first_caught, Faults};

use check::{check, count};
use harness::{is_adversary, simulate, Note, Setup};
use operator::scripted_end;

#[test]
fn total_order_with_optimistic_delivery_survives_every_fault() {
    let (mut revoked, mut torn, mut failed_fsyncs, mut matched) = (0, 0, 0, 0);
    check_seeds(40, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::new(10_000));
        matched += o.finals.iter().map(|(_, r)| r.speculation().0).sum::<u64>();
        revoked += count(&o, |n| {
            matches!(n, Note::Delivered(Delivery::Revoke { .. }))
        });
        torn += o.run.torn;
        failed_fsyncs += o.run.failed_fsyncs;
        check(&o)
    });
    println!(
        "over the seeds: {revoked} revocations, {torn} torn writes, {failed_fsyncs} failed fsyncs"
    );
    assert!(
        revoked > 0,
        "no optimistic delivery was ever revoked: the faults are too mild"
    );
    assert!(torn > 0, "no crash tore a write");
    assert!(
        matched > 0,
        "no final delivery was checked against its optimistic one"
    );
    assert!(failed_fsyncs > 0, "no fsync failed");
}

#[test]
fn replicas_far_behind_catch_up_by_snapshot() {
    let mut installs = 0;
    check_seeds(40, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::new(5));
        installs += count(&o, |n| {
            matches!(n, Note::Delivered(Delivery::Installed { .. }))
        });
        check(&o)
    });
    assert!(installs > 0, "no replica ever needed a snapshot");
    println!("snapshot installs over the seeds: {installs}");
}

/// Seeds that once failed `replicas_far_behind_catch_up_by_snapshot`: a batch the leader
/// ordered was delivered and compacted away at its origin before the origin heard enough
/// acknowledgements, and the origin's re-send carried no requests, which a lagging replica
/// then delivered as an empty batch (916 before the leader proposed its followers' batches,
/// 143 after).
#[test]
fn a_compacted_batch_is_never_resent_empty() {
    for seed in [143, 916] {
        if let Err(e) = check(&simulate(seed, Setup::new(5))) {
            panic!("seed {seed}: {e}");
        }
    }
}

/// One replica's log is damaged in the middle at a crash: it refuses to start (the check
/// requires exactly the damaged ones to refuse) and the other two go on serving every client.
#[test]
fn a_replica_with_a_damaged_log_refuses_to_start_and_the_others_go_on() {
    fn faults() -> Faults {
        Faults {
            corrupt: 0.5,
            max_corrupt_nodes: 1,
            ..Faults::harsh()
        }
    }
    let mut damaged = 0;
    check_seeds(20, "-p atomos-order --test sim", |seed| {
        let o = simulate(
            seed,
            Setup {
                faults,
                ..Setup::new(10_000)
            },
        );
        damaged += o.run.corrupted.len();
        check(&o)
    });
    assert!(damaged > 0, "no log was ever damaged");
    println!("damaged logs over the seeds: {damaged}");
}

/// What a replica applies is what a local reader sees: on disks that stall, with crashes
/// that lose unsynced writes, no replica may apply an entry that a crash then takes back
/// (it would hold another entry at that position than the others).
#[test]
fn nothing_is_applied_before_a_majority_holds_it_on_disk() {
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        check(&simulate(
            seed,
            Setup {
                faults: Faults::stalling,
                ..Setup::new(10_000)
            },
        ))
    });
}

/// Requests with deadlines, replicas whose clocks disagree by up to 150 ms, clients (and
/// adversarial ones) whose requests live up to 400 ms: under every fault, replicas agree at
/// every position on the log's time and on which requests expired there, nothing runs where
/// the log's time is past its deadline, nothing reported expired ever runs, and every request
/// gets an outcome.
#[test]
fn deadlines_are_decided_by_the_log_alone() {
    let (mut expired, mut answered) = (0, 0);
    let (mut lapsed, mut forgotten) = (0, 0);
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::deadlines(10_000));
        expired += count(&o, |n| matches!(n, Note::Expired { .. }));
        answered += count(&o, |n| matches!(n, Note::Done { .. }));
        lapsed += o.lapsed;
        forgotten += o.forgotten;
        check(&o)
    });
    println!(
        "over the seeds: {answered} requests answered, {expired} expired; {lapsed} entries \
         ordered a lapsed batch, {forgotten} batches forgotten"
    );
    assert!(expired > 0, "no request ever expired");
    assert!(answered > expired, "most requests should run in time");
}

/// The same with a snapshot every 20 entries: replicas forget the batches that lapsed once
/// a compaction dropped their entries, and a batch ordered again after it lapsed orders
/// nothing, so forgetting changes no verdict (every check above holds).
#[test]
fn lapsed_batches_are_forgotten_and_decide_nothing_again() {
    let (mut lapsed, mut forgotten) = (0, 0);
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::deadlines(20));
        lapsed += o.lapsed;
        forgotten += o.forgotten;
        check(&o)
    });
    println!("over the seeds: {lapsed} entries ordered a lapsed batch, {forgotten} forgotten");
    assert!(lapsed > 0, "no entry ever ordered a lapsed batch");
    assert!(forgotten > 0, "no batch was ever forgotten");
}

/// Client sessions end by the log's time: adversarial clients fall silent for longer than
/// their requests live, their sessions end on every replica (at the same positions), and the
/// old numbers they send again (copies of requests that ran, or that never did) never run
/// twice; every check above holds, with a snapshot every 20 entries.
#[test]
fn sessions_end_by_the_log_and_an_old_request_never_runs_twice() {
    let (mut ended, mut unknown, mut held) = (0, 0, 0);
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::sessions(20));
        ended += o.sessions_forgotten;
        held = held.max(o.sessions_held);
        unknown += count(&o, |n| matches!(n, Note::Unknown { .. }));
        check(&o)
    });
    println!(
        "over the seeds: {ended} sessions ended, {unknown} requests answered as unknown, at \
         most {held} sessions held at the end"
    );
    assert!(ended > 0, "no session ever ended");
    assert!(
        unknown > 0,
        "no old request came back after its session ended"
    );
}

/// Planted bugs the simulation must catch: entries delivered finally before Raft commits them
/// (a leader change then replaces what was applied), committed entries applied before this
/// replica's own write of them is durable (on slow disks, a crash then takes back what a
/// leader applied), expiry decided by each replica's own clock (replicas whose clocks
/// differ run different requests), snapshot streams taken in arrival order without their
/// checksum (a replica then adopts a state that is not the sender's), and batch quorums
/// counted among the founding replicas after members were replaced (batches are ordered that
/// too few current voters hold, or none at all), a snapshot encoded off the replica's step
/// taken at the position reached when it came back (the entries between are lost), and a
/// leader that never takes the snapshot a learner added since its latest one needs (the
/// learner never catches up, and the operator's script never ends), and an entry's batch taken
/// for new by its id alone once it was forgotten, its lapse ignored (replicas wait forever for
/// contents nobody keeps), and sessions that end before their latest deadline (a copy of a
/// request that ran runs again).
#[test]
fn planted_bugs_are_caught() {
    let bugs: [(PlantedBug, Setup); 9] = [
        (PlantedBug::FinalBeforeCommit, Setup::new(10_000)),
        (PlantedBug::UncheckedStream, Setup::new(5)),
        (
            PlantedBug::ApplyBeforeDurable,
            Setup {
                faults: Faults::stalling,
                ..Setup::new(10_000)
            },
        ),
        (PlantedBug::ExpireByOwnClock, Setup::deadlines(10_000)),
        (PlantedBug::FoundingQuorum, Setup::membership(10_000)),
        (PlantedBug::SnapshotWhereEncoded, Setup::new(5)),
        (PlantedBug::NoSnapshotForLearners, Setup::membership(10_000)),
        (PlantedBug::LapseIgnored, Setup::deadlines(20)),
        (PlantedBug::SessionEndsEarly, Setup::sessions(20)),
    ];
    for (bug, setup) in bugs {
        let setup = Setup {
            bug: Some(bug),
            ..setup
        };
        first_caught(&format!("{bug:?}"), 300, |seed| {
            let o = simulate(seed, setup);
            check(&o)?;
            if setup.membership {
                check_membership(&o)?;
            }
            Ok(())
        });
    }
}

#[test]
fn one_seed_gives_one_trace() {
    let a = simulate(7, Setup::new(5));
    let b = simulate(7, Setup::new(5));
    assert_eq!(a.run.trace, b.run.trace);
    let c = simulate(8, Setup::new(5));
    assert_ne!(a.run.trace, c.run.trace);
}

/// Clients that number their requests out of order, skip numbers and send one request to
/// several replicas at once: whether a request is a duplicate must follow from the log alone,
/// so every replica (and every replay of a log) applies the same requests and answers the same.
#[test]
fn duplicates_are_decided_by_the_log_alone_whatever_clients_send() {
    let mut answered = 0;
    let setup = Setup {
        adversaries: 2,
        ..Setup::new(10_000)
    };
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, setup);
        answered += count(
            &o,
            |n| matches!(n, Note::Done { client, .. } if is_adversary(*client, setup)),
        );
        check(&o)
    });
    assert!(answered > 0, "no adversarial request was ever answered");
    println!("adversarial requests answered over the seeds: {answered}");
}

/// Membership changes under every fault: replica 4 joins as a learner and is promoted, replica
/// 5 joins and replaces replica 1 through a joint configuration (the leader, often), replica 2
/// is removed; removed replicas are decommissioned. Besides every check above, replicas agree
/// on the membership at every position, and the run ends with the script's configuration.
#[test]
fn members_join_are_promoted_replaced_and_removed_under_every_fault() {
    let (mut joint, mut leader_removed) = (0, 0);
    check_seeds(60, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::membership(10_000));
        joint += count(
            &o,
            |n| matches!(n, Note::Delivered(Delivery::Membership { membership, .. }) if membership.is_joint()),
        );
        // The replica that goes proposed its own removal as leader.
        leader_removed += o
            .run
            .notes
            .iter()
            .filter(|(_, node, n)| match n {
                Note::Proposed(MemberChange::Replace { remove, .. })
                | Note::Proposed(MemberChange::Remove { id: remove }) => remove == node,
                _ => false,
            })
            .count();
        check(&o)?;
        check_membership(&o)
    });
    println!(
        "over the seeds: {joint} joint configurations applied, {leader_removed} leaders removed"
    );
    assert!(joint > 0, "no joint configuration was ever applied");
    assert!(leader_removed > 0, "no leader was ever removed");
}

/// The same with a snapshot every 100 entries: joining replicas, and replicas that fall behind
/// while members change, catch up from snapshots that carry the configuration. (Seed 0 once
/// ended with a replica behind: learners whose logs lagged re-proposed their batches every
/// retry, each re-proposal became a new entry, and the log grew faster than they caught up,
/// some 1,500 entries for 100 requests. A leader no longer orders a batch it has ordered.)
#[test]
fn members_change_while_replicas_catch_up_by_snapshot() {
    check_seeds(40, "-p atomos-order --test sim", |seed| {
        let o = simulate(seed, Setup::membership(100));
        check(&o)?;
        check_membership(&o)
    });
}

/// The run ended with the configuration the operator's script leads to.
fn check_membership(o: &harness::Outcome) -> Result<(), String> {
    if o.membership != scripted_end() {
        return Err(format!(
            "the run ended with {:?}, not where the script leads",
            o.membership
        ));
    }
    Ok(())
}
