//! Distributed garbage collection (Paxos STM): which anonymous objects nothing named reaches.
//!
//! Every object whose key is not anonymous is a root. Values carry the keys of the objects
//! they reference (collected while they were serialized: `atomos_core::value_refs`), so the
//! store keeps, in log order, the reference graph of the newest versions. A collection entry
//! in the log computes the anonymous objects unreachable from the roots at its position; every
//! replica deletes the same ones there, so they stay identical.
//!
//! A running transaction that holds a reference to a collected object learned it by reading
//! an object that referenced it, whose version has changed since (or it is collected too): its
//! certification fails and it re-runs. References kept outside transactions (in local
//! variables between transactions) do not keep objects alive.

use std::collections::BTreeSet;

use atomos_core::{value_refs, Key};
use rustc_hash::{FxHashMap, FxHashSet};

/// What a write means for the graph: its key, whether the object exists, what it references.
pub(crate) struct Write {
    key: Key,
    present: bool,
    refs: Vec<Key>,
}

impl Write {
    /// The write of `value` (`None`: a deletion) to `key`.
    pub(crate) fn of(key: &Key, value: Option<&[u8]>) -> Write {
        Write {
            key: key.clone(),
            present: value.is_some(),
            refs: value.and_then(value_refs).unwrap_or_default(),
        }
    }
}

/// The reference graph of the newest versions.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    /// Objects whose newest value references others, with those keys.
    refs: FxHashMap<Key, Vec<Key>>,
    /// Anonymous objects that exist.
    anonymous: BTreeSet<Key>,
    /// Something that can make garbage changed since the last collection.
    dirty: bool,
}

impl Reachability {
    /// The graph of a snapshot's objects.
    pub(crate) fn of<V: AsRef<[u8]>>(objects: &[(Key, u64, Option<V>)]) -> Reachability {
        let mut r = Reachability::default();
        for (key, _, bytes) in objects {
            r.note(Write::of(key, bytes.as_ref().map(AsRef::as_ref)));
        }
        r
    }

    /// A write became the newest version of its object.
    pub(crate) fn note(&mut self, w: Write) {
        let graph_changed = if w.refs.is_empty() {
            self.refs.remove(&w.key).is_some()
        } else {
            self.refs.insert(w.key.clone(), w.refs);
            true
        };
        if w.key.is_anonymous() {
            if w.present {
                self.anonymous.insert(w.key);
            } else {
                self.anonymous.remove(&w.key);
            }
            self.dirty = true;
        } else if graph_changed {
            self.dirty = true;
        }
    }

    /// The anonymous objects no root reaches, sorted; `None` if nothing changed since the
    /// last collection (so there is none).
    pub(crate) fn garbage(&mut self) -> Option<Vec<Key>> {
        if !std::mem::take(&mut self.dirty) {
            return None;
        }
        let mut reached: FxHashSet<&Key> = FxHashSet::default();
        let mut todo: Vec<&Key> = self
            .refs
            .iter()
            .filter(|(k, _)| !k.is_anonymous())
            .flat_map(|(_, refs)| refs.iter())
            .collect();
        while let Some(k) = todo.pop() {
            if k.is_anonymous() && reached.insert(k) {
                if let Some(next) = self.refs.get(k) {
                    todo.extend(next.iter());
                }
            }
        }
        Some(
            self.anonymous
                .iter()
                .filter(|k| !reached.contains(k))
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(n: u64) -> Key {
        Key::anonymous(1, n)
    }

    #[test]
    fn only_what_no_root_reaches_is_garbage() {
        let mut r = Reachability::default();
        let link = |r: &mut Reachability, from: Key, to: Vec<Key>| {
            r.note(Write {
                key: from,
                present: true,
                refs: to,
            })
        };
        // root -> a1 -> a2 -> a3, a4 alone, a5 <-> a6 in a cycle.
        link(&mut r, Key::from("root"), vec![anon(1)]);
        link(&mut r, anon(1), vec![anon(2)]);
        link(&mut r, anon(2), vec![anon(3)]);
        link(&mut r, anon(3), vec![]);
        link(&mut r, anon(4), vec![]);
        link(&mut r, anon(5), vec![anon(6)]);
        link(&mut r, anon(6), vec![anon(5)]);
        assert_eq!(r.garbage(), Some(vec![anon(4), anon(5), anon(6)]));
        assert_eq!(r.garbage(), None, "nothing changed since");
        // Cut a1 -> a2: a2 and a3 go too.
        link(&mut r, anon(1), vec![]);
        let g = r.garbage().unwrap();
        assert!(g.contains(&anon(2)) && g.contains(&anon(3)) && !g.contains(&anon(1)));
    }
}
