//! Unbalanced binary search tree (HyflowCPP thesis 6.2.1.4): every node is a shared object.

use atomos::{Key, Node, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};

use super::set::IntSet;

/// A tree node.
#[derive(Clone, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.bst.Node")]
pub struct TreeNode {
    value: i64,
    left: Option<TRef<TreeNode>>,
    right: Option<TRef<TreeNode>>,
}

/// Where a node hangs: the root slot, or a child link of a parent.
#[derive(Clone, Copy)]
enum Link<'a> {
    Root,
    Child(&'a TRef<TreeNode>, bool),
}

/// The BST set. Nodes are named by their value; the root link is an object of its own.
pub struct Bst {
    prefix: String,
    root: TRef<Option<TRef<TreeNode>>>,
}

impl Bst {
    /// A tree whose objects are named under `prefix`.
    pub fn new(prefix: &str) -> Bst {
        Bst {
            prefix: prefix.to_string(),
            root: TRef::new(format!("{prefix}/root")),
        }
    }

    /// The link where `v` hangs or would hang, and its node if present.
    #[allow(clippy::type_complexity)]
    fn find<'a>(
        &'a self,
        tx: &'a Tx<'_>,
        v: i64,
    ) -> Result<(Link<'a>, Option<(&'a TRef<TreeNode>, &'a TreeNode)>), TxError> {
        let mut link = Link::Root;
        let mut cur = tx.read(&self.root)?.as_ref();
        while let Some(r) = cur {
            let n = tx.read(r)?;
            if n.value == v {
                return Ok((link, Some((r, n))));
            }
            let left = v < n.value;
            link = Link::Child(r, left);
            cur = if left {
                n.left.as_ref()
            } else {
                n.right.as_ref()
            };
        }
        Ok((link, None))
    }

    fn set_link(
        &self,
        tx: &Tx<'_>,
        link: Link<'_>,
        to: Option<TRef<TreeNode>>,
    ) -> Result<(), TxError> {
        match link {
            Link::Root => tx.write(&self.root, to),
            Link::Child(r, true) => tx.modify(r, |n| n.left = to),
            Link::Child(r, false) => tx.modify(r, |n| n.right = to),
        }
    }
}

impl IntSet for Bst {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        node.atomically(|tx| tx.create(&self.root, None))
    }

    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically_read(|tx| Ok(self.find(tx, v)?.1.is_some()))
    }

    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (link, found) = self.find(tx, v)?;
            if found.is_some() {
                return Ok(false);
            }
            let r: TRef<TreeNode> = TRef::new(Key::with_index(&self.prefix, v as u64));
            tx.create(
                &r,
                TreeNode {
                    value: v,
                    left: None,
                    right: None,
                },
            )?;
            self.set_link(tx, link, Some(r))?;
            Ok(true)
        })
    }

    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (link, Some((r, n))) = self.find(tx, v)? else {
                return Ok(false);
            };
            match (&n.left, &n.right) {
                (None, right) => self.set_link(tx, link, right.clone())?,
                (left, None) => self.set_link(tx, link, left.clone())?,
                (Some(left), Some(right)) => {
                    // Splice in the successor: the leftmost node of the right subtree.
                    let mut succ_parent: Option<&TRef<TreeNode>> = None;
                    let mut succ_ref = right;
                    let mut succ = tx.read(right)?;
                    while let Some(l) = &succ.left {
                        succ_parent = Some(succ_ref);
                        succ_ref = l;
                        succ = tx.read(l)?;
                    }
                    let (left, right) = (left.clone(), right.clone());
                    match succ_parent {
                        None => tx.modify(succ_ref, |s| s.left = Some(left))?,
                        Some(p) => {
                            let succ_right = succ.right.clone();
                            tx.modify(p, |p| p.left = succ_right)?;
                            tx.modify(succ_ref, |s| {
                                s.left = Some(left);
                                s.right = Some(right);
                            })?;
                        }
                    }
                    self.set_link(tx, link, Some(succ_ref.clone()))?;
                }
            }
            tx.delete(r)?;
            Ok(true)
        })
    }

    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError> {
        node.atomically_read(|tx| {
            // In-order walk that also checks every node lies within its ancestors' bounds.
            let mut out = Vec::new();
            let mut stack: Vec<(TRef<TreeNode>, i64, i64, bool)> = Vec::new();
            if let Some(r) = tx.read(&self.root)? {
                stack.push((r.clone(), i64::MIN, i64::MAX, false));
            }
            while let Some((r, lo, hi, visited)) = stack.pop() {
                let n = tx.read(&r)?;
                if !(lo < n.value && n.value < hi) {
                    return Ok(Err(format!("node {} breaks the search order", n.value)));
                }
                if visited {
                    out.push(n.value);
                    continue;
                }
                if let Some(rr) = &n.right {
                    stack.push((rr.clone(), n.value, hi, false));
                }
                stack.push((r.clone(), lo, hi, true));
                if let Some(l) = &n.left {
                    stack.push((l.clone(), lo, n.value, false));
                }
            }
            Ok(Ok(out))
        })
    }
}
