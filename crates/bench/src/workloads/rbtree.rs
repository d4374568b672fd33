//! Red-black tree set: a balanced binary search tree with the shape of STAMP's and TinySTM's
//! `rbtree` (Cormen et al.'s insertion and deletion), every node a shared object. Nodes keep no
//! parent links: an update rebalances along the path its search took, so it writes only the
//! nodes it recolours or rotates.

use atomos::{Key, Node, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};

use super::set::IntSet;

/// The longest path of a red-black tree of up to 2^32 nodes (twice the log).
const PATH_CAPACITY: usize = 64;

/// A tree node.
#[derive(Clone, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.rbtree.Node")]
pub struct RbNode {
    value: i64,
    red: bool,
    left: Option<TRef<RbNode>>,
    right: Option<TRef<RbNode>>,
}

type NodeRef = TRef<RbNode>;

/// The child of `n` on the left (`left`) or right side.
fn child(n: &RbNode, left: bool) -> Option<&NodeRef> {
    if left {
        n.left.as_ref()
    } else {
        n.right.as_ref()
    }
}

fn set_child(n: &mut RbNode, left: bool, to: Option<NodeRef>) {
    if left {
        n.left = to;
    } else {
        n.right = to;
    }
}

/// The error for a link the tree's shape guarantees but the node lacks (a bug, never a race:
/// a transaction reads a consistent snapshot).
fn broken(at: &NodeRef) -> TxError {
    TxError::NotFound {
        key: at.key().clone(),
    }
}

/// The red-black tree set. Nodes are named by their value; the root link is an object of its
/// own.
pub struct RbTree {
    prefix: String,
    root: TRef<Option<NodeRef>>,
}

impl RbTree {
    /// A tree whose objects are named under `prefix`.
    pub fn new(prefix: &str) -> RbTree {
        RbTree {
            prefix: prefix.to_string(),
            root: TRef::new(format!("{prefix}/root")),
        }
    }

    /// The nodes from the root down to where `v` is or would hang (its parent last), and the
    /// node holding `v` if present.
    fn search(&self, tx: &Tx<'_>, v: i64) -> Result<(Vec<NodeRef>, Option<NodeRef>), TxError> {
        // Room for the path of any tree of up to 2^32 nodes: no regrowth on the update path.
        let mut path = Vec::with_capacity(PATH_CAPACITY);
        // Read through the links themselves (not clones), so that each remembers its cell.
        let mut cur = tx.read(&self.root)?.as_ref();
        while let Some(r) = cur {
            let n = tx.read(r)?;
            if n.value == v {
                return Ok((path, Some(r.clone())));
            }
            cur = child(n, v < n.value);
            path.push(r.clone());
        }
        Ok((path, None))
    }
}

/// The rebalancing steps of one update transaction.
struct Edit<'a, 't> {
    tx: &'a Tx<'t>,
    root: &'a TRef<Option<NodeRef>>,
}

impl Edit<'_, '_> {
    fn node(&self, r: &NodeRef) -> Result<&RbNode, TxError> {
        self.tx.read(r)
    }

    /// Whether `r` is red (a missing child is black).
    fn is_red(&self, r: Option<&NodeRef>) -> Result<bool, TxError> {
        Ok(match r {
            Some(r) => self.node(r)?.red,
            None => false,
        })
    }

    /// Colours `r`, writing it only if its colour changes.
    fn paint(&self, r: &NodeRef, red: bool) -> Result<(), TxError> {
        if self.node(r)?.red != red {
            self.tx.modify(r, |n| n.red = red)?;
        }
        Ok(())
    }

    /// Makes `new` hang where `old` hangs under `parent` (the root link if none).
    fn replace(
        &self,
        parent: Option<&NodeRef>,
        old: &NodeRef,
        new: Option<NodeRef>,
    ) -> Result<(), TxError> {
        match parent {
            None => self.tx.write(self.root, new),
            Some(p) => {
                let left = self.node(p)?.left.as_ref() == Some(old);
                self.tx.modify(p, |n| set_child(n, left, new))
            }
        }
    }

    /// Rotates `x` (a child of `parent`) down to its `left` side, or to its right: its child on
    /// the other side takes its place, and is returned.
    fn rotate(
        &self,
        parent: Option<&NodeRef>,
        x: &NodeRef,
        left: bool,
    ) -> Result<NodeRef, TxError> {
        let y = child(self.node(x)?, !left)
            .cloned()
            .ok_or_else(|| broken(x))?;
        let inner = child(self.node(&y)?, left).cloned();
        self.tx.modify(x, |n| set_child(n, !left, inner))?;
        self.tx
            .modify(&y, |n| set_child(n, left, Some(x.clone())))?;
        self.replace(parent, x, Some(y.clone()))?;
        Ok(y)
    }

    /// Restores the colour rules after `z` was hung, red, below `path` (the root first).
    fn after_insert(&self, mut path: Vec<NodeRef>, mut z: NodeRef) -> Result<(), TxError> {
        while let Some(p) = path.last().cloned() {
            if !self.is_red(Some(&p))? {
                break;
            }
            // A red parent is not the root, so the grandparent exists.
            let Some(g) = path.get(path.len().wrapping_sub(2)).cloned() else {
                break;
            };
            let p_left = self.node(&g)?.left.as_ref() == Some(&p);
            let uncle = child(self.node(&g)?, !p_left).cloned();
            if self.is_red(uncle.as_ref())? {
                self.paint(&p, false)?;
                if let Some(u) = &uncle {
                    self.paint(u, false)?;
                }
                self.paint(&g, true)?;
                z = g;
                path.truncate(path.len() - 2);
                continue;
            }
            let mut p = p;
            if child(self.node(&p)?, !p_left) == Some(&z) {
                // `z` is an inner grandchild: turn it into an outer one.
                self.rotate(Some(&g), &p, p_left)?;
                p = z.clone();
            }
            self.paint(&p, false)?;
            self.paint(&g, true)?;
            let above = path.get(path.len().wrapping_sub(3));
            self.rotate(above, &g, !p_left)?;
            break;
        }
        self.blacken_root()
    }

    /// Restores the colour rules after a black node was taken out: `x` (perhaps no node) carries
    /// an extra black; `path` runs from the root to its parent.
    fn after_remove(&self, mut path: Vec<NodeRef>, mut x: Option<NodeRef>) -> Result<(), TxError> {
        while let Some(xp) = path.last().cloned() {
            if self.is_red(x.as_ref())? {
                break;
            }
            // A missing `x` is on the side whose link is missing: its sibling carries the
            // black height `x` lost, so it is a node.
            let x_left = self.node(&xp)?.left.as_ref() == x.as_ref();
            let mut w = child(self.node(&xp)?, !x_left)
                .cloned()
                .ok_or_else(|| broken(&xp))?;
            if self.is_red(Some(&w))? {
                self.paint(&w, false)?;
                self.paint(&xp, true)?;
                let above = path.get(path.len().wrapping_sub(2));
                let top = self.rotate(above, &xp, x_left)?;
                path.insert(path.len() - 1, top);
                w = child(self.node(&xp)?, !x_left)
                    .cloned()
                    .ok_or_else(|| broken(&xp))?;
            }
            let (near, far) = {
                let wn = self.node(&w)?;
                (child(wn, x_left).cloned(), child(wn, !x_left).cloned())
            };
            if !self.is_red(near.as_ref())? && !self.is_red(far.as_ref())? {
                self.paint(&w, true)?;
                x = path.pop();
                continue;
            }
            if !self.is_red(far.as_ref())? {
                if let Some(near) = &near {
                    self.paint(near, false)?;
                }
                self.paint(&w, true)?;
                w = self.rotate(Some(&xp), &w, !x_left)?;
            }
            self.paint(&w, self.node(&xp)?.red)?;
            self.paint(&xp, false)?;
            if let Some(far) = child(self.node(&w)?, !x_left).cloned() {
                self.paint(&far, false)?;
            }
            let above = path.get(path.len().wrapping_sub(2));
            self.rotate(above, &xp, x_left)?;
            x = None;
            break;
        }
        if let Some(x) = &x {
            self.paint(x, false)?;
        }
        self.blacken_root()
    }

    fn blacken_root(&self) -> Result<(), TxError> {
        match self.tx.read(self.root)? {
            Some(r) => self.paint(r, false),
            None => Ok(()),
        }
    }
}

/// What `check` found below a node: its black height, or what is wrong.
type Checked = Result<usize, String>;

/// How deep a well-formed tree of up to 2^63 nodes can be.
const MAX_DEPTH: usize = 128;

/// Checks the subtree at `r` (values strictly between `lo` and `hi`, below a node of colour
/// `parent_red`) and appends its values in order.
fn check(
    tx: &Tx<'_>,
    r: Option<&NodeRef>,
    (lo, hi): (i64, i64),
    parent_red: bool,
    depth: usize,
    out: &mut Vec<i64>,
) -> Result<Checked, TxError> {
    let Some(r) = r else {
        return Ok(Ok(1));
    };
    if depth > MAX_DEPTH {
        return Ok(Err(format!("deeper than {MAX_DEPTH} levels")));
    }
    let n = tx.read(r)?;
    if !(lo < n.value && n.value < hi) {
        return Ok(Err(format!("node {} breaks the search order", n.value)));
    }
    if parent_red && n.red {
        return Ok(Err(format!("red node {} has a red parent", n.value)));
    }
    let left = match check(tx, n.left.as_ref(), (lo, n.value), n.red, depth + 1, out)? {
        Ok(h) => h,
        bad => return Ok(bad),
    };
    out.push(n.value);
    let right = match check(tx, n.right.as_ref(), (n.value, hi), n.red, depth + 1, out)? {
        Ok(h) => h,
        bad => return Ok(bad),
    };
    if left != right {
        return Ok(Err(format!(
            "node {} has black heights {left} and {right}",
            n.value
        )));
    }
    Ok(Ok(left + usize::from(!n.red)))
}

impl IntSet for RbTree {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        node.atomically(|tx| tx.create(&self.root, None))
    }

    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically_read(|tx| {
            let mut cur = tx.read(&self.root)?.as_ref();
            while let Some(r) = cur {
                let n = tx.read(r)?;
                if n.value == v {
                    return Ok(true);
                }
                cur = child(n, v < n.value);
            }
            Ok(false)
        })
    }

    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (path, found) = self.search(tx, v)?;
            if found.is_some() {
                return Ok(false);
            }
            let z: NodeRef = TRef::new(Key::with_index(&self.prefix, v as u64));
            tx.create(
                &z,
                RbNode {
                    value: v,
                    red: true,
                    left: None,
                    right: None,
                },
            )?;
            let edit = Edit {
                tx,
                root: &self.root,
            };
            match path.last() {
                None => tx.write(&self.root, Some(z.clone()))?,
                Some(p) => {
                    let left = v < edit.node(p)?.value;
                    tx.modify(p, |n| set_child(n, left, Some(z.clone())))?;
                }
            }
            edit.after_insert(path, z)?;
            Ok(true)
        })
    }

    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (mut path, Some(z)) = self.search(tx, v)? else {
                return Ok(false);
            };
            let edit = Edit {
                tx,
                root: &self.root,
            };
            let zn = edit.node(&z)?.clone();
            let (removed_black, x) = match (&zn.left, &zn.right) {
                (None, only) | (only, None) => {
                    edit.replace(path.last(), &z, only.clone())?;
                    (!zn.red, only.clone())
                }
                (Some(left), Some(right)) => {
                    // The successor `y`, the leftmost node on the right, takes `z`'s place and
                    // colour; its own right child `x` takes `y`'s place.
                    let mut below = Vec::new();
                    let mut y = right.clone();
                    while let Some(l) = edit.node(&y)?.left.clone() {
                        below.push(y);
                        y = l;
                    }
                    let yn = edit.node(&y)?;
                    let (removed_black, x) = (!yn.red, yn.right.clone());
                    if let Some(y_parent) = below.last() {
                        edit.replace(Some(y_parent), &y, x.clone())?;
                        let right = right.clone();
                        tx.modify(&y, |n| n.right = Some(right))?;
                    }
                    edit.replace(path.last(), &z, Some(y.clone()))?;
                    let (left, red) = (left.clone(), zn.red);
                    tx.modify(&y, |n| {
                        n.left = Some(left);
                        n.red = red;
                    })?;
                    path.push(y);
                    path.extend(below);
                    (removed_black, x)
                }
            };
            tx.delete(&z)?;
            if removed_black {
                edit.after_remove(path, x)?;
            }
            Ok(true)
        })
    }

    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError> {
        node.atomically_read(|tx| {
            let mut out = Vec::new();
            let root = tx.read(&self.root)?.as_ref();
            if let Some(r) = root {
                if tx.read(r)?.red {
                    return Ok(Err("the root is red".into()));
                }
            }
            Ok(check(tx, root, (i64::MIN, i64::MAX), false, 0, &mut out)?.map(|_| out))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeSet;

    /// Random adds and removes on one thread against a `BTreeSet`; the colour rules are checked
    /// after every update, and the depth stays within a red-black tree's bound.
    #[test]
    fn random_updates_keep_the_colour_rules_and_the_contents() {
        let node = Node::local();
        let tree = RbTree::new("rb");
        tree.init(&node).unwrap();
        let mut model = BTreeSet::new();
        let mut rng = SmallRng::seed_from_u64(5);
        for step in 0..3_000 {
            let v = rng.random_range(0..300);
            if rng.random_bool(0.55) {
                assert_eq!(tree.add(&node, v).unwrap(), model.insert(v), "add {v}");
            } else {
                assert_eq!(
                    tree.remove(&node, v).unwrap(),
                    model.remove(&v),
                    "remove {v}"
                );
            }
            let got = tree.elements(&node).unwrap();
            let want: Vec<i64> = model.iter().copied().collect();
            assert_eq!(got, Ok(want), "after step {step}");
            assert_eq!(tree.contains(&node, v).unwrap(), model.contains(&v));
        }
        assert!(!model.is_empty());
    }

    /// Ascending inserts, the worst case of an unbalanced tree, stay logarithmic: the check
    /// fails on unequal black heights, which bound the depth at twice the log.
    #[test]
    fn ascending_inserts_stay_balanced() {
        let node = Node::local();
        let tree = RbTree::new("rb");
        tree.init(&node).unwrap();
        for v in 0..1_000 {
            assert!(tree.add(&node, v).unwrap());
        }
        assert_eq!(tree.elements(&node).unwrap(), Ok((0..1_000).collect()));
        for v in (0..1_000).step_by(2) {
            assert!(tree.remove(&node, v).unwrap());
        }
        assert_eq!(
            tree.elements(&node).unwrap(),
            Ok((0..1_000).filter(|v| v % 2 == 1).collect())
        );
    }

    /// The check notices a broken colour rule (so the tests above can fail).
    #[test]
    fn the_check_notices_a_red_root_and_unequal_black_heights() {
        let node = Node::local();
        let tree = RbTree::new("rb");
        tree.init(&node).unwrap();
        for v in [10, 5, 15] {
            tree.add(&node, v).unwrap();
        }
        let root = node
            .atomically(|tx| Ok(tx.read(&tree.root)?.clone()))
            .unwrap()
            .unwrap();
        node.atomically(|tx| tx.modify(&root, |n| n.red = true))
            .unwrap();
        assert!(tree.elements(&node).unwrap().is_err());
        node.atomically(|tx| tx.modify(&root, |n| n.red = false))
            .unwrap();
        let five: NodeRef = TRef::new(Key::with_index("rb", 5));
        node.atomically(|tx| tx.modify(&five, |n| n.red = false))
            .unwrap();
        node.atomically(|tx| {
            let fifteen: NodeRef = TRef::new(Key::with_index("rb", 15));
            tx.modify(&fifteen, |n| n.red = true)
        })
        .unwrap();
        let err = tree.elements(&node).unwrap().unwrap_err();
        assert!(err.contains("black heights"), "{err}");
    }
}
