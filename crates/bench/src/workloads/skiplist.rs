//! Skip list (HyflowCPP thesis 6.2.1.3): every node is a shared object with one link per level.

use atomos::{Key, Node, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};

use super::set::IntSet;

/// A skip-list node; the head sentinel holds `i64::MIN` and every level.
#[derive(Clone, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.skiplist.Node")]
pub struct SkipNode {
    value: i64,
    next: Vec<Option<TRef<SkipNode>>>,
}

/// The skip-list set. A value's level is derived from its hash (geometric, p = 1/2), so the
/// shape is reproducible.
pub struct SkipList {
    prefix: String,
    head: TRef<SkipNode>,
    levels: usize,
}

impl SkipList {
    /// A skip list for values in `0..range`, objects named under `prefix`.
    pub fn new(prefix: &str, range: usize) -> SkipList {
        let levels = (usize::BITS - range.max(2).leading_zeros()) as usize;
        SkipList {
            prefix: prefix.to_string(),
            head: TRef::new(format!("{prefix}/head")),
            levels: levels.clamp(1, 32),
        }
    }

    fn level_of(&self, v: i64) -> usize {
        let h = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h >> 20).trailing_zeros() as usize + 1).min(self.levels)
    }

    /// For each level, the last node below `v` (its reference and value).
    fn preds<'a>(
        &'a self,
        tx: &'a Tx<'_>,
        v: i64,
    ) -> Result<Vec<(&'a TRef<SkipNode>, &'a SkipNode)>, TxError> {
        let mut preds = vec![(&self.head, tx.read(&self.head)?); self.levels];
        let (mut pred_ref, mut pred) = preds[0];
        for lvl in (0..self.levels).rev() {
            while let Some(r) = &pred.next[lvl] {
                let n = tx.read(r)?;
                if n.value >= v {
                    break;
                }
                pred_ref = r;
                pred = n;
            }
            preds[lvl] = (pred_ref, pred);
        }
        Ok(preds)
    }
}

impl IntSet for SkipList {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        node.atomically(|tx| {
            tx.create(
                &self.head,
                SkipNode {
                    value: i64::MIN,
                    next: vec![None; self.levels],
                },
            )
        })
    }

    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically_read(|tx| {
            let mut pred = tx.read(&self.head)?;
            for lvl in (0..self.levels).rev() {
                while let Some(r) = &pred.next[lvl] {
                    let n = tx.read(r)?;
                    if n.value > v {
                        break;
                    }
                    if n.value == v {
                        return Ok(true);
                    }
                    pred = n;
                }
            }
            Ok(false)
        })
    }

    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let preds = self.preds(tx, v)?;
            if let Some(r) = &preds[0].1.next[0] {
                if tx.read(r)?.value == v {
                    return Ok(false);
                }
            }
            let level = self.level_of(v);
            let new_ref: TRef<SkipNode> = TRef::new(Key::with_index(&self.prefix, v as u64));
            let next = (0..level).map(|l| preds[l].1.next[l].clone()).collect();
            tx.create(&new_ref, SkipNode { value: v, next })?;
            for (l, (pred_ref, _)) in preds.iter().enumerate().take(level) {
                tx.modify(*pred_ref, |p| p.next[l] = Some(new_ref.clone()))?;
            }
            Ok(true)
        })
    }

    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let preds = self.preds(tx, v)?;
            let Some(victim_ref) = &preds[0].1.next[0] else {
                return Ok(false);
            };
            let victim = tx.read(victim_ref)?;
            if victim.value != v {
                return Ok(false);
            }
            for (l, (pred_ref, _)) in preds.iter().enumerate().take(victim.next.len()) {
                let after = victim.next[l].clone();
                tx.modify(*pred_ref, |p| p.next[l] = after)?;
            }
            tx.delete(victim_ref)?;
            Ok(true)
        })
    }

    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError> {
        node.atomically_read(|tx| {
            let mut out = Vec::new();
            let mut cur = tx.read(&self.head)?.next[0].clone();
            while let Some(r) = cur {
                let n = tx.read(&r)?;
                if n.next.len() != self.level_of(n.value) {
                    return Ok(Err(format!("node {} has {} levels", n.value, n.next.len())));
                }
                out.push(n.value);
                cur = n.next[0].clone();
            }
            // Every upper level must be an ordered sub-list of the bottom one.
            for lvl in 1..self.levels {
                let mut cur = tx.read(&self.head)?.next[lvl].clone();
                let mut last = i64::MIN;
                while let Some(r) = cur {
                    let n = tx.read(&r)?;
                    if n.value <= last || out.binary_search(&n.value).is_err() {
                        return Ok(Err(format!("level {lvl} is not an ordered sub-list")));
                    }
                    last = n.value;
                    cur = n.next[lvl].clone();
                }
            }
            Ok(Ok(out))
        })
    }
}
