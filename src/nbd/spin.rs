//! When an event loop busy-polls for the next request, and when it backs
//! off and sleeps in `epoll_wait` instead (see `reactor`'s module doc for
//! why it polls at all).
//!
//! Why adaptive: polling pays only while the loop has a core to itself
//! and the client answers within the window. On a machine whose cores are
//! taken by other processes, every `sched_yield` between polls hands the
//! core to one of them for a whole time slice (a millisecond or more), and
//! the loop, having used its share spinning, is then scheduled behind them
//! when its client's request does arrive: 4 KiB reads at QD1 fell far
//! behind nbdkit under load (docs/BENCHMARKS.md), whose thread sleeps in
//! `recv` and is woken by the kernel. And a client slower than
//! the window (a request every few hundred microseconds) gains nothing
//! from a poll that ends before its request comes, while it costs a core.
//! So polling stops for [`BACKOFF`] when a yield came back late (someone
//! else wanted the core) or when [`MISSES`] windows in a row ended with
//! nothing; it is tried again after that.

use std::time::{Duration, Instant};

/// A yield that took longer than this gave the core to another runnable
/// thread for its time slice (the scheduler's slice is 0.75 ms and up): a
/// yield to nobody returns in about a microsecond, one to the client on
/// the same core (it takes its reply and sends the next request) in tens.
pub const STOLEN: Duration = Duration::from_micros(200);

/// Windows in a row that found nothing before polling backs off.
pub const MISSES: u32 = 4;

/// How long polling stays off after contention or a run of misses: long
/// enough that trying again costs little (one slice lost per try under
/// load), short enough to be back soon after the load goes.
pub const BACKOFF: Duration = Duration::from_millis(100);

/// One loop's polling state.
#[derive(Debug)]
pub struct Spin {
    /// The window (`--poll-us`); zero: never poll.
    window: Duration,
    /// Poll (zero timeouts) until then.
    until: Instant,
    /// No new window before then.
    off_until: Option<Instant>,
    /// Windows in a row that ended without an event.
    misses: u32,
    /// The current window has seen an event.
    hit: bool,
    /// Whether a window is open (`until` is meaningful).
    open: bool,
    /// Times polling backed off for contention, and for misses (for tests
    /// and the debug log).
    pub contended: u64,
    pub idle_backoffs: u64,
}

impl Spin {
    pub fn new(window: Duration) -> Spin {
        let now = Instant::now();
        Spin {
            window,
            until: now,
            off_until: None,
            misses: 0,
            hit: false,
            open: false,
            contended: 0,
            idle_backoffs: 0,
        }
    }

    /// Whether the next `epoll_wait` should return at once (poll) rather
    /// than sleep. A window that has run out without an event counts as a
    /// miss here.
    pub fn polling(&mut self, now: Instant) -> bool {
        if !self.open {
            return false;
        }
        if now < self.until {
            return true;
        }
        self.close(now);
        false
    }

    /// A round of the loop had events (or wake-ups) and every request it
    /// started finished on the loop: open a window for the next request,
    /// unless polling is backed off. `workers_busy`: requests were left on
    /// workers (or in a device's queue), whose completion wakes the loop;
    /// polling would take a core from them, so the window closes.
    pub fn after_round(&mut self, now: Instant, events: bool, workers_busy: bool) {
        if self.window.is_zero() {
            return;
        }
        if events && self.open {
            self.hit = true;
        }
        if workers_busy {
            self.until = now;
            return;
        }
        if events && self.off_until.is_none_or(|t| now >= t) {
            if !self.open {
                self.open = true;
                self.hit = false;
            }
            self.until = now + self.window;
        }
    }

    /// A zero-timeout poll found nothing: yield the core, and back off if
    /// the yield shows another thread wanted it.
    pub fn idle_poll(&mut self) {
        let t0 = Instant::now();
        std::thread::yield_now();
        let took = t0.elapsed();
        self.yielded(Instant::now(), took);
    }

    /// The bookkeeping of [`Spin::idle_poll`], given how long the yield took.
    pub fn yielded(&mut self, now: Instant, took: Duration) {
        if took > STOLEN {
            self.contended += 1;
            self.back_off(now);
        }
    }

    fn close(&mut self, now: Instant) {
        self.open = false;
        if self.hit {
            self.misses = 0;
            return;
        }
        self.misses += 1;
        if self.misses >= MISSES {
            self.idle_backoffs += 1;
            self.back_off(now);
        }
    }

    fn back_off(&mut self, now: Instant) {
        self.open = false;
        self.hit = false;
        self.misses = 0;
        self.until = now;
        self.off_until = Some(now + BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(50);

    #[test]
    fn polls_after_events_until_the_window_ends() {
        let t = Instant::now();
        let mut s = Spin::new(W);
        assert!(!s.polling(t), "no window before any event");
        s.after_round(t, true, false);
        assert!(s.polling(t + W / 2));
        assert!(!s.polling(t + W), "the window has ended");
        // Requests left on workers end the window at once.
        s.after_round(t + W, true, false);
        s.after_round(t + W, true, true);
        assert!(!s.polling(t + W + Duration::from_micros(1)));
        // Zero window: never.
        let mut z = Spin::new(Duration::ZERO);
        z.after_round(t, true, false);
        assert!(!z.polling(t));
    }

    #[test]
    fn a_late_yield_backs_off_for_a_while() {
        let t = Instant::now();
        let mut s = Spin::new(W);
        s.after_round(t, true, false);
        // A yield to the client on the same core: still polling.
        s.yielded(t, Duration::from_micros(30));
        assert!(s.polling(t + Duration::from_micros(31)));
        // A yield that lost the core for a slice: stop, and stay off.
        let t1 = t + Duration::from_micros(40);
        s.yielded(t1, Duration::from_millis(2));
        assert_eq!(s.contended, 1);
        assert!(!s.polling(t1));
        s.after_round(t1 + BACKOFF / 2, true, false);
        assert!(!s.polling(t1 + BACKOFF / 2), "backed off");
        let t2 = t1 + BACKOFF;
        s.after_round(t2, true, false);
        assert!(s.polling(t2), "tried again after the backoff");
    }

    #[test]
    fn windows_that_find_nothing_back_off_and_hits_reset_the_count() {
        let mut t = Instant::now();
        let mut s = Spin::new(W);
        // A client slower than the window: each window ends empty.
        for i in 0..MISSES {
            s.after_round(t, true, false);
            assert!(s.polling(t), "window {i}");
            t += W * 3;
            assert!(!s.polling(t));
        }
        assert_eq!(s.idle_backoffs, 1);
        s.after_round(t, true, false);
        assert!(!s.polling(t), "backed off after {MISSES} empty windows");
        // After the backoff, a client that answers inside the window keeps
        // polling on indefinitely.
        t += BACKOFF;
        for _ in 0..3 * MISSES {
            s.after_round(t, true, false);
            t += W / 2;
            s.after_round(t, true, false);
            assert!(s.polling(t));
            t += W * 2;
            assert!(!s.polling(t));
        }
        assert_eq!(s.idle_backoffs, 1, "windows with an event are no misses");
    }
}
