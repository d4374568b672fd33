//! Sorted singly linked list (HyflowCPP thesis 6.2.1.2): every node is a shared object.

use atomos::{Key, Node, TRef, Tx, TxError};
use serde::{Deserialize, Serialize};

use super::set::IntSet;

/// A list node; the head sentinel holds `i64::MIN`.
#[derive(Clone, Serialize, Deserialize, atomos::Object)]
#[atomos(name = "bench.linkedlist.Node")]
pub struct ListNode {
    value: i64,
    next: Option<TRef<ListNode>>,
}

/// The linked-list set. Nodes are named by their value.
pub struct LinkedList {
    prefix: String,
    head: TRef<ListNode>,
}

impl LinkedList {
    /// A list whose objects are named under `prefix`.
    pub fn new(prefix: &str) -> LinkedList {
        LinkedList {
            prefix: prefix.to_string(),
            head: TRef::new(format!("{prefix}/head")),
        }
    }

    fn node_ref(&self, v: i64) -> TRef<ListNode> {
        TRef::new(Key::with_index(&self.prefix, v as u64))
    }

    /// The last node with a value below `v` (with the reference that names it) and the node
    /// after it. References are borrowed, not cloned, so traversals write no shared counters.
    fn find<'a>(
        &'a self,
        tx: &'a Tx<'_>,
        v: i64,
    ) -> Result<(&'a TRef<ListNode>, &'a ListNode, Option<&'a ListNode>), TxError> {
        let mut prev_ref = &self.head;
        let mut prev = tx.read(prev_ref)?;
        while let Some(r) = &prev.next {
            let cur = tx.read(r)?;
            if cur.value >= v {
                return Ok((prev_ref, prev, Some(cur)));
            }
            prev_ref = r;
            prev = cur;
        }
        Ok((prev_ref, prev, None))
    }
}

impl IntSet for LinkedList {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        node.atomically(|tx| {
            tx.create(
                &self.head,
                ListNode {
                    value: i64::MIN,
                    next: None,
                },
            )
        })
    }

    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically_read(|tx| Ok(self.find(tx, v)?.2.is_some_and(|c| c.value == v)))
    }

    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (prev_ref, prev, cur) = self.find(tx, v)?;
            if cur.is_some_and(|c| c.value == v) {
                return Ok(false);
            }
            let next = prev.next.clone();
            let new_ref = self.node_ref(v);
            tx.create(&new_ref, ListNode { value: v, next })?;
            tx.modify(prev_ref, |p| p.next = Some(new_ref.clone()))?;
            Ok(true)
        })
    }

    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically(|tx| {
            let (prev_ref, prev, cur) = self.find(tx, v)?;
            let (Some(cur), Some(cur_ref)) = (cur.filter(|c| c.value == v), prev.next.as_ref())
            else {
                return Ok(false);
            };
            let after = cur.next.clone();
            tx.modify(prev_ref, |p| p.next = after)?;
            tx.delete(cur_ref)?;
            Ok(true)
        })
    }

    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError> {
        node.atomically_read(|tx| {
            let mut out = Vec::new();
            let mut cur = tx.read(&self.head)?.next.clone();
            while let Some(r) = cur {
                let n = tx.read(&r)?;
                out.push(n.value);
                cur = n.next.clone();
            }
            Ok(Ok(out))
        })
    }
}
