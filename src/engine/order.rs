//! Ordering rules between requests of one export (ordered parallel
//! execution: running requests in parallel must never reorder what the
//! client ordered).
//!
//! Requests are registered in arrival order. A request may start only when
//! every *earlier*, still unfinished request it conflicts with has
//! finished:
//! - a read waits for overlapping earlier writes (it must see them);
//! - a write waits for overlapping earlier reads and writes (no torn or
//!   reordered data, and read-modify-write of a partial block is atomic,
//!   because ranges are widened to whole logical blocks);
//! - a flush waits for every earlier write, whatever its range, so it
//!   covers everything the client sent before it.
//!
//! Dependencies only ever point to earlier requests, so the graph is
//! acyclic and nothing can deadlock.

/// What a request does to the range it names, for ordering purposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reads the range.
    Read,
    /// Changes the range (write, trim, write-zeroes).
    Write,
    /// Makes all earlier writes durable; range ignored.
    Flush,
    /// Touches no data (kept for completeness; never conflicts).
    None,
}

/// A request's kind and its block-aligned byte range `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub kind: Kind,
    pub start: u64,
    pub end: u64,
}

impl Span {
    /// The span of a request on `[offset, offset+len)` widened to whole
    /// blocks of `block` bytes (a power of two). Saturates instead of
    /// overflowing; callers have checked the range against the device.
    pub fn widened(kind: Kind, offset: u64, len: u64, block: u64) -> Span {
        let mask = block.max(1) - 1;
        let start = offset & !mask;
        let end = offset.saturating_add(len).saturating_add(mask) & !mask;
        Span { kind, start, end }
    }
}

/// Must `later` wait for `earlier` (registered before it) to finish?
pub fn conflicts(earlier: &Span, later: &Span) -> bool {
    let overlap = earlier.start < later.end && later.start < earlier.end;
    match (earlier.kind, later.kind) {
        (Kind::Write, Kind::Flush) => true,
        (Kind::Flush, _) | (_, Kind::Flush) => false,
        (Kind::None, _) | (_, Kind::None) => false,
        (Kind::Read, Kind::Read) => false,
        _ => overlap,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(kind: Kind, start: u64, end: u64) -> Span {
        Span { kind, start, end }
    }

    #[test]
    fn widening_covers_partial_blocks() {
        assert_eq!(
            Span::widened(Kind::Write, 513, 1, 512),
            s(Kind::Write, 512, 1024)
        );
        assert_eq!(
            Span::widened(Kind::Write, 510, 4, 512),
            s(Kind::Write, 0, 1024)
        );
        assert_eq!(
            Span::widened(Kind::Read, 4096, 4096, 4096),
            s(Kind::Read, 4096, 8192)
        );
        let w = Span::widened(Kind::Read, u64::MAX - 1, 1, 512);
        assert!(w.start <= w.end);
    }

    #[test]
    fn the_rules() {
        let w = s(Kind::Write, 0, 512);
        let r = s(Kind::Read, 0, 512);
        let far = s(Kind::Write, 4096, 8192);
        let f = s(Kind::Flush, 0, 0);
        assert!(conflicts(&w, &r));
        assert!(conflicts(&r, &w));
        assert!(conflicts(&w, &w));
        assert!(!conflicts(&r, &r));
        assert!(!conflicts(&w, &far));
        assert!(conflicts(&far, &f), "flush waits for every earlier write");
        assert!(!conflicts(&r, &f), "flush does not wait for reads");
        assert!(!conflicts(&f, &w), "later writes do not wait for a flush");
        // Two 1-byte writes in one 512-byte block serialise after widening.
        let a = Span::widened(Kind::Write, 3, 1, 512);
        let b = Span::widened(Kind::Write, 300, 1, 512);
        assert!(conflicts(&a, &b));
    }
}
