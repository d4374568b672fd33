//! The replicated store applied entry by entry.
use super::*;
use atomos_core::{EngineConfig, Key};

fn store() -> ReplicatedStore {
    let engine = Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    });
    ReplicatedStore::new(Arc::new(engine)).unwrap()
}

fn request(entry: &Entry) -> Request {
    Request {
        client: 1,
        seq: 1,
        payload: entry.encode(),
        deadline_ms: atomos_order::NO_DEADLINE,
    }
}

/// `value` encoded as a transaction would send it (taken from a local engine's snapshot).
fn tagged(key: &str, value: u64) -> Option<Vec<u8>> {
    let local = Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    });
    let r = atomos_core::TRef::<u64>::new(key);
    local.atomically(|tx| tx.create(&r, value)).unwrap();
    local.snapshot_objects().unwrap().remove(0).2
}

#[test]
fn an_invocation_of_a_procedure_this_replica_lacks_raises_an_alarm() {
    let engine = Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    });
    let mut s = ReplicatedStore::active(Arc::new(engine), atomos_core::Procedures::new()).unwrap();
    let invoke = Entry::Invoke {
        procedure: "missing".into(),
        arguments: Vec::new(),
    };
    assert!(matches!(
        Answer::decode(&s.apply(&request(&invoke))).unwrap(),
        Answer::Invoked {
            outcome: atomos_core::Outcome::Failed(_),
            ..
        }
    ));
    let alarms = s.take_alarms();
    assert!(
        alarms.len() == 1 && alarms[0].contains("not registered"),
        "{alarms:?}"
    );
    // A store without an executor refuses the entry instead.
    let mut plain = store();
    assert!(matches!(
        Answer::decode(&plain.apply(&request(&invoke))).unwrap(),
        Answer::Refused { .. }
    ));
}

#[test]
fn a_replica_whose_state_differs_raises_an_alarm_at_the_next_digest() {
    let (mut a, mut b, mut c) = (store(), store(), store());
    let k = Key::from("k");
    let write = |v| Entry::Certify {
        reads: vec![],
        writes: vec![(k.clone(), tagged("k", v))],
    };
    a.apply(&request(&write(1)));
    b.apply(&request(&write(1)));
    // c applied something else at the same position: it diverged.
    c.apply(&request(&write(2)));
    let digest = Entry::ContentsDigest { reported: None };
    let reported = match Answer::decode(&a.apply(&request(&digest))).unwrap() {
        Answer::Digested { position, digest } => Some((1, position, digest)),
        other => panic!("{other:?}"),
    };
    b.apply(&request(&digest));
    c.apply(&request(&digest));
    // An earlier build's digest entry reports a digest computed another way: compared with
    // nothing, so no alarm, even on the replica that diverged.
    let earlier = Entry::Digest { reported };
    c.apply(&request(&earlier));
    assert!(c.take_alarms().is_empty());
    assert_eq!(c.stats().digests_compared, 0);
    let next = Entry::ContentsDigest { reported };
    for s in [&mut a, &mut b] {
        s.apply(&request(&earlier));
    }
    for s in [&mut a, &mut b, &mut c] {
        s.apply(&request(&next));
    }
    assert!(a.take_alarms().is_empty() && b.take_alarms().is_empty());
    let alarms = c.take_alarms();
    assert_eq!(alarms.len(), 1, "{alarms:?}");
    assert!(alarms[0].contains("diverged"), "{alarms:?}");
    assert_eq!((b.stats().digests_compared, b.stats().divergences), (1, 0));
    assert_eq!((c.stats().digests_compared, c.stats().divergences), (1, 1));
}

#[test]
fn certification_is_decided_by_the_newest_versions() {
    let mut s = store();
    let k = Key::from("k");
    let v = tagged("k", 5);
    let first = Entry::Certify {
        reads: vec![(k.clone(), 0)],
        writes: vec![(k.clone(), v.clone())],
    };
    assert_eq!(
        Answer::decode(&s.apply(&request(&first))).unwrap(),
        Answer::Committed { version: 1 }
    );
    // The same reads again are stale now.
    assert_eq!(
        Answer::decode(&s.apply(&request(&first))).unwrap(),
        Answer::Conflict { position: 2 }
    );
    let r = atomos_core::TRef::<u64>::new("k");
    assert_eq!(s.engine().atomically(|tx| tx.read(&r).copied()).unwrap(), 5);
    assert_eq!(s.engine().applied(), 2);
    // Garbage is ordered, answered, and changes nothing but the position.
    let junk = Request {
        client: 1,
        seq: 3,
        payload: vec![0xff; 7],
        deadline_ms: atomos_order::NO_DEADLINE,
    };
    assert!(matches!(
        Answer::decode(&s.apply(&junk)).unwrap(),
        Answer::Refused { position: 3, .. }
    ));
    assert_eq!(s.stats().refused, 1);
    assert_eq!(s.engine().version_of(&k), 1);
}

#[test]
fn abstract_locks_are_taken_released_and_kept_in_snapshots() {
    let mut s = store();
    let (a, b) = ((1 << 48) | (7 << 32) | 1, (2 << 48) | (3 << 32) | 1);
    let ask = |s: &mut ReplicatedStore, e: Entry| Answer::decode(&s.apply(&request(&e))).unwrap();
    let lock = |owner, name: &str| Entry::Lock {
        owner,
        name: name.into(),
    };
    assert_eq!(
        ask(&mut s, lock(a, "x")),
        Answer::Locked {
            position: 1,
            taken: true
        }
    );
    assert_eq!(
        ask(&mut s, lock(a, "x")),
        Answer::Locked {
            position: 2,
            taken: false
        }
    );
    assert_eq!(ask(&mut s, lock(b, "x")), Answer::LockHeld { position: 3 });
    assert_eq!(
        ask(&mut s, lock(b, "y")),
        Answer::Locked {
            position: 4,
            taken: true
        }
    );
    // A snapshot carries the table.
    let mut copy = store();
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(
        ask(&mut copy, lock(a, "y")),
        Answer::LockHeld { position: 5 }
    );
    // Unlock releases only what the family holds.
    ask(
        &mut s,
        Entry::Unlock {
            owner: b,
            names: vec!["x".into(), "y".into()],
        },
    );
    assert_eq!(ask(&mut s, lock(b, "x")), Answer::LockHeld { position: 6 });
    assert_eq!(
        ask(&mut s, lock(a, "y")),
        Answer::Locked {
            position: 7,
            taken: true
        }
    );
    // Node 1 restarted as run 8: its run-7 families lose their locks.
    ask(&mut s, Entry::ReleaseStale { node: 1, keep: 8 });
    assert_eq!(
        ask(&mut s, lock(b, "x")),
        Answer::Locked {
            position: 9,
            taken: true
        }
    );
    assert_eq!(s.engine().applied(), 9);
}

#[test]
fn lock_owners_keep_full_width_node_run_and_family_ids() {
    let mut s = store();
    let ask = |s: &mut ReplicatedStore, e: Entry| Answer::decode(&s.apply(&request(&e))).unwrap();
    let owner = |node, run, family| LockOwner { node, run, family };
    let lock = |owner, name: &str| Entry::LockFor {
        owner,
        name: name.into(),
    };
    // Packed into 16 bits (what earlier builds wrote), nodes 1 and 65537 were one owner, and
    // so were families 1 and 2^32 + 1 of one run.
    let packed = |node: u64, run: u64, family: u64| (node << 48) | (run << 32) | family;
    assert_eq!(
        LockOwner::from_packed(packed(1, 5, 1)),
        LockOwner::from_packed(packed(65537 & 0xFFFF, 5, 1))
    );
    let (one, far) = (owner(1, 5, 1), owner(65537, 5, 1));
    assert_eq!(
        ask(&mut s, lock(one, "x")),
        Answer::Locked {
            position: 1,
            taken: true
        }
    );
    // Node 65537's family with the same run and family numbers is another owner.
    assert_eq!(
        ask(&mut s, lock(far, "x")),
        Answer::LockHeld { position: 2 }
    );
    assert_eq!(
        ask(&mut s, lock(owner(1, 5, (1 << 32) + 1), "x")),
        Answer::LockHeld { position: 3 }
    );
    // Node 65537 restarting (as run 9) releases its own earlier runs' locks, not node 1's.
    ask(
        &mut s,
        Entry::ReleaseStaleRuns {
            node: 65537,
            keep: 9,
        },
    );
    assert_eq!(
        ask(&mut s, lock(one, "x")),
        Answer::Locked {
            position: 5,
            taken: false
        },
        "node 65537's restart released node 1's lock"
    );
    // Neither does node 65537 release node 1's lock by unlocking.
    ask(
        &mut s,
        Entry::UnlockFor {
            owner: far,
            names: vec!["x".into()],
        },
    );
    assert_eq!(
        ask(&mut s, lock(one, "x")),
        Answer::Locked {
            position: 7,
            taken: false
        }
    );
    // Runs at full width: run 2^16 + 5 is not run 5.
    ask(
        &mut s,
        Entry::ReleaseStaleRuns {
            node: 1,
            keep: (1 << 16) + 5,
        },
    );
    assert_eq!(
        ask(&mut s, lock(owner(1, 5, 2), "y")),
        Answer::LockHeld { position: 9 },
        "a family of node 1's gone run took a lock"
    );
    assert_eq!(
        ask(&mut s, lock(owner(65537, 9, 1), "x")),
        Answer::Locked {
            position: 10,
            taken: true
        },
        "node 1's gone run still held its lock"
    );
    // Snapshots keep full-width owners and runs.
    let mut copy = store();
    copy.restore(&s.snapshot()).unwrap();
    assert_eq!(copy.locks, s.locks);
    assert_eq!(copy.runs, s.runs);
}

#[test]
fn snapshots_of_earlier_builds_with_packed_owners_still_restore() {
    let objects = vec![(Key::from("k"), 1, tagged("k", 3))];
    let earlier = PackedSnapshot {
        position: 4,
        objects,
        locks: vec![("x".into(), (2 << 48) | (7 << 32) | 9)],
        runs: vec![(2, 7)],
    };
    let bytes = postcard::to_stdvec(&earlier).unwrap();
    let mut s = store();
    s.restore(&bytes).unwrap();
    assert_eq!(
        s.locks["x"],
        LockOwner {
            node: 2,
            run: 7,
            family: 9
        }
    );
    assert_eq!(s.runs[&2], 7);
    // Bytes after a snapshot's end are refused, and a snapshot of this build cut anywhere,
    // even right where the earlier layout ends.
    let whole = s.snapshot();
    let mut longer = whole.clone();
    longer.push(0);
    assert!(store().restore(&longer).is_err());
    for cut in 1..whole.len() {
        assert!(store().restore(&whole[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn a_restored_store_holds_the_same_objects_and_refuses_bad_snapshots() {
    let mut a = store();
    let k = Key::from("k");
    let v = tagged("k", 9);
    a.apply(&request(&Entry::Certify {
        reads: vec![],
        writes: vec![(k.clone(), v)],
    }));
    a.apply(&request(&Entry::Barrier));
    let snap = a.snapshot();
    let mut b = store();
    b.check_snapshot(&snap).unwrap();
    b.restore(&snap).unwrap();
    assert_eq!(b.position(), 2);
    assert_eq!(b.contents(), a.contents());
    // The digest is the hash of the contents, computed without holding them.
    assert_eq!(
        a.contents_digest(),
        xxhash_rust::xxh3::xxh3_64(&a.contents())
    );
    assert_eq!(b.contents_digest(), a.contents_digest());
    for bad in [
        vec![],
        vec![1, 2, 3],
        snap[..snap.len() - 1].to_vec(),
        // An object newer than the snapshot's position.
        Snapshot {
            position: 1,
            objects: vec![(k.clone(), 2, None)],
            locks: vec![],
            runs: vec![],
        }
        .encode()
        .unwrap(),
        // The same key twice.
        Snapshot {
            position: 5,
            objects: vec![(k.clone(), 1, None), (k.clone(), 2, None)],
            locks: vec![],
            runs: vec![],
        }
        .encode()
        .unwrap(),
    ] {
        let mut c = store();
        assert!(c.check_snapshot(&bad).is_err());
        assert!(c.restore(&bad).is_err());
        assert_eq!(c.position(), 0);
    }
}

/// A snapshot asked for now and encoded later (a host runs the job on a thread of its own; the
/// job is `Send`), holds the objects as they were when it was asked for, whatever the store
/// applied since (an overwrite, a new object, a lock), and the position then.
#[test]
fn a_snapshot_encoded_later_holds_the_state_it_was_asked_for_at() {
    let mut s = store();
    let (k, j) = (Key::from("k"), Key::from("j"));
    let write = |key: &Key, v| Entry::Certify {
        reads: vec![],
        writes: vec![(key.clone(), tagged(&key.to_string(), v))],
    };
    s.apply(&request(&write(&k, 1)));
    let now = s.snapshot();
    let job = s.snapshot_later().expect("the store encodes later");
    s.apply(&request(&write(&k, 2)));
    s.apply(&request(&write(&j, 3)));
    s.apply(&request(&Entry::LockFor {
        owner: LockOwner {
            node: 1,
            run: 1,
            family: 1,
        },
        name: "l".into(),
    }));
    let later = job();
    assert_eq!(later, now, "the state when it was asked for");
    assert_ne!(s.snapshot(), now, "the store moved on");
    let mut restored = store();
    restored.restore(&later).unwrap();
    assert_eq!(restored.position(), 1);
}

/// A store restored from shared bytes holds its values as slices of them, not copies (the
/// replica keeps the same bytes as its latest snapshot's state: the state is in memory once),
/// and is the state they hold.
#[test]
fn a_restored_store_shares_the_snapshots_bytes_instead_of_copying_them() {
    let mut s = store();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        s.apply(&request(&Entry::Certify {
            reads: vec![],
            writes: vec![(Key::from(name), tagged(name, i as u64))],
        }));
    }
    let data = Bytes::from(s.snapshot());
    let mut restored = store();
    restored.restore_shared(&data).unwrap();
    let (shared, _) = values_lying_in(&restored, &data);
    assert_eq!(shared, 3, "every value lies in the snapshot's bytes");
    assert_eq!(restored.snapshot(), data.to_vec());
    assert_eq!(restored.position(), 3);
}

/// A store restored from one snapshot and then from a later one holds every value as a slice
/// of the later one, those that did not change too: no earlier snapshot's bytes stay alive.
#[test]
fn a_second_restore_keeps_nothing_of_the_first_snapshots_bytes() {
    let mut s = store();
    let write = |name: &str, v| Entry::Certify {
        reads: vec![],
        writes: vec![(Key::from(name), tagged(name, v))],
    };
    s.apply(&request(&write("a", 1)));
    s.apply(&request(&write("b", 2)));
    let first = Bytes::from(s.snapshot());
    s.apply(&request(&write("b", 3)));
    let second = Bytes::from(s.snapshot());
    let mut restored = store();
    restored.restore_shared(&first).unwrap();
    restored.restore_shared(&second).unwrap();
    let (inside, objects) = values_lying_in(&restored, &second);
    let outside = objects - inside;
    assert_eq!(outside, 0, "a value still lies outside the later snapshot");
    assert_eq!(restored.snapshot(), second.to_vec());
}

/// How many of `store`'s objects hold a value lying inside `bytes` (shared, not copied), and
/// how many objects it holds.
fn values_lying_in(store: &ReplicatedStore, bytes: &Bytes) -> (usize, usize) {
    let within = bytes.as_ptr_range();
    store
        .engine
        .with_snapshot_objects(|objects| {
            let inside = objects
                .iter()
                .filter(|(_, _, value)| {
                    matches!(value, Some(std::borrow::Cow::Borrowed(v)) if within.contains(&v.as_ptr()))
                })
                .count();
            (inside, objects.len())
        })
        .unwrap()
}
