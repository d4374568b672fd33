//! The replicated store as the order layer's state machine.

use std::sync::Arc;

use atomos_core::{Engine, Invocation, Procedures, SerialExecutor, SnapshotObject};
use atomos_order::{Request, StateMachine};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use super::collect::{Reachability, Write};
use super::entry::{owner_node, owner_run, Answer, Entry};

/// What a store applied since it started (or was restored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Certifications that committed.
    pub committed: u64,
    /// Certifications refused because a read was stale.
    pub conflicts: u64,
    /// Barriers applied.
    pub barriers: u64,
    /// Payloads that were not entries (ordered, answered, otherwise ignored).
    pub refused: u64,
    /// Anonymous objects deleted by collections.
    pub collected: u64,
    /// Procedure invocations applied (under `active`).
    pub invoked: u64,
    /// Digests another replica reported that this one compared with its own.
    pub digests_compared: u64,
    /// Of those, the ones that differed: this replica's state is not another's at the same
    /// position (each is also an alarm).
    pub divergences: u64,
}

/// Digests a store keeps of its own recent states, to compare with other replicas' reports.
const DIGESTS_KEPT: usize = 64;

/// FNV-1a over `bytes`: the same on every platform and build.
fn digest_of(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Bugs a store can be built with on purpose, so that a test shows the simulation finds them.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Certify only the first read of each entry (a later stale read passes: lost updates).
    FirstReadOnly,
    /// Commit a procedure invocation at its optimistic delivery instead of waiting for the
    /// final one (a revoked delivery's writes stay).
    CommitAtOpt,
}

/// A snapshot: the objects and abstract locks at a log position.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    position: u64,
    objects: Vec<SnapshotObject>,
    locks: Vec<(String, u64)>,
    runs: Vec<(u64, u64)>,
}

/// One replica's store: the node's engine, changed only through the log. Every finally
/// delivered request is one log position; replicas that applied the same requests hold the
/// same objects with the same versions.
pub struct ReplicatedStore {
    engine: Arc<Engine>,
    position: u64,
    /// Abstract locks (open nesting): name -> owning family.
    locks: BTreeMap<String, u64>,
    /// Each node's current run, as its last `ReleaseStale` said: families of its other runs
    /// are gone and take no lock.
    runs: BTreeMap<u64, u64>,
    /// The reference graph, for garbage collection.
    graph: Reachability,
    stats: StoreStats,
    planted_bug: Option<PlantedBug>,
    /// Runs `Invoke` entries (under `active`; without it they are refused).
    executor: Option<SerialExecutor>,
    /// Outcomes of invocations committed early ([`PlantedBug::CommitAtOpt`] only).
    early: BTreeMap<(u64, u32), atomos_core::Outcome>,
    /// This replica's digests at its latest `Digest` positions.
    digests: BTreeMap<u64, u64>,
    /// What an operator must hear of, not yet taken by the order layer.
    alarms: Vec<String>,
}

impl ReplicatedStore {
    /// The store with a deliberate bug (tests of the simulation only).
    #[doc(hidden)]
    pub fn with_planted_bug(mut self, bug: Option<PlantedBug>) -> ReplicatedStore {
        self.planted_bug = bug;
        self
    }

    /// The store over `engine`, which must be made for replication
    /// ([`atomos_core::EngineConfig::replicated`]) and hold no objects yet.
    pub fn new(engine: Arc<Engine>) -> Result<ReplicatedStore, String> {
        if !engine.config().replicated {
            return Err("the engine is not made for replication".into());
        }
        Ok(ReplicatedStore {
            position: engine.applied(),
            engine,
            locks: BTreeMap::new(),
            runs: BTreeMap::new(),
            graph: Reachability::default(),
            stats: StoreStats::default(),
            planted_bug: None,
            executor: None,
            early: BTreeMap::new(),
            digests: BTreeMap::new(),
            alarms: Vec::new(),
        })
    }

    /// The store of the `active` protocol: as [`ReplicatedStore::new`], and it runs `Invoke`
    /// entries with `procedures` (the same on every replica), speculatively at their
    /// optimistic delivery ([`SerialExecutor`]).
    pub fn active(engine: Arc<Engine>, procedures: Procedures) -> Result<ReplicatedStore, String> {
        let mut store = ReplicatedStore::new(engine)?;
        store.executor = Some(SerialExecutor::new(store.engine.clone(), procedures));
        Ok(store)
    }

    /// The executor's counters (under `active`).
    pub fn executor_stats(&self) -> Option<atomos_core::ExecutorStats> {
        self.executor.as_ref().map(SerialExecutor::stats)
    }

    /// The engine the store applies to.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The log position applied so far (one per finally delivered request).
    pub fn position(&self) -> u64 {
        self.position
    }

    /// What the store applied.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// The objects, encoded exactly as a snapshot holds them: equal on replicas at equal
    /// positions.
    pub fn contents(&self) -> Vec<u8> {
        self.snapshot()
    }

    fn decode_snapshot(data: &[u8]) -> Result<Snapshot, String> {
        let s: Snapshot = postcard::from_bytes(data).map_err(|e| format!("snapshot: {e}"))?;
        if s.objects.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err("snapshot: objects are not sorted by key, each once".into());
        }
        if let Some((key, version, _)) = s.objects.iter().find(|o| o.1 == 0 || o.1 > s.position) {
            return Err(format!(
                "snapshot at {}: object {key} has version {version}",
                s.position
            ));
        }
        Ok(s)
    }
}

impl ReplicatedStore {
    /// Applies one finally delivered request; `slot` is its place among the optimistic
    /// deliveries (known when the order layer says it).
    fn apply_at(&mut self, slot: Option<(u64, u32)>, request: &Request) -> Vec<u8> {
        self.position += 1;
        let position = self.position;
        let answer = match Entry::decode(&request.payload) {
            Ok(Entry::Certify { reads, writes }) => {
                let reads = match self.planted_bug {
                    Some(PlantedBug::FirstReadOnly) => &reads[..reads.len().min(1)],
                    Some(PlantedBug::CommitAtOpt) | None => &reads[..],
                };
                let graph: Vec<Write> = writes
                    .iter()
                    .map(|(k, v)| Write::of(k, v.as_deref()))
                    .collect();
                if self.engine.apply_certified(position, reads, writes) {
                    for w in graph {
                        self.graph.note(w);
                    }
                    self.stats.committed += 1;
                    Answer::Committed { version: position }
                } else {
                    self.stats.conflicts += 1;
                    Answer::Conflict { position }
                }
            }
            Ok(Entry::Barrier) => {
                self.engine.mark_applied(position);
                self.stats.barriers += 1;
                Answer::Applied { position }
            }
            Ok(Entry::Lock { owner, name }) => {
                self.engine.mark_applied(position);
                // A request of a node's earlier run, ordered after that node restarted, is
                // refused: its family is gone and would hold the lock forever.
                let gone = self
                    .runs
                    .get(&owner_node(owner))
                    .is_some_and(|&run| run != owner_run(owner));
                match self.locks.get(&name) {
                    _ if gone => Answer::LockHeld { position },
                    Some(&o) if o == owner => Answer::Locked {
                        position,
                        taken: false,
                    },
                    Some(_) => Answer::LockHeld { position },
                    None => {
                        self.locks.insert(name, owner);
                        Answer::Locked {
                            position,
                            taken: true,
                        }
                    }
                }
            }
            Ok(Entry::Unlock { owner, names }) => {
                self.engine.mark_applied(position);
                for n in names {
                    if self.locks.get(&n) == Some(&owner) {
                        self.locks.remove(&n);
                    }
                }
                Answer::Applied { position }
            }
            Ok(Entry::Collect) => {
                let garbage = self.graph.garbage().unwrap_or_default();
                let reclaimed = garbage.len() as u64;
                let deletions: Vec<_> = garbage.into_iter().map(|k| (k, None)).collect();
                for (k, _) in &deletions {
                    self.graph.note(Write::of(k, None));
                }
                // Installed like a certified write with no reads: always applies.
                self.engine.apply_certified(position, &[], deletions);
                self.stats.collected += reclaimed;
                Answer::Collected {
                    position,
                    reclaimed,
                }
            }
            Ok(Entry::Invoke {
                procedure,
                arguments,
            }) => match self.executor.as_mut() {
                Some(executor) => {
                    let invocation = Invocation {
                        procedure,
                        arguments,
                    };
                    // Without a slot (a caller that does not say it) it is never speculated.
                    let slot = slot.unwrap_or((u64::MAX, u32::MAX));
                    if let Some(outcome) = self.early.remove(&slot) {
                        self.engine.mark_applied(position);
                        return Answer::Invoked { position, outcome }.encode();
                    }
                    let graph = &mut self.graph;
                    let outcome = executor.finalize(slot, position, &invocation, |k, v| {
                        graph.note(Write::of(k, v))
                    });
                    self.stats.invoked += 1;
                    Answer::Invoked { position, outcome }
                }
                None => {
                    self.engine.mark_applied(position);
                    self.stats.refused += 1;
                    Answer::Refused {
                        position,
                        reason: "procedure invocations need the active protocol".into(),
                    }
                }
            },
            Ok(Entry::Digest { reported }) => {
                self.engine.mark_applied(position);
                let digest = digest_of(&self.contents());
                if let Some((node, at, theirs)) = reported {
                    if let Some(&ours) = self.digests.get(&at) {
                        self.stats.digests_compared += 1;
                        if ours != theirs {
                            self.stats.divergences += 1;
                            self.alarms.push(format!(
                                "replicas diverged: at log position {at} this replica's store \
                                 has digest {ours:#018x}, node {node}'s has {theirs:#018x}"
                            ));
                        }
                    }
                }
                self.digests.insert(position, digest);
                while self.digests.len() > DIGESTS_KEPT {
                    self.digests.pop_first();
                }
                Answer::Digested { position, digest }
            }
            Ok(Entry::ReleaseStale { node, keep }) => {
                self.engine.mark_applied(position);
                self.runs.insert(node, keep);
                self.locks
                    .retain(|_, o| owner_node(*o) != node || owner_run(*o) == keep);
                Answer::Applied { position }
            }
            Err(e) => {
                self.engine.mark_applied(position);
                self.stats.refused += 1;
                Answer::Refused {
                    position,
                    reason: e.to_string(),
                }
            }
        };
        answer.encode()
    }
}

impl StateMachine for ReplicatedStore {
    fn apply(&mut self, request: &Request) -> Vec<u8> {
        self.apply_at(None, request)
    }

    fn apply_final(&mut self, seq: u64, index: u32, request: &Request) -> Vec<u8> {
        self.apply_at(Some((seq, index)), request)
    }

    fn optimistic(&mut self, seq: u64, requests: &[Request]) {
        let Some(executor) = self.executor.as_mut() else {
            return;
        };
        for (index, r) in requests.iter().enumerate() {
            if let Ok(Entry::Invoke {
                procedure,
                arguments,
            }) = Entry::decode(&r.payload)
            {
                let invocation = Invocation {
                    procedure,
                    arguments,
                };
                if self.planted_bug == Some(PlantedBug::CommitAtOpt) {
                    let at = self.position + 1 + index as u64;
                    let outcome =
                        executor.finalize((seq, index as u32), at, &invocation, |_, _| {});
                    self.early.insert((seq, index as u32), outcome);
                    continue;
                }
                executor.speculate((seq, index as u32), &invocation);
            }
        }
    }

    fn revoked(&mut self, from: u64) {
        if let Some(executor) = self.executor.as_mut() {
            executor.revoke((from, 0));
        }
    }

    fn take_alarms(&mut self) -> Vec<String> {
        std::mem::take(&mut self.alarms)
    }

    /// The objects at the current position. Values installed through the log are kept as the
    /// bytes they arrived as, so encoding cannot fail; if it did, the snapshot is empty bytes,
    /// which `restore` refuses (loudly) rather than restoring a partial state.
    fn snapshot(&self) -> Vec<u8> {
        match self.engine.snapshot_objects() {
            Ok(objects) => postcard::to_stdvec(&Snapshot {
                position: self.position,
                objects,
                locks: self.locks.iter().map(|(n, o)| (n.clone(), *o)).collect(),
                runs: self.runs.iter().map(|(n, r)| (*n, *r)).collect(),
            })
            .unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let s = Self::decode_snapshot(data)?;
        if let Some(executor) = self.executor.as_mut() {
            // Speculation ran on the state being replaced.
            executor.revoke((0, 0));
        }
        self.graph = Reachability::of(&s.objects);
        self.engine.install_snapshot(s.position, s.objects);
        self.position = s.position;
        self.locks = s.locks.into_iter().collect();
        self.runs = s.runs.into_iter().collect();
        Ok(())
    }

    fn check_snapshot(&self, data: &[u8]) -> Result<(), String> {
        Self::decode_snapshot(data).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
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
        let digest = Entry::Digest { reported: None };
        let reported = match Answer::decode(&a.apply(&request(&digest))).unwrap() {
            Answer::Digested { position, digest } => Some((1, position, digest)),
            other => panic!("{other:?}"),
        };
        b.apply(&request(&digest));
        c.apply(&request(&digest));
        let next = Entry::Digest { reported };
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
        let ask =
            |s: &mut ReplicatedStore, e: Entry| Answer::decode(&s.apply(&request(&e))).unwrap();
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
        for bad in [
            vec![],
            vec![1, 2, 3],
            snap[..snap.len() - 1].to_vec(),
            // An object newer than the snapshot's position.
            postcard::to_stdvec(&Snapshot {
                position: 1,
                objects: vec![(k.clone(), 2, None)],
                locks: vec![],
                runs: vec![],
            })
            .unwrap(),
            // The same key twice.
            postcard::to_stdvec(&Snapshot {
                position: 5,
                objects: vec![(k.clone(), 1, None), (k.clone(), 2, None)],
                locks: vec![],
                runs: vec![],
            })
            .unwrap(),
        ] {
            let mut c = store();
            assert!(c.check_snapshot(&bad).is_err());
            assert!(c.restore(&bad).is_err());
            assert_eq!(c.position(), 0);
        }
    }
}
