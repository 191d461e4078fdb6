//! Moving hotzones: steps 1-4 of the module doc for each, in place or,
//! with a data shift, from the old place to the new one; and the run
//! loop, which stops between hotzones when asked.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use super::{shift_zone, Job, Outcome, UDM_MAX_HOTZONE};
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::reencrypt::segments;
use crate::luks::reencrypt::state::{Direction, Resilience};

impl<'a> Job<'a> {
    /// The hot and post tables of the current hotzone.
    fn tables(&mut self) -> Result<(Vec<Value>, Vec<Value>), LuksError> {
        let z = self.zone;
        let current = self.regular()?;
        Ok(if let Some((shift, m, _)) = self.unshift {
            let hot = segments::hot_unshift(&self.st, &z, shift, m, &current);
            let post = segments::post_unshift(&self.st, &z, m, &hot);
            (hot, post)
        } else if self.shift.is_some() {
            let hot = segments::hot_shift(&self.st, &z, &current);
            let post = segments::post_shift(&z, &hot);
            (hot, post)
        } else {
            let hot = segments::hot(&self.st, &z, &current);
            let post = segments::post(&self.st, &z, &hot);
            (hot, post)
        })
    }

    /// Read the hotzone's plaintext from where the data shift left it,
    /// encrypt it and write it at its new place, in pieces; `crash`: stop
    /// halfway (test hook).
    pub(super) fn move_zone(&mut self, crash: bool) -> Result<(), LuksError> {
        let z = self.zone;
        let src = match (self.shift, self.unshift) {
            (Some((_, m_off, _)), _) if z.offset == 0 => m_off,
            (Some((shift, _, _)), _) => z.data_offset + z.offset - shift,
            (None, Some((shift, _, _))) => z.data_offset + z.offset + shift,
            _ => return Err(LuksError::Usage("not a data shift".into())),
        };
        let dst = z.data_offset + z.offset;
        let stop_at = if crash {
            (z.length / 2) & !4095
        } else {
            u64::MAX
        };
        let mut done = 0u64;
        while done < z.length {
            let n = UDM_MAX_HOTZONE.min(z.length - done);
            let mut buf = zeroize::Zeroizing::new(vec![0u8; n as usize]);
            self.data.read_at(src + done, &mut buf)?;
            self.transform(&mut buf, z.offset + done);
            if done + n > stop_at {
                let part = (stop_at - done) as usize;
                self.data.write_at(dst + done, &buf[..part])?;
                self.data.sync()?;
                return Err(LuksError::Usage(format!(
                    "simulated crash inside hotzone {} (test hook)",
                    self.steps
                )));
            }
            self.data.write_at(dst + done, &buf)?;
            done += n;
        }
        self.data.sync()
    }

    /// One hotzone that moves data (no copy of the old bytes is needed:
    /// the source stays intact until the post table is written).
    fn step_shift(&mut self) -> Result<(), LuksError> {
        // Online, clients must not write the source while it is copied:
        // the device waits from before the hot table to the reload.
        self.live(false)?;
        let (hot, post) = self.tables()?;
        self.set_segments(hot, true)?;
        self.commit()?;
        let crash = self.crash_in == Some(self.steps);
        self.move_zone(crash)?;
        self.steps += 1;
        self.set_segments(post, false)?;
        self.commit()?;
        self.live(true)
    }

    /// One hotzone, steps 1-4 of the module doc.
    fn step(&mut self) -> Result<(), LuksError> {
        if self.moving() {
            return self.step_shift();
        }
        self.live(false)?;
        let z = self.zone;
        let (hot, post) = self.tables()?;
        self.set_segments(hot, true)?;
        let len = usize::try_from(z.length).map_err(|_| LuksError::Usage("hotzone".into()))?;
        let mut buf = zeroize::Zeroizing::new(vec![0u8; len]);
        self.data.read_at(z.data_offset + z.offset, &mut buf)?;
        let prot = self.protection();
        match prot {
            Resilience::Checksum { hash, block } => {
                let mut sums = Vec::with_capacity(len / block as usize * hash.digest_len());
                for b in buf.chunks(block as usize) {
                    sums.extend_from_slice(&hash.digest(&[b]));
                }
                let off = self.st.area_offset;
                self.vol.meta.write_at(off, &sums)?;
                self.commit()?;
            }
            Resilience::Journal => {
                let off = self.st.area_offset;
                self.vol.meta.write_at(off, &buf)?;
                self.commit()?;
            }
            // In place under datashift (detached header): the hot table
            // is committed, as cryptsetup commits it, but nothing keeps
            // the old bytes.
            Resilience::Datashift { .. } => self.commit()?,
            Resilience::None => self.none_dirty = true,
        }
        self.transform(&mut buf, z.offset);
        if self.crash_in == Some(self.steps) {
            let half = (len / 2) & !4095;
            self.data.write_at(z.data_offset + z.offset, &buf[..half])?;
            self.data.sync()?;
            return Err(LuksError::Usage(format!(
                "simulated crash inside hotzone {} (test hook)",
                self.steps
            )));
        }
        self.steps += 1;
        self.data.write_at(z.data_offset + z.offset, &buf)?;
        if prot != Resilience::None {
            self.data.sync()?;
        }
        self.set_segments(post, false)?;
        if prot != Resilience::None {
            self.commit()?;
        }
        self.live(true)
    }

    /// Move to the next hotzone (cryptsetup's context update).
    pub(super) fn advance(&mut self) {
        let z = &mut self.zone;
        self.progress += z.length;
        if let Some((shift, _, m_size)) = self.shift {
            (z.offset, z.length) = shift_zone(z.offset, shift, m_size);
            return;
        }
        if let Some((shift, m_size, _)) = self.unshift {
            // Forward from the moved segment's end; the moved segment last.
            z.offset = if z.offset == 0 {
                z.size
            } else {
                z.offset + z.length
            };
            if z.offset >= z.size {
                z.offset = 0;
                z.length = m_size;
            } else {
                z.length = shift.min(z.size - z.offset);
            }
            return;
        }
        match self.st.direction {
            Direction::Forward => {
                z.offset += z.length;
                z.length = z.length.min(z.size - z.offset);
            }
            Direction::Backward => {
                if z.offset < z.length {
                    z.length = z.offset;
                }
                z.offset -= z.length;
            }
        }
    }

    /// Whether a stop must wait for the next hotzone: cryptsetup 2.6.1
    /// cannot resume a decryption with data shift resting just before a
    /// moved segment smaller than the shift (it sizes that hotzone by the
    /// shift and fails), so udm never leaves the header there.
    fn must_go_on(&self) -> bool {
        self.unshift
            .is_some_and(|(shift, m, _)| m < shift && self.zone.offset == 0)
    }

    /// Run hotzones until done or `stop` is set (checked between them).
    pub fn run(&mut self, stop: &AtomicBool, fb: &dyn Feedback) -> Result<Outcome, LuksError> {
        fb.begin("Reencrypting", self.zone.size);
        fb.advance(self.progress);
        let mut r = Ok(());
        while self.progress < self.zone.size && (!stop.load(Ordering::Relaxed) || self.must_go_on())
        {
            r = self.step();
            if r.is_err() {
                break;
            }
            self.advance();
            fb.advance(self.progress);
        }
        fb.end();
        r?;
        if self.progress >= self.zone.size {
            return self.finish();
        }
        if self.none_dirty {
            self.commit()?;
        }
        Ok(Outcome::Interrupted)
    }
}
