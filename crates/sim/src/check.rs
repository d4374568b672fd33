//! Checks every protocol's simulation shares: that a planted bug is caught, that replicas agree
//! on what they hold at each position, and that the survivors of a run converged.
//!
//! Each check returns `Err` with a sentence naming the nodes and the position involved, in the
//! form the simulation tests report a failing seed in.

use std::collections::BTreeMap;
use std::fmt::Debug;

use crate::NodeId;

/// Runs `check` on seeds `0..count` until one fails and returns that seed with its reason;
/// panics, naming `bug`, when every seed passes. The seeds are the plain range, whatever
/// [`SEED_VAR`](crate::SEED_VAR) says: a planted bug's test proves the simulation can see it,
/// so the seeds it is allowed are fixed.
pub fn first_caught(
    bug: &str,
    count: u64,
    mut check: impl FnMut(u64) -> Result<(), String>,
) -> (u64, String) {
    for seed in 0..count {
        if let Err(reason) = check(seed) {
            println!("{bug}: caught by seed {seed} of {count}: {reason}");
            return (seed, reason);
        }
    }
    panic!("{bug} went unnoticed in {count} seeds");
}

/// What the nodes of a run reported at each position (an entry, a commit id, a log index):
/// the first report of a position stands, and a later one that differs is a divergence.
#[derive(Debug)]
pub struct Agreement<P, V> {
    what: &'static str,
    seen: BTreeMap<P, (NodeId, V)>,
}

impl<P: Ord + Debug, V: PartialEq + Debug> Agreement<P, V> {
    /// Nothing seen yet; `what` names the reported thing in errors ("objects", "requests").
    pub fn new(what: &'static str) -> Agreement<P, V> {
        Agreement {
            what,
            seen: BTreeMap::new(),
        }
    }

    /// Records that `node` reported `value` at `position`. `Err` when another node reported
    /// something else there.
    pub fn see(&mut self, node: NodeId, position: P, value: V) -> Result<(), String> {
        match self.seen.get(&position) {
            Some((first, v)) if *v != value => Err(format!(
                "{} at position {position:?} differ between nodes {first} and {node}: {v:?} \
                 there, {value:?} here",
                self.what
            )),
            Some(_) => Ok(()),
            None => {
                self.seen.insert(position, (node, value));
                Ok(())
            }
        }
    }

    /// What was reported at `position`, if anything.
    pub fn get(&self, position: &P) -> Option<&V> {
        self.seen.get(position).map(|(_, v)| v)
    }

    /// How many positions were reported.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether nothing was reported.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// Every position and what was reported there, in position order.
    pub fn into_values(self) -> BTreeMap<P, V> {
        self.seen.into_iter().map(|(p, (_, v))| (p, v)).collect()
    }
}

/// `Ok` when every node's final `state` equals the first's; else the first node that differs.
/// `what` names the state in the error ("objects").
pub fn converged<'a, T: PartialEq + 'a>(
    what: &str,
    finals: impl IntoIterator<Item = (NodeId, &'a T)>,
) -> Result<(), String> {
    let mut finals = finals.into_iter();
    let Some((first, state)) = finals.next() else {
        return Ok(());
    };
    match finals.find(|(_, other)| *other != state) {
        Some((node, _)) => Err(format!(
            "nodes {first} and {node} ended with different {what}"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_report_of_a_position_stands_and_a_different_one_is_an_error() {
        let mut a = Agreement::new("requests");
        a.see(1, 5u64, "x").unwrap();
        a.see(2, 5, "x").unwrap();
        a.see(2, 6, "y").unwrap();
        let e = a.see(3, 5, "z").unwrap_err();
        assert!(
            e.contains("position 5") && e.contains("nodes 1 and 3"),
            "{e}"
        );
        assert_eq!(a.get(&5), Some(&"x"), "the first report stands");
        assert_eq!(a.len(), 2);
        assert_eq!(
            a.into_values().into_values().collect::<Vec<_>>(),
            ["x", "y"]
        );
    }

    #[test]
    fn convergence_names_the_first_node_that_differs() {
        let states = [(1, 7), (2, 7), (3, 8), (4, 9)];
        let e = converged("objects", states.iter().map(|(n, s)| (*n, s))).unwrap_err();
        assert_eq!(e, "nodes 1 and 3 ended with different objects");
        assert!(converged("objects", states[..2].iter().map(|(n, s)| (*n, s))).is_ok());
        assert!(converged::<u8>("objects", []).is_ok());
    }

    #[test]
    fn a_planted_bug_is_caught_by_its_first_failing_seed() {
        let (seed, why) = first_caught("bug", 10, |s| {
            if s >= 3 {
                Err(format!("at {s}"))
            } else {
                Ok(())
            }
        });
        assert_eq!((seed, why.as_str()), (3, "at 3"));
        let missed = std::panic::catch_unwind(|| first_caught("bug", 4, |_| Ok(())));
        assert!(missed.is_err(), "a bug no seed shows is a failure");
    }
}
