//! Memory blocks for version nodes, recycled by the transaction state that frees them.
//!
//! A version is usually freed by another thread than the one that made it (the next writer of
//! its object retires it). Each transaction state keeps the blocks it frees and makes its next
//! versions from them: no allocator call and no cross-thread free on the update path, and no
//! thread-local either (a state may move between threads with a suspended transaction).
//!
//! Every block of a pooled size is allocated with its size class's layout, whoever allocates
//! it, so any block can go to any pool and back to the allocator.

use std::alloc::Layout;
use std::ptr::NonNull;

/// Blocks up to this size are pooled; larger ones go straight to the allocator.
const POOLED_MAX: usize = 256;
/// Size classes are multiples of this (which is also the largest pooled alignment).
const CLASS: usize = 16;
const CLASSES: usize = POOLED_MAX / CLASS;
/// Free blocks a pool keeps per size class; more go back to the allocator.
const POOL_CAP: usize = 512;

/// The block a value layout is stored in: its size class (`CLASSES`: not pooled) and the
/// layout the allocator sees. Computed once per type, at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockSize {
    class: usize,
    layout: Layout,
}

impl BlockSize {
    /// The block for values of `layout` (non-zero size).
    pub(crate) const fn of(layout: Layout) -> BlockSize {
        if layout.size() > POOLED_MAX || layout.align() > CLASS {
            return BlockSize {
                class: CLASSES,
                layout,
            };
        }
        let units = layout.size().div_ceil(CLASS);
        let class = if units == 0 { 0 } else { units - 1 };
        BlockSize {
            class,
            layout: class_layout(class),
        }
    }
}

/// The layout every block of size class `class` (`< CLASSES`) is allocated with.
const fn class_layout(class: usize) -> Layout {
    // SAFETY: CLASS is a power of two and the size a small non-zero multiple of it.
    unsafe { Layout::from_size_align_unchecked((class + 1) * CLASS, CLASS) }
}

/// A block of `size` from the allocator.
#[inline]
pub(crate) fn alloc_block(size: BlockSize) -> NonNull<u8> {
    // SAFETY: a non-zero size (see `BlockSize::of`).
    let p = unsafe { std::alloc::alloc(size.layout) };
    match NonNull::new(p) {
        Some(p) => p,
        None => std::alloc::handle_alloc_error(size.layout),
    }
}

/// Returns a block to the allocator.
///
/// # Safety
/// `p` must come from [`alloc_block`] or [`BlockPool::take`] with the same `size`, and nothing
/// may use it afterwards.
#[inline]
pub(crate) unsafe fn free_block(p: NonNull<u8>, size: BlockSize) {
    std::alloc::dealloc(p.as_ptr(), size.layout);
}

/// Free blocks by size class, owned by one transaction state.
pub(crate) struct BlockPool {
    free: [Vec<NonNull<u8>>; CLASSES],
}

// SAFETY: the pool owns its free blocks exclusively; they hold no values.
unsafe impl Send for BlockPool {}

impl BlockPool {
    /// An empty pool.
    pub(crate) fn new() -> BlockPool {
        BlockPool {
            free: [const { Vec::new() }; CLASSES],
        }
    }

    /// A block of `size`: a recycled one if the pool has one.
    #[inline]
    pub(crate) fn take(&mut self, size: BlockSize) -> NonNull<u8> {
        if let Some(p) = self.free.get_mut(size.class).and_then(Vec::pop) {
            return p;
        }
        alloc_block(size)
    }

    /// Keeps a block for reuse (or returns it to the allocator if the pool is full).
    ///
    /// # Safety
    /// As for [`free_block`].
    #[inline]
    pub(crate) unsafe fn give(&mut self, p: NonNull<u8>, size: BlockSize) {
        if let Some(free) = self.free.get_mut(size.class) {
            if free.len() < POOL_CAP {
                free.push(p);
                return;
            }
        }
        free_block(p, size);
    }

    /// How many free blocks the pool holds (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.free.iter().map(Vec::len).sum()
    }
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        for (class, blocks) in self.free.iter_mut().enumerate() {
            let layout = class_layout(class);
            for p in blocks.drain(..) {
                // SAFETY: every pooled block was allocated with its class's layout.
                unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_recycled_by_size_class_up_to_the_cap() {
        let mut pool = BlockPool::new();
        let small = BlockSize::of(Layout::new::<[u64; 3]>());
        let a = pool.take(small);
        // SAFETY (every `give` below): the block came from this size and is not used again.
        unsafe { pool.give(a, small) };
        assert_eq!(pool.len(), 1);
        // A layout of the same class (24 and 32 bytes both round to 32) gets the same block.
        let same = BlockSize::of(Layout::new::<[u64; 4]>());
        assert_eq!(same, small);
        let b = pool.take(same);
        assert_eq!(a, b);
        assert_eq!(pool.len(), 0);
        unsafe { pool.give(b, same) };
        // Large blocks are never kept.
        let big = BlockSize::of(Layout::new::<[u8; 1024]>());
        let c = pool.take(big);
        unsafe { pool.give(c, big) };
        assert_eq!(pool.len(), 1);
        // A full class returns what it cannot keep.
        let blocks: Vec<_> = (0..POOL_CAP + 10).map(|_| alloc_block(small)).collect();
        for p in blocks {
            unsafe { pool.give(p, small) };
        }
        assert_eq!(pool.len(), POOL_CAP);
    }
}
