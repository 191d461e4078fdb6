//! Repairing a hotzone a crash interrupted: from the checksums (blocks
//! whose hash still matches were not rewritten yet) or from the journal,
//! as cryptsetup's recovery does; a moved hotzone is simply moved again.

use serde_json::Value;

use super::{Job, Outcome, RECOVERY_CHUNK};
use crate::luks::error::LuksError;
use crate::luks::reencrypt::segments;
use crate::luks::reencrypt::state::Resilience;

impl<'a> Job<'a> {
    /// Repair an interrupted hotzone (the header holds a hot table),
    /// commit the post table, and finish if that was the last one.
    pub fn recover(&mut self) -> Result<Outcome, LuksError> {
        self.live(false)?;
        let z = self.zone;
        let prot = self.protection();
        // What recovery reads from the keyslot area must lie inside it.
        let need = match prot {
            Resilience::Checksum { hash, block } => {
                z.length / u64::from(block) * hash.digest_len() as u64
            }
            Resilience::Journal => z.length,
            _ => 0,
        };
        if need > self.st.area_size {
            return Err(LuksError::field(
                format!("keyslots.{}.area.size", self.st.slot),
                self.st.area_size,
                format!("smaller than the {need} bytes the interrupted hotzone needs"),
            ));
        }
        let mut done = if self.moving() {
            self.move_zone(false)?;
            z.length
        } else {
            0u64
        };
        while done < z.length {
            let n = RECOVERY_CHUNK.min(z.length - done);
            let at = z.offset + done;
            let mut buf = zeroize::Zeroizing::new(vec![0u8; n as usize]);
            match prot {
                Resilience::Checksum { hash, block } => {
                    let hl = hash.digest_len() as u64;
                    let blocks = n / u64::from(block);
                    let mut sums = vec![0u8; (blocks * hl) as usize];
                    let first = done / u64::from(block);
                    self.vol
                        .meta
                        .read_at(self.st.area_offset + first * hl, &mut sums)?;
                    self.data.read_at(z.data_offset + at, &mut buf)?;
                    for (i, b) in buf.chunks_mut(block as usize).enumerate() {
                        let want = &sums[i * hl as usize..(i + 1) * hl as usize];
                        if hash.digest(&[b]) == want {
                            let bat = at + i as u64 * u64::from(block);
                            self.transform(b, bat);
                            self.data.write_at(z.data_offset + bat, b)?;
                        }
                    }
                }
                Resilience::Journal => {
                    self.vol
                        .meta
                        .read_at(self.st.area_offset + done, &mut buf)?;
                    self.transform(&mut buf, at);
                    self.data.write_at(z.data_offset + at, &buf)?;
                }
                Resilience::Datashift { .. } => {
                    return Err(LuksError::Usage(
                        "Interrupted hotzone cannot be recovered: an encryption in place with \
                         resilience datashift (a detached header with --reduce-device-size) \
                         keeps no copy of it."
                            .into(),
                    ))
                }
                _ => {
                    return Err(LuksError::Usage(
                        "Interrupted hotzone cannot be recovered: resilience mode none.".into(),
                    ))
                }
            }
            done += n;
        }
        self.data.sync()?;
        let current: Vec<Value> = self.regular()?.into_iter().map(|(_, v)| v).collect();
        let post = if let Some((_, m, _)) = self.unshift {
            segments::post_unshift(&self.st, &z, m, &current)
        } else if self.shift.is_some() {
            segments::post_shift(&z, &current)
        } else {
            segments::post(&self.st, &z, &current)
        };
        self.set_segments(post, false)?;
        self.st.hot = None;
        self.live(true)?;
        self.advance();
        if self.progress >= self.zone.size {
            return self.finish();
        }
        self.commit()?;
        Ok(Outcome::Interrupted)
    }
}
