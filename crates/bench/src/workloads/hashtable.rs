//! Bucketed hash table (HyflowCPP thesis 6.2.1.5): each bucket is a shared object.

use atomos::{Key, Node, TRef, TxError};

use super::set::IntSet;

/// The hash-table set: `buckets` objects, each a small vector of values.
pub struct HashTable {
    buckets: Vec<TRef<Vec<i64>>>,
}

impl HashTable {
    /// A table of `buckets` buckets named under `prefix`.
    pub fn new(prefix: &str, buckets: usize) -> HashTable {
        HashTable {
            buckets: (0..buckets.max(1) as u64)
                .map(|i| TRef::new(Key::with_index(prefix, i)))
                .collect(),
        }
    }

    fn bucket(&self, v: i64) -> &TRef<Vec<i64>> {
        // Fibonacci hashing spreads neighbouring values over buckets.
        let h = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
        &self.buckets[(h % self.buckets.len() as u64) as usize]
    }
}

impl IntSet for HashTable {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        for chunk in self.buckets.chunks(1024) {
            node.atomically(|tx| {
                for b in chunk {
                    tx.create(b, Vec::new())?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn contains(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        node.atomically_read(|tx| Ok(tx.read(self.bucket(v))?.contains(&v)))
    }

    fn add(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        let b = self.bucket(v);
        node.atomically(|tx| {
            if tx.read(b)?.contains(&v) {
                return Ok(false);
            }
            tx.modify(b, |vals| vals.push(v))?;
            Ok(true)
        })
    }

    fn remove(&self, node: &Node, v: i64) -> Result<bool, TxError> {
        let b = self.bucket(v);
        node.atomically(|tx| {
            if !tx.read(b)?.contains(&v) {
                return Ok(false);
            }
            tx.modify(b, |vals| vals.retain(|x| *x != v))?;
            Ok(true)
        })
    }

    fn elements(&self, node: &Node) -> Result<Result<Vec<i64>, String>, TxError> {
        node.atomically_read(|tx| {
            let mut out = Vec::new();
            for b in &self.buckets {
                for &v in tx.read(b)? {
                    if !std::ptr::eq(self.bucket(v), b) {
                        return Ok(Err(format!("value {v} is in the wrong bucket")));
                    }
                    out.push(v);
                }
            }
            Ok(Ok(out))
        })
    }

    fn ordered(&self) -> bool {
        false
    }
}
