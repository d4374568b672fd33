//! The replicated store as the order layer's state machine.

use std::sync::Arc;

use atomos_core::{
    Engine, Invocation, Key, Procedures, SerialExecutor, SnapshotObject, SnapshotObjectRef,
};
use atomos_order::{Request, SnapshotJob, StateMachine};
use atomos_seam::Bytes;
use postcard::ser_flavors::{ExtendFlavor, Flavor};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use std::collections::BTreeMap;

use super::collect::{Reachability, Write};
use super::entry::{Answer, Entry, LockOwner};

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

/// A postcard output that hashes what is written instead of keeping it (XXH3, 64 bits).
struct HashFlavor(Xxh3);

impl Flavor for HashFlavor {
    type Output = u64;

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.update(&[byte]);
        Ok(())
    }

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.update(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<u64> {
        Ok(self.0.digest())
    }
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

/// A snapshot: the objects and abstract locks at a log position. Encoded as the snapshot of
/// earlier builds (whose lock owners were packed into a `u64`), with no packed locks and one
/// run, [`FULL_WIDTH_FOLLOWS`], that says [`OwnersAtFullWidth`] follows: a snapshot of an
/// earlier build (no such run) still restores, its packed owners read as
/// [`LockOwner::from_packed`], and a snapshot of this build cut short is refused.
/// `O` is how an object is held: owned ([`SnapshotObject`]) or with its value borrowed from
/// the snapshot's bytes ([`BorrowedObject`], to check or restore one without copying it).
struct Snapshot<O = SnapshotObject> {
    position: u64,
    objects: Vec<O>,
    locks: Vec<(String, LockOwner)>,
    runs: Vec<(u64, u64)>,
}

/// An object of a snapshot whose value is borrowed from the snapshot's bytes.
type BorrowedObject<'a> = (Key, u64, Option<&'a [u8]>);

/// An object of a snapshot whose value is a slice of the snapshot's bytes, shared with them.
type SharedObject = (Key, u64, Option<Bytes>);

/// Writes a snapshot's objects with their values as bytes in one piece (the same encoding as
/// the sequence of bytes a [`SnapshotObject`]'s value is, written far faster).
fn objects_as_bytes<S: serde::Serializer>(
    objects: &&[SnapshotObjectRef<'_>],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        objects
            .iter()
            .map(|(k, v, b)| (k, *v, b.as_deref().map(serde_bytes::Bytes::new))),
    )
}

/// What a snapshot's check looks at in an object, however it is held.
trait ObjectHead {
    fn key(&self) -> &Key;
    fn version(&self) -> u64;
}

/// An object is a key, a version and a value held some way.
impl<V> ObjectHead for (Key, u64, V) {
    fn key(&self) -> &Key {
        &self.0
    }
    fn version(&self) -> u64 {
        self.1
    }
}

/// The run entry (of no node: ids are below 2^63) that marks a snapshot of this build.
const FULL_WIDTH_FOLLOWS: (u64, u64) = (u64::MAX, u64::MAX);

/// The layout of earlier builds' snapshots, which a snapshot still starts with.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct PackedSnapshot<O = SnapshotObject> {
    position: u64,
    objects: Vec<O>,
    locks: Vec<(String, u64)>,
    runs: Vec<(u64, u64)>,
}

/// What follows [`PackedSnapshot`] in a snapshot of this build.
#[derive(Deserialize)]
struct OwnersAtFullWidth {
    locks: Vec<(String, LockOwner)>,
    runs: Vec<(u64, u64)>,
}

/// [`PackedSnapshot`] and [`OwnersAtFullWidth`] borrowed, to encode (serde writes a slice as
/// it writes a `Vec`).
#[derive(Serialize)]
struct SnapshotParts<'a, 'v> {
    position: u64,
    #[serde(serialize_with = "objects_as_bytes")]
    objects: &'a [SnapshotObjectRef<'v>],
    no_packed_locks: &'a [(String, u64)],
    no_packed_runs: &'a [(u64, u64)],
    locks: &'a [(String, LockOwner)],
    runs: &'a [(u64, u64)],
}

#[cfg(test)]
impl Snapshot {
    fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let objects: Vec<SnapshotObjectRef<'_>> = self
            .objects
            .iter()
            .map(|(k, v, b)| (k.clone(), *v, b.as_deref().map(std::borrow::Cow::Borrowed)))
            .collect();
        postcard::to_stdvec(&SnapshotParts {
            position: self.position,
            objects: &objects,
            no_packed_locks: &[],
            no_packed_runs: &[FULL_WIDTH_FOLLOWS],
            locks: &self.locks,
            runs: &self.runs,
        })
    }
}

impl<'a, O: Deserialize<'a> + ObjectHead> Snapshot<O> {
    /// Decodes a snapshot of this build or an earlier one, refusing one whose objects are not
    /// sorted by key, or whose versions are not within its position.
    fn decode(data: &'a [u8]) -> Result<Snapshot<O>, String> {
        let s = Snapshot::<O>::decode_layout(data)?;
        if s.objects.windows(2).any(|w| w[0].key() >= w[1].key()) {
            return Err("snapshot: objects are not sorted by key, each once".into());
        }
        if let Some(o) = s
            .objects
            .iter()
            .find(|o| o.version() == 0 || o.version() > s.position)
        {
            return Err(format!(
                "snapshot at {}: object {} has version {}",
                s.position,
                o.key(),
                o.version()
            ));
        }
        Ok(s)
    }

    fn decode_layout(data: &'a [u8]) -> Result<Snapshot<O>, String> {
        let (packed, rest): (PackedSnapshot<O>, &[u8]) =
            postcard::take_from_bytes(data).map_err(|e| format!("snapshot: {e}"))?;
        let mut locks: Vec<(String, LockOwner)> = packed
            .locks
            .into_iter()
            .map(|(name, owner)| (name, LockOwner::from_packed(owner)))
            .collect();
        let mut runs = packed.runs;
        let full_width = runs == [FULL_WIDTH_FOLLOWS];
        if full_width {
            runs.clear();
        }
        if full_width || !rest.is_empty() {
            let (wide, left): (OwnersAtFullWidth, &[u8]) = postcard::take_from_bytes(rest)
                .map_err(|e| format!("snapshot's lock owners: {e}"))?;
            if !left.is_empty() {
                return Err(format!("snapshot: {} bytes after its end", left.len()));
            }
            locks.extend(wide.locks);
            runs.extend(wide.runs);
        }
        Ok(Snapshot {
            position: packed.position,
            objects: packed.objects,
            locks,
            runs,
        })
    }
}

/// One replica's store: the node's engine, changed only through the log. Every finally
/// delivered request is one log position; replicas that applied the same requests hold the
/// same objects with the same versions.
pub struct ReplicatedStore {
    engine: Arc<Engine>,
    position: u64,
    /// Abstract locks (open nesting): name -> owning family.
    locks: BTreeMap<String, LockOwner>,
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

    /// The digest of [`ReplicatedStore::contents`] (XXH3, 64 bits: the same on every platform
    /// and build), computed as the contents are encoded, without holding them.
    pub fn contents_digest(&self) -> u64 {
        self.encode_contents(|_| HashFlavor(Xxh3::new()))
            .unwrap_or_default()
    }

    /// Encodes the contents (the snapshot's layout) into the output `flavor` makes for the
    /// objects; the values are encoded from where the engine holds them. `None` if a value's
    /// type cannot be encoded.
    fn encode_contents<F: Flavor>(
        &self,
        flavor: impl FnOnce(&[SnapshotObjectRef<'_>]) -> F,
    ) -> Option<F::Output> {
        let tables = self.tables();
        self.engine
            .with_snapshot_objects(|objects| tables.encode(objects, flavor(objects)))
            .ok()
            .flatten()
    }

    /// What a snapshot holds besides the objects, as they are now.
    fn tables(&self) -> Tables {
        Tables {
            position: self.position,
            locks: self.locks.iter().map(|(n, o)| (n.clone(), *o)).collect(),
            runs: self.runs.iter().map(|(n, r)| (*n, *r)).collect(),
        }
    }
}

/// What a snapshot holds besides the objects: the position, the abstract locks, the runs.
struct Tables {
    position: u64,
    locks: Vec<(String, LockOwner)>,
    runs: Vec<(u64, u64)>,
}

impl Tables {
    /// The snapshot of `objects` and these tables, encoded into `flavor`.
    fn encode<F: Flavor>(&self, objects: &[SnapshotObjectRef<'_>], flavor: F) -> Option<F::Output> {
        let parts = SnapshotParts {
            position: self.position,
            objects,
            no_packed_locks: &[],
            no_packed_runs: &[FULL_WIDTH_FOLLOWS],
            locks: &self.locks,
            runs: &self.runs,
        };
        postcard::serialize_with_flavor(&parts, flavor).ok()
    }

    /// The snapshot of `objects` and these tables, in a buffer sized up front (each object's
    /// bytes, its key and a few varints): a state of any size is written once, never moved to
    /// a larger buffer as it grows. Empty bytes if a value's type cannot be encoded.
    fn encode_sized(&self, objects: &[SnapshotObjectRef<'_>]) -> Vec<u8> {
        let estimate: usize = objects
            .iter()
            .map(|(k, _, v)| k.as_bytes().len() + v.as_ref().map_or(0, |v| v.len()) + 32)
            .sum::<usize>()
            + self.locks.iter().map(|(n, _)| n.len() + 48).sum::<usize>()
            + self.runs.len() * 20
            + 64;
        self.encode(objects, ExtendFlavor::new(Vec::with_capacity(estimate)))
            .unwrap_or_default()
    }
}

impl ReplicatedStore {
    /// Takes abstract lock `name` for `owner` at `position`, unless another family holds it
    /// or `owner`'s run is gone: a request of a node's earlier run, ordered after that node
    /// restarted, is refused, as its family would hold the lock forever.
    fn lock(&mut self, owner: LockOwner, name: String, position: u64) -> Answer {
        let gone = self
            .runs
            .get(&owner.node)
            .is_some_and(|&run| run != owner.run);
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

    /// Releases those of `names` that `owner` holds.
    fn unlock(&mut self, owner: LockOwner, names: Vec<String>) {
        for n in names {
            if self.locks.get(&n) == Some(&owner) {
                self.locks.remove(&n);
            }
        }
    }

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
            Ok(Entry::Mark) => {
                self.engine.mark_applied(position);
                self.stats.barriers += 1;
                let seq = slot.map_or(0, |(seq, _)| seq);
                Answer::Marked { position, seq }
            }
            Ok(Entry::LockFor { owner, name }) => {
                self.engine.mark_applied(position);
                self.lock(owner, name, position)
            }
            Ok(Entry::Lock { owner, name }) => {
                self.engine.mark_applied(position);
                self.lock(LockOwner::from_packed(owner), name, position)
            }
            Ok(Entry::UnlockFor { owner, names }) => {
                self.engine.mark_applied(position);
                self.unlock(owner, names);
                Answer::Applied { position }
            }
            Ok(Entry::Unlock { owner, names }) => {
                self.engine.mark_applied(position);
                self.unlock(LockOwner::from_packed(owner), names);
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
                    if !executor.knows(&procedure) {
                        // Every replica must register the same procedures: one that has it
                        // runs it, this one cannot, and the stores part here.
                        self.alarms.push(format!(
                            "procedure {procedure:?} is not registered on this replica: \
                             replicas that have it ran it at log position {position}"
                        ));
                    }
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
            Ok(entry @ (Entry::Digest { .. } | Entry::ContentsDigest { .. })) => {
                self.engine.mark_applied(position);
                let digest = self.contents_digest();
                // An earlier build's entry reports an FNV-1a digest: nothing to compare it with.
                let reported = match entry {
                    Entry::ContentsDigest { reported } => reported,
                    _ => None,
                };
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
            Ok(Entry::ReleaseStaleRuns { node, keep } | Entry::ReleaseStale { node, keep }) => {
                self.engine.mark_applied(position);
                self.runs.insert(node, keep);
                self.locks.retain(|_, o| o.node != node || o.run == keep);
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

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.stats;
        let mut counters = vec![
            ("committed", s.committed),
            ("conflicts", s.conflicts),
            ("invoked", s.invoked),
            ("digests_compared", s.digests_compared),
            ("divergences", s.divergences),
        ];
        if let Some(e) = self.executor_stats() {
            counters.extend([
                ("speculated", e.speculated),
                ("confirmed", e.confirmed),
                ("rerun", e.rerun),
                ("speculations_revoked", e.revoked),
            ]);
        }
        counters
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
        let tables = self.tables();
        self.engine
            .with_snapshot_objects(|objects| tables.encode_sized(objects))
            .unwrap_or_default()
    }

    /// The objects at the current position, pinned in the engine (the applier goes on) and
    /// encoded by the job, as [`StateMachine::snapshot`] would have encoded them now.
    fn snapshot_later(&self) -> Option<SnapshotJob> {
        let tables = self.tables();
        let mut view = self.engine.pin();
        Some(Box::new(move || {
            view.with_objects(|objects| tables.encode_sized(objects))
                .unwrap_or_default()
        }))
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        self.restore_shared(&Bytes::copy_from_slice(data))
    }

    /// The values are installed as slices of `data`, not copied: the store and the replica's
    /// latest snapshot share one copy of the state.
    fn restore_shared(&mut self, data: &Bytes) -> Result<(), String> {
        let read = Snapshot::<BorrowedObject<'_>>::decode(data)?;
        let objects: Vec<SharedObject> = read
            .objects
            .into_iter()
            .map(|(k, v, b)| (k, v, b.map(|b| data.slice_ref(b))))
            .collect();
        if let Some(executor) = self.executor.as_mut() {
            // Speculation ran on the state being replaced.
            executor.revoke((0, 0));
        }
        self.graph = Reachability::of(&objects);
        self.engine.install_snapshot(read.position, objects);
        self.position = read.position;
        self.locks = read.locks.into_iter().collect();
        self.runs = read.runs.into_iter().collect();
        Ok(())
    }

    fn check_snapshot(&self, data: &[u8]) -> Result<(), String> {
        check_state(data)
    }
}

/// Whether `data` is a replicated store's state as a snapshot holds it (what a store restored
/// from it would take), checked without a store. Values are borrowed, not copied: a check
/// costs no second copy of the state.
pub fn check_state(data: &[u8]) -> Result<(), String> {
    Snapshot::<BorrowedObject<'_>>::decode(data).map(|_| ())
}

#[cfg(test)]
mod tests;
