//! O(1) fixed-size block allocator for small request-path objects, after
//! `mm/dmapool.c` with "dmapool: link blocks across pages".
//!
//! Why: request descriptors and per-request crypto state are small, fixed
//! size and short-lived; the general allocator spends time on size classes,
//! coalescing and thread caches we do not need. Here the free blocks form
//! one LIFO stack linked *through the free blocks themselves* across all
//! chunks, so allocation is a pop and free a push under a short spin lock —
//! no search, no per-chunk bookkeeping. Memory grows a chunk (whole pages,
//! at least 64 KiB) at a time and, as in dmapool, chunks are never given back while the
//! pool lives — which is what makes a global free stack safe — and all of
//! them are returned when the pool is dropped.
//!
//! Typed use: [`BlockPool<T>`] hands out [`PoolBox<T>`], which borrows the
//! pool. The untyped [`RawBlockPool`] is the engine underneath; a cache in
//! front of it (per-thread magazines, measured in `benches/`) can be built
//! from its public `alloc`, `free` and [`SpinLock`].

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::mem::{align_of, size_of};
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::raw::PAGE_SIZE;

/// Smallest growth step of a block pool.
const CHUNK_MIN: usize = 64 << 10;

/// Link stored in a free block.
struct FreeBlock {
    next: *mut FreeBlock,
}

/// Lock for a critical section of a few instructions: uncontended it is one
/// compare-exchange and one store, cheaper than a futex mutex's two atomic
/// read-modify-writes, which matters at ~10 ns per operation. A holder
/// that is preempted makes the others yield after a short spin. Only for
/// sections that never block and never take the same lock again.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked` (see `with`).
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: the lock owns its value.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Run `f` on the value with the lock held.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        // SAFETY: we hold the lock (set `locked` false -> true with Acquire),
        // so no other reference to the value exists until we release it.
        let r = f(unsafe { &mut *self.value.get() });
        self.locked.store(false, Ordering::Release);
        r
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    // The holder may have been preempted: let it run.
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

struct Stack {
    head: *mut FreeBlock,
    nr_active: usize,
}

// SAFETY: the raw pointers point into chunks owned by the pool; the stack is
// only touched under the pool's lock.
unsafe impl Send for Stack {}

/// Untyped pool of `block_size`-byte blocks aligned to `align`.
pub struct RawBlockPool {
    block_size: usize,
    align: usize,
    chunk_layout: Layout,
    blocks_per_chunk: usize,
    stack: SpinLock<Stack>,
    /// Every chunk ever allocated (freed on drop).
    chunks: Mutex<Vec<NonNull<u8>>>,
}

// SAFETY: all shared state is behind the spin lock or the mutex; chunk
// memory is plain bytes owned by the pool.
unsafe impl Send for RawBlockPool {}
// SAFETY: as above.
unsafe impl Sync for RawBlockPool {}

impl RawBlockPool {
    /// A pool of blocks of at least `size` bytes aligned to `align` (a power
    /// of two; raised to the link's alignment). Size is raised to the link's
    /// size and rounded up to the alignment, as dmapool does. `None` if the
    /// parameters do not describe a valid layout.
    pub fn new(size: usize, align: usize) -> Option<RawBlockPool> {
        if !align.is_power_of_two() {
            return None;
        }
        let align = align.max(align_of::<FreeBlock>());
        let block_size = size
            .max(size_of::<FreeBlock>())
            .checked_next_multiple_of(align)?;
        // Grow by whole pages, at least CHUNK_MIN and 8 blocks: fewer, larger
        // chunks keep the blocks dense (one 4 KiB block per aligned heap
        // allocation would spread them over twice the pages).
        let chunk_size = block_size
            .checked_mul(8)?
            .max(CHUNK_MIN)
            .checked_next_multiple_of(PAGE_SIZE)?;
        let chunk_layout = Layout::from_size_align(chunk_size, align.max(PAGE_SIZE)).ok()?;
        Some(RawBlockPool {
            block_size,
            align,
            chunk_layout,
            blocks_per_chunk: chunk_size / block_size,
            stack: SpinLock::new(Stack {
                head: ptr::null_mut(),
                nr_active: 0,
            }),
            chunks: Mutex::new(Vec::new()),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn align(&self) -> usize {
        self.align
    }

    /// Blocks in use.
    pub fn active(&self) -> usize {
        self.stack.with(|s| s.nr_active)
    }

    /// Chunks allocated so far (each max(64 KiB, 8 blocks), whole pages).
    pub fn chunks(&self) -> usize {
        self.chunks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A block (contents unspecified). O(1); grows by one chunk when empty.
    #[inline]
    pub fn alloc(&self) -> NonNull<u8> {
        let got = self.stack.with(|s| {
            let b = s.head;
            if !b.is_null() {
                // SAFETY: a non-null head is a free block inside one of our
                // chunks whose first word holds a valid link (written by
                // `grow_and_alloc` or `free`), and only we touch it under the lock.
                s.head = unsafe { (*b).next };
                s.nr_active += 1;
            }
            b
        });
        match NonNull::new(got) {
            Some(b) => b.cast(),
            None => self.grow_and_alloc(),
        }
    }

    #[cold]
    fn grow_and_alloc(&self) -> NonNull<u8> {
        // Allocate and link the chunk outside the lock (dmapool drops its
        // lock around the page allocation too), then splice it in O(1).
        // SAFETY: chunk_layout has non-zero size (>= PAGE_SIZE).
        let chunk = unsafe { alloc(self.chunk_layout) };
        let Some(chunk) = NonNull::new(chunk) else {
            handle_alloc_error(self.chunk_layout)
        };
        self.chunks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(chunk);
        let base = chunk.as_ptr();
        // Link blocks in ascending address order; the first block is ours.
        let n = self.blocks_per_chunk;
        for i in 1..n {
            // SAFETY: block i (1 <= i < n) lies inside the chunk
            // (i * block_size + block_size <= chunk size) and is aligned to
            // `align` >= align_of::<FreeBlock>() because the chunk is and
            // block_size is a multiple of align.
            unsafe {
                let b = base.add(i * self.block_size) as *mut FreeBlock;
                let next = if i + 1 < n {
                    base.add((i + 1) * self.block_size) as *mut FreeBlock
                } else {
                    ptr::null_mut()
                };
                b.write(FreeBlock { next });
            }
        }
        self.stack.with(|s| {
            if n > 1 {
                // SAFETY: the last block of the chain is inside the chunk and
                // was initialised above; the chain is not yet shared.
                unsafe {
                    let first = base.add(self.block_size) as *mut FreeBlock;
                    let last = base.add((n - 1) * self.block_size) as *mut FreeBlock;
                    (*last).next = s.head;
                    s.head = first;
                }
            }
            s.nr_active += 1;
        });
        chunk
    }

    /// Return a block.
    ///
    /// # Safety
    /// `block` must come from `alloc` on this pool and not have been freed
    /// since; the caller must not use it afterwards.
    #[inline]
    pub unsafe fn free(&self, block: NonNull<u8>) {
        let b = block.as_ptr() as *mut FreeBlock;
        self.stack.with(|s| {
            // SAFETY: per the caller's contract the block is ours, at least
            // size_of::<FreeBlock>() bytes and suitably aligned, and unused.
            unsafe { b.write(FreeBlock { next: s.head }) };
            s.head = b;
            s.nr_active -= 1;
        });
    }
}

impl Drop for RawBlockPool {
    fn drop(&mut self) {
        let active = self.stack.with(|s| s.nr_active);
        let chunks = std::mem::take(self.chunks.get_mut().unwrap_or_else(|e| e.into_inner()));
        if active != 0 {
            // Like dma_pool_destroy on a busy pool: leak rather than free
            // memory someone may still use. Unreachable through the typed
            // API, whose boxes borrow the pool.
            tracing::error!(
                active,
                "block pool dropped with blocks in use; leaking its chunks"
            );
            return;
        }
        for c in chunks {
            // SAFETY: every chunk was allocated with chunk_layout and is
            // freed exactly once here; no block is in use.
            unsafe { dealloc(c.as_ptr(), self.chunk_layout) };
        }
    }
}

impl std::fmt::Debug for RawBlockPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawBlockPool")
            .field("block_size", &self.block_size)
            .field("align", &self.align)
            .finish()
    }
}

/// Typed block pool for objects of type `T`.
pub struct BlockPool<T> {
    raw: RawBlockPool,
    _t: PhantomData<fn(T) -> T>,
}

impl<T> BlockPool<T> {
    pub fn new() -> BlockPool<T> {
        let raw = match RawBlockPool::new(size_of::<T>(), align_of::<T>()) {
            Some(r) => r,
            // size_of/align_of of a real type always form a valid layout.
            None => unreachable!("type layout is always valid"),
        };
        BlockPool {
            raw,
            _t: PhantomData,
        }
    }

    /// Move `value` into a block of this pool.
    #[inline]
    pub fn alloc(&self, value: T) -> PoolBox<'_, T> {
        let p = self.raw.alloc().cast::<T>();
        // SAFETY: the block is unused, at least size_of::<T>() bytes and
        // aligned to align_of::<T>() (pool created with T's layout).
        unsafe { p.as_ptr().write(value) };
        PoolBox { ptr: p, pool: self }
    }

    pub fn active(&self) -> usize {
        self.raw.active()
    }

    pub fn chunks(&self) -> usize {
        self.raw.chunks()
    }

    /// # Safety
    /// `p` holds a live `T` allocated from this pool, not used afterwards.
    #[inline]
    unsafe fn release(&self, p: NonNull<T>) {
        // SAFETY: per the contract, `p` holds a live T we own.
        unsafe {
            ptr::drop_in_place(p.as_ptr());
            self.raw.free(p.cast());
        }
    }
}

impl<T> Default for BlockPool<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for BlockPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.raw.fmt(f)
    }
}

/// A `T` living in a [`BlockPool`] block, dropped and returned on drop.
pub struct PoolBox<'a, T> {
    ptr: NonNull<T>,
    pool: &'a BlockPool<T>,
}

// SAFETY: PoolBox owns its T like Box<T>; the pool reference is Sync
// (RawBlockPool is Sync).
unsafe impl<T: Send> Send for PoolBox<'_, T> {}
// SAFETY: `&PoolBox` only gives `&T`.
unsafe impl<T: Sync> Sync for PoolBox<'_, T> {}

impl<T> Deref for PoolBox<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: ptr holds a live T owned by this box.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for PoolBox<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref, and &mut self makes the access unique.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for PoolBox<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the box owns a live T from this pool and is dropping.
        unsafe { self.pool.release(self.ptr) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize;

    /// Allocate many blocks of every dmapool_test size: all distinct, none
    /// overlapping, aligned, writable without disturbing each other; freed
    /// blocks are reused without growing.
    #[test]
    fn blocks_are_distinct_aligned_and_reused() {
        for (size, n) in [
            (1usize, 3000usize),
            (16, 8192),
            (64, 2000),
            (68, 700),
            (256, 600),
            (1024, 100),
            (4096, 40),
            (5000, 9),
        ] {
            let align = if size.is_power_of_two() {
                size.min(4096)
            } else {
                32
            };
            let pool = RawBlockPool::new(size, align).unwrap();
            let bs = pool.block_size();
            assert!(bs >= size && bs % pool.align() == 0);
            let blocks: Vec<NonNull<u8>> = (0..n).map(|_| pool.alloc()).collect();
            assert_eq!(pool.active(), n);
            let mut spans: Vec<(usize, usize)> =
                blocks.iter().map(|b| (b.as_ptr() as usize, bs)).collect();
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "blocks overlap at size {size}");
            }
            for b in &blocks {
                assert_eq!(b.as_ptr() as usize % pool.align(), 0);
            }
            for (i, b) in blocks.iter().enumerate() {
                // SAFETY: each block is ours, `size` bytes, in use.
                unsafe { ptr::write_bytes(b.as_ptr(), i as u8, size) };
            }
            for (i, b) in blocks.iter().enumerate() {
                // SAFETY: as above.
                let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), size) };
                assert!(
                    s.iter().all(|&x| x == i as u8),
                    "block {i} of size {size} was overwritten"
                );
            }
            let chunks = pool.chunks();
            assert!(chunks >= n.div_ceil(pool.blocks_per_chunk));
            for b in &blocks {
                // SAFETY: allocated from this pool, freed once.
                unsafe { pool.free(*b) };
            }
            assert_eq!(pool.active(), 0);
            let again: HashSet<usize> = (0..n).map(|_| pool.alloc().as_ptr() as usize).collect();
            assert_eq!(again.len(), n);
            let before: HashSet<usize> = blocks.iter().map(|b| b.as_ptr() as usize).collect();
            assert_eq!(again, before, "freed blocks not reused");
            assert_eq!(pool.chunks(), chunks, "pool grew although blocks were free");
            for b in again {
                // SAFETY: allocated from this pool above, freed once.
                unsafe { pool.free(NonNull::new(b as *mut u8).unwrap()) };
            }
        }
    }

    #[test]
    fn invalid_parameters_are_refused() {
        assert!(RawBlockPool::new(16, 3).is_none());
        assert!(RawBlockPool::new(16, 0).is_none());
        assert!(RawBlockPool::new(usize::MAX - 3, 8).is_none());
    }

    static DROPS: AtomicUsize = AtomicUsize::new(0);

    struct Req {
        id: u64,
        data: [u8; 40],
    }
    impl Drop for Req {
        fn drop(&mut self) {
            DROPS.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn typed_boxes_drop_their_values_and_return_blocks() {
        let pool: BlockPool<Req> = BlockPool::new();
        {
            let mut v: Vec<PoolBox<'_, Req>> = (0..500)
                .map(|i| {
                    pool.alloc(Req {
                        id: i,
                        data: [i as u8; 40],
                    })
                })
                .collect();
            assert_eq!(pool.active(), 500);
            v[3].id = 1000;
            for (i, r) in v.iter().enumerate() {
                if i != 3 {
                    assert_eq!(r.id, i as u64);
                }
                assert_eq!(r.data[39], i as u8);
            }
        }
        assert_eq!(DROPS.load(Ordering::SeqCst), 500);
        assert_eq!(pool.active(), 0);
    }

    /// Threads allocating and freeing concurrently never receive the same
    /// block twice at once (each writes its id into the block and checks it).
    #[test]
    fn concurrent_alloc_free_never_shares_a_block() {
        let pool = BlockPool::<[u64; 4]>::new();
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let pool = &pool;
                sc.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let tag = (t << 32) | i;
                        held.push(pool.alloc([tag; 4]));
                        if i % 3 == 2 {
                            for b in held.drain(..) {
                                let v = b[0];
                                assert!(b.iter().all(|&x| x == v), "block shared between owners");
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(pool.active(), 0);
    }

    /// ZSTs and over-aligned types work.
    #[test]
    fn odd_layouts() {
        #[repr(align(256))]
        struct Big(u8);
        let p = BlockPool::<Big>::new();
        let a = p.alloc(Big(1));
        let b = p.alloc(Big(2));
        assert_eq!((&*a as *const Big as usize) % 256, 0);
        assert_eq!((&*b as *const Big as usize) % 256, 0);
        assert_eq!(a.0 + b.0, 3);
        let z = BlockPool::<()>::new();
        let x = z.alloc(());
        let y = z.alloc(());
        assert_ne!(&*x as *const () as usize, &*y as *const () as usize);
    }
}
