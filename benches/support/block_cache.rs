//! A per-thread block cache in front of udm's `RawBlockPool`, for the
//! dmapool_test benchmark (`benches/mem_blockpool.rs`) only: the request
//! path takes the pool's lock per block, and this cache shows what a
//! per-thread layer on top would gain. `tests/bench_block_cache.rs` checks
//! that it never hands a block out twice.
//!
//! A thread's cache is an array of free blocks: alloc and free are an array
//! pop and push — no atomic operation, no access to the block's memory.
//! Blocks move between a cache and the shared [`Depot`] [`MAGAZINE`] at a
//! time under one lock (the pool's own `SpinLock`): for blocks of at least
//! 256 bytes a drained batch is parked whole inside its first block, so
//! moving 32 blocks touches one block; smaller blocks are linked through
//! each other, as the pool links its free blocks. The pool itself is asked
//! only when the depot is empty (growth), and gets every block back when
//! the depot is dropped.

use std::cell::{Cell, UnsafeCell};
use std::mem::size_of;
use std::ptr::{self, NonNull};

use udm::mem::{RawBlockPool, SpinLock};

/// Blocks moved between a thread cache and the depot at a time.
pub const MAGAZINE: usize = 32;

/// A full magazine parked in the depot, stored inside its own first block.
#[repr(C)]
struct Magazine {
    next: *mut Magazine,
    rest: [*mut u8; MAGAZINE - 1],
}

/// Link stored in a parked free block too small for a magazine.
struct Link {
    next: *mut Link,
}

struct Parked {
    mags: *mut Magazine,
    chain: *mut Link,
    /// Blocks parked (in magazines and in the chain).
    blocks: usize,
}

// SAFETY: the pointers point to free blocks of the depot's pool; they are
// only followed under the depot's lock (or by the depot's drop).
unsafe impl Send for Parked {}

/// Free blocks shared by the thread caches of one pool.
pub struct Depot<'p> {
    pool: &'p RawBlockPool,
    parked: SpinLock<Parked>,
}

impl<'p> Depot<'p> {
    pub fn new(pool: &'p RawBlockPool) -> Depot<'p> {
        Depot {
            pool,
            parked: SpinLock::new(Parked {
                mags: ptr::null_mut(),
                chain: ptr::null_mut(),
                blocks: 0,
            }),
        }
    }

    /// A cache for one thread (not `Sync`).
    pub fn cache(&self) -> LocalBlockCache<'_> {
        LocalBlockCache {
            depot: self,
            slots: UnsafeCell::new([ptr::null_mut(); 2 * MAGAZINE]),
            count: Cell::new(0),
        }
    }

    /// Free blocks parked here.
    pub fn parked(&self) -> usize {
        self.parked.with(|p| p.blocks)
    }

    /// Whether drained batches are parked whole inside their first block.
    pub fn parks_magazines(&self) -> bool {
        self.pool.block_size() >= size_of::<Magazine>()
    }

    /// Move up to MAGAZINE parked blocks into `slots` (a cache's empty
    /// array); returns how many. A parked magazine is taken whole;
    /// otherwise blocks are popped off the chain.
    fn refill(&self, slots: &mut [*mut u8; 2 * MAGAZINE]) -> usize {
        let (m, k) = self.parked.with(|p| {
            if !p.mags.is_null() {
                let m = p.mags;
                // SAFETY: a parked magazine was written by `drain` into a
                // free block of the pool; we hold the lock.
                p.mags = unsafe { (*m).next };
                p.blocks -= MAGAZINE;
                return (m, MAGAZINE);
            }
            let mut k = 0;
            let mut b = p.chain;
            while k < MAGAZINE && !b.is_null() {
                slots[k] = b as *mut u8;
                // SAFETY: every node reachable from the chain is a parked
                // free block with a valid link; we hold the lock.
                b = unsafe { (*b).next };
                k += 1;
            }
            p.chain = b;
            p.blocks -= k;
            (ptr::null_mut(), k)
        });
        if !m.is_null() {
            // SAFETY: the magazine was detached under the lock: we own it
            // and its blocks now.
            unsafe { slots[..MAGAZINE - 1].copy_from_slice(&(*m).rest) };
            slots[MAGAZINE - 1] = m as *mut u8;
        }
        k
    }
}

impl Drop for Depot<'_> {
    fn drop(&mut self) {
        let p = self.parked.with(|p| {
            std::mem::replace(
                p,
                Parked {
                    mags: ptr::null_mut(),
                    chain: ptr::null_mut(),
                    blocks: 0,
                },
            )
        });
        let free = |b: *mut u8| {
            // SAFETY: every parked block is a free block of this pool,
            // given back exactly once here.
            unsafe { self.pool.free(NonNull::new_unchecked(b)) }
        };
        let mut m = p.mags;
        while !m.is_null() {
            // SAFETY: parked magazine (see `refill`); read before its own
            // block is given back.
            let (next, rest) = unsafe { ((*m).next, (*m).rest) };
            rest.into_iter().for_each(free);
            free(m as *mut u8);
            m = next;
        }
        let mut b = p.chain;
        while !b.is_null() {
            // SAFETY: parked chain node, read before it is given back.
            let next = unsafe { (*b).next };
            free(b as *mut u8);
            b = next;
        }
    }
}

/// One thread's array of free blocks in front of a [`Depot`]. Not `Sync`.
/// Blocks are interchangeable: one allocated here may be freed through
/// another cache of the same depot. Dropping the cache parks its blocks.
pub struct LocalBlockCache<'d> {
    depot: &'d Depot<'d>,
    slots: UnsafeCell<[*mut u8; 2 * MAGAZINE]>,
    count: Cell<usize>,
}

impl LocalBlockCache<'_> {
    /// A block (contents unspecified).
    #[inline]
    pub fn alloc(&self) -> NonNull<u8> {
        let n = self.count.get();
        if n > 0 {
            // SAFETY: the cache is !Sync and no reference into `slots`
            // outlives a method call, so this access is unique; slots[..n]
            // hold free blocks owned by this cache (non-null).
            let b = unsafe { (*self.slots.get())[n - 1] };
            self.count.set(n - 1);
            // SAFETY: see above: stored pointers are non-null blocks.
            return unsafe { NonNull::new_unchecked(b) };
        }
        self.refill()
    }

    /// From the depot, or, when it is empty, a magazine's worth from the
    /// pool (in the order the pool hands them out, so the blocks' order in
    /// memory is the one a cache refilling from the pool's own free stack
    /// would see).
    #[cold]
    fn refill(&self) -> NonNull<u8> {
        // SAFETY: unique access to `slots` (the cache is !Sync and no
        // reference into it outlives a method call).
        let slots = unsafe { &mut *self.slots.get() };
        let mut k = self.depot.refill(slots);
        if k == 0 {
            for s in &mut slots[..MAGAZINE] {
                *s = self.depot.pool.alloc().as_ptr();
            }
            k = MAGAZINE;
        }
        self.count.set(k);
        self.alloc()
    }

    /// Return a block to this cache.
    ///
    /// # Safety
    /// `block` must come from this cache's pool (through any cache of the
    /// depot or the pool itself), be in use, and not be used afterwards.
    #[inline]
    pub unsafe fn free(&self, block: NonNull<u8>) {
        let mut n = self.count.get();
        if n == 2 * MAGAZINE {
            self.drain(MAGAZINE);
            n -= MAGAZINE;
        }
        // SAFETY: unique access as in `alloc`; n < slots.len().
        unsafe { (*self.slots.get())[n] = block.as_ptr() };
        self.count.set(n + 1);
    }

    /// Park the `n` (<= count) oldest blocks in the depot.
    #[cold]
    fn drain(&self, n: usize) {
        if n == 0 {
            return;
        }
        let count = self.count.get();
        // SAFETY: unique access as in `alloc`; slots[..count] are free blocks
        // of the pool owned by this cache, each large and aligned enough for
        // a link (and for a Magazine when the depot parks magazines).
        // Writing into them is writing into memory we own.
        let slots = unsafe { &mut *self.slots.get() };
        if n == MAGAZINE && self.depot.parks_magazines() {
            let m = slots[0] as *mut Magazine;
            let mut rest = [ptr::null_mut(); MAGAZINE - 1];
            rest.copy_from_slice(&slots[1..MAGAZINE]);
            // SAFETY: as above: `m` is a free block we own, big enough.
            unsafe {
                m.write(Magazine {
                    next: ptr::null_mut(),
                    rest,
                })
            };
            self.depot.parked.with(|p| {
                // SAFETY: `m` was written just above and is ours until it
                // is linked in here.
                unsafe { (*m).next = p.mags };
                p.mags = m;
                p.blocks += MAGAZINE;
            });
        } else {
            for i in 0..n - 1 {
                // SAFETY: as above: free blocks we own.
                unsafe {
                    (slots[i] as *mut Link).write(Link {
                        next: slots[i + 1] as *mut Link,
                    })
                };
            }
            let first = slots[0] as *mut Link;
            let last = slots[n - 1] as *mut Link;
            self.depot.parked.with(|p| {
                // SAFETY: `last` is a free block we own until linked in.
                unsafe { last.write(Link { next: p.chain }) };
                p.chain = first;
                p.blocks += n;
            });
        }
        slots.copy_within(n..count, 0);
        self.count.set(count - n);
    }

    /// Free blocks held by this cache.
    pub fn cached(&self) -> usize {
        self.count.get()
    }
}

impl Drop for LocalBlockCache<'_> {
    fn drop(&mut self) {
        while self.count.get() >= MAGAZINE {
            self.drain(MAGAZINE);
        }
        self.drain(self.count.get());
    }
}
