//! Bucketed hash table (HyflowCPP thesis 6.2.1.5): each bucket is a shared object.

use std::sync::Arc;

use atomos::{Key, Node, TRef, Tx, TxError};
use rand::rngs::SmallRng;
use rand::Rng;
use smallvec::SmallVec;

use super::nesting::InnerOp;

use super::set::IntSet;

/// A bucket's values. Buckets hold about one value each, so up to two live inside the bucket's
/// version itself: a lookup reads the version and no separate buffer (one dependent cache miss
/// fewer). It encodes as a sequence, as a `Vec` does.
pub type Bucket = SmallVec<[i64; 2]>;

/// The hash-table set: `buckets` objects, each a small vector of values. Clones share the
/// buckets' references, and with them the cell each reference caches: a clone with references
/// of its own would look every bucket up in the node's key table on each use.
#[derive(Clone)]
pub struct HashTable {
    buckets: Arc<[TRef<Bucket>]>,
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

    fn bucket(&self, v: i64) -> &TRef<Bucket> {
        // Fibonacci hashing spreads neighbouring values over buckets: the product's high bits
        // pick the bucket, scaled to the table by a multiplication (no division).
        let h = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let i = (u128::from(h) * self.buckets.len() as u128) >> 64;
        &self.buckets[i as usize]
    }
}

impl HashTable {
    /// A random add or remove (even odds) of a value in `0..range`, as an inner operation.
    pub fn random_op(&self, rng: &mut SmallRng, range: i64) -> BucketOp {
        let v = super::below(rng, range.max(0) as u64) as i64;
        BucketOp {
            bucket: self.bucket(v).clone(),
            value: v,
            add: rng.random_bool(0.5),
        }
    }
}

/// Adds or removes one value of its bucket.
#[derive(Clone)]
pub struct BucketOp {
    bucket: TRef<Bucket>,
    value: i64,
    add: bool,
}

impl InnerOp for BucketOp {
    fn run(&self, tx: &mut Tx<'_>) -> Result<i64, TxError> {
        let present = tx.read(&self.bucket)?.contains(&self.value);
        let v = self.value;
        match (self.add, present) {
            (true, false) => tx.modify(&self.bucket, |vals| vals.push(v)).map(|_| 1),
            (false, true) => tx
                .modify(&self.bucket, |vals| vals.retain(|x| *x != v))
                .map(|_| -1),
            _ => Ok(0),
        }
    }

    fn locks(&self) -> Vec<String> {
        vec![format!("ht/{}", self.value)]
    }

    fn compensation(&self, effect: i64) -> Option<BucketOp> {
        (effect != 0).then(|| BucketOp {
            add: !self.add,
            ..self.clone()
        })
    }
}

impl IntSet for HashTable {
    fn init(&self, node: &Node) -> Result<(), TxError> {
        for chunk in self.buckets.chunks(1024) {
            node.atomically(|tx| {
                for b in chunk {
                    tx.create(b, Bucket::new())?;
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
            for b in self.buckets.iter() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbouring_values_spread_over_the_buckets() {
        for buckets in [1, 7, 4096, 10_000] {
            let table = HashTable::new("t", buckets);
            let mut load = vec![0u32; buckets];
            for v in 0..2 * buckets as i64 {
                let b = table.bucket(v);
                let i = table.buckets.iter().position(|r| std::ptr::eq(r, b));
                load[i.expect("a bucket of the table")] += 1;
            }
            // Two values per bucket on average; no bucket far above it, few left empty.
            let empty = load.iter().filter(|&&n| n == 0).count();
            assert!(load.iter().all(|&n| n <= 8), "{buckets} buckets: {load:?}");
            assert!(empty * 4 <= buckets, "{buckets} buckets: {empty} empty");
        }
    }
}
