//! OSS in the simulator: three nodes run list-append transactions, bank transfers and
//! node-local counters over OSS (ultra-peer sequencing, epochs through the control log) with
//! loss, duplication, delay, partitions, crashes, restarts and disks that lose unsynced
//! writes. Checks: the list-append history is serializable, every audit finds the bank's
//! total, the live nodes end with the same replicated objects, no acknowledged local commit is
//! lost, and commits happened.

use atomos_protocols::oss::{CommitMode, OssBug};
use atomos_sim::{first_caught, Faults};

mod oss_sim_parts;

use oss_sim_parts::*;

fn seeds(default: u64) -> u64 {
    std::env::var("ATOMOS_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

const TOKENS: [CommitMode; 2] = [CommitMode::DistributedToken, CommitMode::CoordinatorToken];

fn failure_free(mode: CommitMode) {
    for seed in 0..5 {
        let o = simulate(seed, mode, None, Faults::none());
        let lists = check(&o).unwrap_or_else(|e| panic!("{mode:?} seed {seed}: {e}"));
        assert!(
            o.commits > 20,
            "{mode:?} seed {seed}: only {} commits",
            o.commits
        );
        assert!(
            lists > 5,
            "{mode:?} seed {seed}: {lists} list transactions committed"
        );
        assert_eq!(o.finals.len(), NODES);
        if mode != CommitMode::UltraPeer {
            assert!(
                o.passes > 10,
                "{mode:?} seed {seed}: {} token passes",
                o.passes
            );
        }
    }
}

fn with_every_fault(mode: CommitMode, default_seeds: u64) {
    let mut epochs = 0;
    let mut commits = 0;
    let mut compactions = 0;
    for seed in 0..seeds(default_seeds) {
        let o = simulate(seed, mode, None, Faults::harsh());
        if let Err(e) = check(&o) {
            panic!("{mode:?} seed {seed}: {e}");
        }
        // A node cut off from a majority re-proposes its suspicions: one at a time.
        assert!(
            o.control_in_flight_max <= 1,
            "{mode:?} seed {seed}: {} control proposals in flight at once",
            o.control_in_flight_max
        );
        epochs = epochs.max(o.epochs);
        commits += o.commits;
        compactions += o.compactions;
    }
    eprintln!(
        "{mode:?}: {commits} commits, {compactions} compactions; at most {epochs} epochs \
         started on a node in one run"
    );
    assert!(commits > 100, "only {commits} commits over the seeds");
    assert!(
        compactions > 10,
        "only {compactions} compactions over the seeds"
    );
    assert!(epochs > 1, "no epoch ever changed");
}

fn with_a_wiped_disk(mode: CommitMode, default_seeds: u64) {
    let mut wiped = 0;
    for seed in 0..seeds(default_seeds) {
        let mut faults = Faults::harsh();
        faults.wipe = 0.3;
        faults.max_wiped_nodes = 1;
        let o = simulate(seed, mode, None, faults);
        if let Err(e) = check(&o) {
            panic!("{mode:?} seed {seed}: {e}");
        }
        wiped += usize::from(!o.run.wiped.is_empty());
    }
    assert!(wiped > 3, "only {wiped} runs wiped a disk");
}

#[test]
fn failure_free_runs_commit_and_converge() {
    failure_free(CommitMode::UltraPeer);
}

#[test]
fn failure_free_runs_commit_and_converge_with_a_token() {
    for mode in TOKENS {
        failure_free(mode);
    }
}

#[test]
fn runs_with_every_fault_stay_serializable_and_lose_nothing_acknowledged() {
    with_every_fault(CommitMode::UltraPeer, 40);
}

#[test]
fn token_runs_with_every_fault_stay_serializable_and_lose_nothing_acknowledged() {
    for mode in TOKENS {
        with_every_fault(mode, 40);
    }
}

#[test]
fn a_node_that_lost_its_disk_rejoins_without_losing_anything_acknowledged() {
    with_a_wiped_disk(CommitMode::UltraPeer, 40);
}

#[test]
fn a_token_node_that_lost_its_disk_rejoins_without_losing_anything_acknowledged() {
    for mode in TOKENS {
        with_a_wiped_disk(mode, 20);
    }
}

#[test]
fn counting_a_write_set_stable_before_a_majority_holds_it_is_caught() {
    first_caught("counting a write set stable at one node", 40, |seed| {
        let bug = Some(OssBug::StableAtOne);
        check(&simulate(seed, CommitMode::UltraPeer, bug, Faults::harsh())).map(|_| ())
    });
}

#[test]
fn a_sequencer_that_skips_validation_is_caught() {
    first_caught("a sequencer that skips validation", 20, |seed| {
        let bug = Some(OssBug::SkipValidation);
        check(&simulate(seed, CommitMode::UltraPeer, bug, Faults::none())).map(|_| ())
    });
}

#[test]
fn a_token_taken_twice_is_caught() {
    first_caught("a token taken twice", 40, |seed| {
        let bug = Some(OssBug::TokenTakenTwice);
        check(&simulate(
            seed,
            CommitMode::DistributedToken,
            bug,
            Faults::harsh(),
        ))
        .map(|_| ())
    });
}

#[test]
fn a_compaction_that_puts_a_fence_before_the_write_sets_is_caught() {
    first_caught("a compaction with fences first", 60, |seed| {
        let bug = Some(OssBug::FencesFirst);
        check(&simulate(
            seed,
            CommitMode::DistributedToken,
            bug,
            Faults::harsh(),
        ))
        .map(|_| ())
    });
}

/// Nodes configured with different commit modes follow the one the first epoch's start
/// carried: they commit and converge with faults as a cluster configured alike does.
#[test]
fn nodes_configured_differently_follow_the_mode_the_log_decided() {
    let modes = [
        CommitMode::UltraPeer,
        CommitMode::DistributedToken,
        CommitMode::CoordinatorToken,
    ];
    let mut commits = 0;
    for seed in 0..seeds(10) {
        let o = simulate_modes(seed, modes, None, Faults::harsh());
        if let Err(e) = check(&o) {
            panic!("seed {seed}: {e}");
        }
        commits += o.commits;
    }
    assert!(commits > 100, "only {commits} commits");
}

/// Nodes that keep 2 write sets per domain, crashes that last long (or wipe the disk): a node
/// back from one lacks write sets nobody keeps any more and catches up from an image of the
/// domain. The checks hold, and images were installed.
#[test]
fn a_node_behind_what_anyone_keeps_catches_up_from_an_image() {
    for mode in [
        CommitMode::UltraPeer,
        CommitMode::DistributedToken,
        CommitMode::CoordinatorToken,
    ] {
        let mut images = 0;
        for seed in 0..seeds(20) {
            let mut faults = Faults::harsh();
            faults.down_for = 1_500;
            if seed % 2 == 1 {
                faults.wipe = 0.5;
                faults.max_wiped_nodes = 1;
            }
            let o = simulate_with(seed, [mode; NODES], None, faults, 2);
            if let Err(e) = check(&o) {
                panic!("{mode:?} seed {seed}: {e}");
            }
            images += o.images;
        }
        eprintln!("{mode:?}: {images} images installed");
        assert!(images > 3, "{mode:?}: only {images} images installed");
    }
}
