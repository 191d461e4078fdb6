//! The end of a reencryption: the moved data's old place overwritten
//! with random bytes, and the reencryption metadata dropped from the
//! header in one write.

use serde_json::{Map, Value};

use super::{Job, Outcome, RECOVERY_CHUNK};
use crate::luks::error::LuksError;

impl<'a> Job<'a> {
    /// Drop the reencryption metadata once every byte has moved, as
    /// cryptsetup's teardown does: keyslots of the old key (when it
    /// changed), the backup segments, the requirement flag, the reencrypt
    /// keyslot and its digest. One header write; the old keyslots' areas
    /// are wiped only after no header names them.
    pub(super) fn finish(&mut self) -> Result<Outcome, LuksError> {
        self.wipe_moved_source()?;
        let st = self.st.clone();
        let h = self.header()?;
        let hdr_size = h.bin.hdr_size;
        let old_slots: Vec<(u32, u64, u64)> = match st.digest_old {
            Some(d) if st.digest_new != Some(d) => h
                .meta
                .digests
                .get(&d)
                .map(|dg| {
                    dg.keyslots
                        .iter()
                        .filter_map(|s| {
                            h.meta
                                .keyslots
                                .get(s)
                                .map(|k| (*s, k.area_offset, k.area_size))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let mut gone: Vec<String> = old_slots.iter().map(|s| s.0.to_string()).collect();
        gone.push(st.slot.to_string());
        h.meta = h.meta.edit(hdr_size, |top| drop_reencryption(top, &gone))?;
        self.commit()?;
        for (_, off, len) in old_slots {
            self.vol.meta.zero(off, len, &mut |_| {})?;
        }
        self.vol.meta.sync()?;
        Ok(Outcome::Finished)
    }

    /// The place data moved away from still holds it (the plaintext's
    /// start for an encryption with data shift, ciphertext for a
    /// decryption): overwritten with random bytes, as cryptsetup's
    /// teardown does.
    fn wipe_moved_source(&mut self) -> Result<(), LuksError> {
        if let Some((_, m_off, m_size)) = self.shift {
            // The moved segment still holds the start of the plaintext:
            // overwritten with random bytes, as cryptsetup's teardown does.
            let mut done = 0u64;
            while done < m_size {
                let n = RECOVERY_CHUNK.min(m_size - done);
                let noise = crate::luks::keyslot::random(n as usize)?;
                self.data.write_at(m_off + done, &noise)?;
                done += n;
            }
            self.data.sync()?;
        }
        if let Some((shift, _, _)) = self.unshift {
            // The last `shift` bytes of the device held ciphertext that
            // has moved down: overwritten with random bytes, as
            // cryptsetup's teardown does.
            let dev = self.vol.data_size;
            let mut at = dev.saturating_sub(shift);
            while at < dev {
                let n = RECOVERY_CHUNK.min(dev - at);
                let noise = crate::luks::keyslot::random(n as usize)?;
                self.data.write_at(at, &noise)?;
                at += n;
            }
            self.data.sync()?;
        }
        Ok(())
    }
}

/// The header edit of the teardown: keyslots `gone` removed (also from
/// digests and tokens), backup segments dropped (also from digests),
/// digests left without keyslots dropped, the reencryption requirement
/// removed.
fn drop_reencryption(top: &mut Map<String, Value>, gone: &[String]) {
    if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
        for g in gone {
            k.shift_remove(g);
        }
    }
    for group in ["digests", "tokens"] {
        if let Some(g) = top.get_mut(group).and_then(Value::as_object_mut) {
            for (_, item) in g.iter_mut() {
                if let Some(a) = item.get_mut("keyslots").and_then(Value::as_array_mut) {
                    a.retain(|e| !gone.iter().any(|g| e.as_str() == Some(g)));
                }
            }
        }
    }
    let mut keep = Map::new();
    let mut dropped = Vec::new();
    if let Some(segs) = top.get("segments").and_then(Value::as_object) {
        for (k, v) in segs {
            let backup = v["flags"].as_array().is_some_and(|f| {
                f.iter()
                    .any(|x| x.as_str().is_some_and(|s| s.starts_with("backup-")))
            });
            if backup {
                dropped.push(k.clone());
            } else {
                keep.insert(k.clone(), v.clone());
            }
        }
    }
    top.insert("segments".into(), Value::Object(keep));
    if let Some(ds) = top.get_mut("digests").and_then(Value::as_object_mut) {
        for d in ds.values_mut() {
            if let Some(a) = d.get_mut("segments").and_then(Value::as_array_mut) {
                a.retain(|e| !dropped.iter().any(|g| e.as_str() == Some(g)));
            }
        }
        ds.retain(|_, d| d["keyslots"].as_array().is_some_and(|a| !a.is_empty()));
    }
    if let Some(cfg) = top.get_mut("config").and_then(Value::as_object_mut) {
        let mut empty = false;
        if let Some(m) = cfg
            .get_mut("requirements")
            .and_then(|r| r.get_mut("mandatory"))
            .and_then(Value::as_array_mut)
        {
            m.retain(|r| {
                !r.as_str()
                    .is_some_and(|s| s.starts_with("online-reencrypt"))
            });
            empty = m.is_empty();
        }
        if empty {
            cfg.shift_remove("requirements");
        }
    }
}
