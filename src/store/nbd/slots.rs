//! The slot table: many requests in flight on one connection. Every call
//! takes a slot (its index and a sequence number form the NBD cookie) and
//! sleeps on the slot's condition variable; the reply reader matches
//! replies to slots by cookie, writes read data straight into the waiting
//! caller's buffer, and sets the outcome.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Slots per connection (at least the queue depth, plus room for flushes
/// and the LUKS reader, which call from outside the engine).
const SLOTS: usize = 128;

/// Poisoning carries no meaning here: every critical section leaves the
/// table consistent, so a panicked holder's state is still usable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request's outcome as the reader saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pending,
    /// Done; 0 = success, else the NBD error value.
    Done(u32),
    /// The connection broke before the reply.
    Lost,
}

/// One request in flight (named apart from the server's slots).
struct ClientSlot {
    seq: u32,
    busy: bool,
    outcome: Outcome,
    /// First error of a structured reply that is not finished yet.
    err: u32,
    /// Read requests: where the data goes, the request's offset and length.
    buf: *mut u8,
    offset: u64,
    len: usize,
    /// Read requests: the byte ranges (start -> end, within the buffer)
    /// that data and hole chunks have covered so far. The NBD spec
    /// requires a successful structured read to cover the whole request
    /// exactly once; anything less would hand the caller whatever its
    /// buffer held before (stale data of another request).
    covered: BTreeMap<usize, usize>,
    covered_bytes: usize,
}

const IDLE: ClientSlot = ClientSlot {
    seq: 0,
    busy: false,
    outcome: Outcome::Pending,
    err: 0,
    buf: std::ptr::null_mut(),
    offset: 0,
    len: 0,
    covered: BTreeMap::new(),
    covered_bytes: 0,
};

// SAFETY: `buf` is only dereferenced by the connection's reader thread
// while the caller that owns the buffer sleeps in `SlotTable::wait` for
// this slot's outcome; the caller does not return (and so does not give up
// the `&mut [u8]` the pointer came from) before the outcome is set, which
// the reader does only after its last access. The pointer is never used
// after the slot is freed.
unsafe impl Send for ClientSlot {}

struct Table {
    slots: Vec<ClientSlot>,
    free: Vec<u16>,
    next_seq: u32,
    /// Why the connection is unusable (set once, never cleared).
    dead: Option<String>,
}

/// What the reader needs to know about the slot a reply names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub index: usize,
    pub offset: u64,
    pub len: usize,
    pub is_read: bool,
}

pub struct SlotTable {
    table: Mutex<Table>,
    /// One per slot: the caller waiting on it.
    wake: Vec<Condvar>,
    /// Callers waiting for a free slot.
    free_cv: Condvar,
}

impl SlotTable {
    pub fn new() -> SlotTable {
        SlotTable {
            table: Mutex::new(Table {
                slots: (0..SLOTS).map(|_| IDLE).collect(),
                free: (0..SLOTS as u16).rev().collect(),
                next_seq: 1,
                dead: None,
            }),
            wake: (0..SLOTS).map(|_| Condvar::new()).collect(),
            free_cv: Condvar::new(),
        }
    }

    pub fn dead(&self) -> Option<String> {
        lock(&self.table).dead.clone()
    }

    /// Records why the connection is unusable; the first reason stays.
    pub fn mark_dead(&self, why: String) {
        let mut t = lock(&self.table);
        if t.dead.is_none() {
            t.dead = Some(why);
        }
    }

    /// Takes a free slot for a request at `offset` (reads: into `read`),
    /// waiting for one if all are taken; returns its index and cookie, or
    /// why the connection is dead.
    pub fn take(&self, offset: u64, read: Option<&mut [u8]>) -> Result<(usize, u64), String> {
        let mut t = lock(&self.table);
        let i = loop {
            if let Some(why) = &t.dead {
                return Err(why.clone());
            }
            if let Some(i) = t.free.pop() {
                break i as usize;
            }
            t = self.free_cv.wait(t).unwrap_or_else(|p| p.into_inner());
        };
        let seq = t.next_seq;
        t.next_seq = t.next_seq.wrapping_add(1).max(1);
        let (buf, len) = match read {
            Some(b) => (b.as_mut_ptr(), b.len()),
            None => (std::ptr::null_mut(), 0),
        };
        t.slots[i] = ClientSlot {
            seq,
            busy: true,
            outcome: Outcome::Pending,
            err: 0,
            buf,
            offset,
            len,
            covered: BTreeMap::new(),
            covered_bytes: 0,
        };
        Ok((i, (u64::from(seq) << 16) | i as u64))
    }

    /// Sleeps until slot `i` has an outcome, frees it, and returns the
    /// outcome with the connection's death reason, if any.
    pub fn wait(&self, i: usize) -> (Outcome, Option<String>) {
        self.wait_until(i, None)
            .unwrap_or((Outcome::Lost, Some("no outcome".into())))
    }

    /// As `wait`, but gives up at `deadline` (if any) and returns `None`,
    /// leaving the slot taken: the reader may still be writing into its
    /// buffer, so the caller must end the connection and then `wait`.
    pub fn wait_until(
        &self,
        i: usize,
        deadline: Option<std::time::Instant>,
    ) -> Option<(Outcome, Option<String>)> {
        let mut t = lock(&self.table);
        while t.slots[i].outcome == Outcome::Pending {
            match deadline {
                None => t = self.wake[i].wait(t).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    t = self.wake[i]
                        .wait_timeout(t, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
        let out = t.slots[i].outcome;
        t.slots[i] = IDLE;
        t.free.push(i as u16);
        let why = t.dead.clone();
        drop(t);
        self.free_cv.notify_one();
        Some((out, why))
    }

    /// Fails every request still waiting as lost, once the connection is
    /// gone for good.
    pub fn fail_pending(&self, why: String) {
        let mut t = lock(&self.table);
        if t.dead.is_none() {
            t.dead = Some(why);
        }
        for (i, s) in t.slots.iter_mut().enumerate() {
            if s.busy && s.outcome == Outcome::Pending {
                s.outcome = Outcome::Lost;
                self.wake[i].notify_one();
            }
        }
        drop(t);
        self.free_cv.notify_all();
    }

    /// The slot a cookie names, if it is waiting.
    pub fn waiting(&self, cookie: u64) -> Result<Waiting, String> {
        let t = lock(&self.table);
        let i = (cookie & 0xffff) as usize;
        let seq = (cookie >> 16) as u32;
        match t.slots.get(i) {
            Some(s) if s.busy && s.seq == seq && s.outcome == Outcome::Pending => Ok(Waiting {
                index: i,
                offset: s.offset,
                len: s.len,
                is_read: !s.buf.is_null(),
            }),
            _ => Err(format!("reply for unknown cookie {cookie:#x}")),
        }
    }

    /// Keeps the first error of a structured reply until its last chunk.
    pub fn note_error(&self, i: usize, errno: u32) {
        let mut t = lock(&self.table);
        if t.slots[i].err == 0 {
            t.slots[i].err = errno;
        }
    }

    /// Records that a read chunk covers `[at, at + n)` of slot `i`'s
    /// buffer; a chunk that overlaps an earlier one (or is empty) is a
    /// protocol violation.
    pub fn cover(&self, i: usize, at: usize, n: usize) -> Result<(), String> {
        let mut t = lock(&self.table);
        let s = &mut t.slots[i];
        let end = at.checked_add(n).filter(|&e| e <= s.len && n > 0);
        let Some(end) = end else {
            return Err(format!("read chunk [{at}, +{n}) is empty or too long"));
        };
        let before = s.covered.range(..end).next_back();
        if before.is_some_and(|(_, &e)| e > at) {
            return Err(format!("read chunk [{at}, +{n}) overlaps an earlier chunk"));
        }
        s.covered.insert(at, end);
        s.covered_bytes += n;
        Ok(())
    }

    /// Sets slot `i`'s outcome (an earlier chunk's error wins) and wakes
    /// its caller, for a request answered in chunks: a read that ends
    /// without an error but with part of its range never sent fails with
    /// EIO rather than passing on stale buffer bytes as data.
    pub fn finish_chunks(&self, i: usize, errno: u32) {
        self.finish_as(i, errno, true);
    }

    /// Sets the outcome of a request answered by a simple reply.
    pub fn finish(&self, i: usize, errno: u32) {
        self.finish_as(i, errno, false);
    }

    fn finish_as(&self, i: usize, errno: u32, chunked: bool) {
        let mut t = lock(&self.table);
        let s = &mut t.slots[i];
        let mut e = if s.err != 0 { s.err } else { errno };
        let is_read = !s.buf.is_null();
        if e == 0 && chunked && is_read && s.covered_bytes != s.len {
            tracing::warn!(
                "NBD server finished a read of {} bytes having sent {}; failing it",
                s.len,
                s.covered_bytes
            );
            e = crate::protocol::nbd::EIO;
        }
        s.outcome = Outcome::Done(e);
        drop(t);
        self.wake[i].notify_one();
    }

    /// Reads `n` bytes of read data into slot `i` at byte `at` of its
    /// buffer.
    pub fn fill(&self, r: &mut impl Read, i: usize, at: usize, n: usize) -> io::Result<()> {
        let (ptr, len) = {
            let t = lock(&self.table);
            (t.slots[i].buf, t.slots[i].len)
        };
        if ptr.is_null() || at.checked_add(n).is_none_or(|end| end > len) {
            return Err(io::Error::other("read data outside the request's buffer"));
        }
        // SAFETY: the slot is busy and pending, so its caller is asleep in
        // `wait` and the buffer behind `ptr` (of `len` bytes, borrowed
        // mutably for the whole call) is ours to write until we set the
        // outcome; `at + n <= len` was checked just above.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at), n) };
        r.read_exact(dst)
    }

    /// Zeroes `n` bytes of slot `i`'s buffer at `at` (a hole chunk).
    pub fn zero(&self, i: usize, at: usize, n: usize) -> io::Result<()> {
        let t = lock(&self.table);
        let (ptr, len) = (t.slots[i].buf, t.slots[i].len);
        if ptr.is_null() || at.checked_add(n).is_none_or(|end| end > len) {
            return Err(io::Error::other("hole outside the request's buffer"));
        }
        // SAFETY: as in `fill`; the table lock is held besides.
        let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at), n) };
        dst.fill(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_name_one_request_and_go_stale_when_it_ends() {
        let t = SlotTable::new();
        let mut buf = [1u8; 8];
        let (i, cookie) = t.take(4096, Some(&mut buf)).unwrap();
        let w = t.waiting(cookie).unwrap();
        assert_eq!((w.index, w.offset, w.len, w.is_read), (i, 4096, 8, true));
        t.zero(i, 2, 4).unwrap();
        assert!(
            t.zero(i, 6, 4).is_err(),
            "a hole past the buffer is refused"
        );
        t.finish(i, 0);
        assert!(t.waiting(cookie).is_err(), "finished: no second reply");
        assert_eq!(t.wait(i).0, Outcome::Done(0));
        assert_eq!(buf, [1, 1, 0, 0, 0, 0, 1, 1]);
        let (j, again) = t.take(0, None).unwrap();
        assert_eq!(i, j, "the freed slot is reused");
        assert_ne!(cookie, again, "with a new sequence number");
        assert!(t.waiting(cookie).is_err());
    }

    #[test]
    fn a_structured_error_outlives_the_done_chunk_and_death_fails_waiters() {
        let t = SlotTable::new();
        let (i, _) = t.take(0, None).unwrap();
        t.note_error(i, 5);
        t.note_error(i, 28);
        t.finish(i, 0);
        assert_eq!(t.wait(i).0, Outcome::Done(5));
        let (k, _) = t.take(0, None).unwrap();
        t.fail_pending("gone".into());
        assert_eq!(t.wait(k), (Outcome::Lost, Some("gone".into())));
        assert_eq!(t.take(0, None), Err("gone".into()));
    }
}
