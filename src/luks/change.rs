//! Header changes that are not keyslot material: UUID, label and
//! subsystem, keyslot priority, renumbering, and arbitrary LUKS2 JSON edits
//! (tokens, config). Each rewrites the header through the same two-copy
//! write path as keyslot changes, so a crash leaves one valid copy.

use super::error::LuksError;
use super::format::check_uuid;
use super::volume::Volume;
use serde_json::{Map, Value};

impl Volume {
    /// Apply `f` to the LUKS2 JSON top-level object, validate the result
    /// and write the header. LUKS1 has no JSON: an error naming the verb.
    pub fn edit_json(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Map<String, Value>),
    ) -> Result<(), LuksError> {
        let Some(h) = self.header.luks2_mut() else {
            return Err(LuksError::Usage(format!(
                "{what} is supported only for LUKS2 devices."
            )));
        };
        h.meta = h.meta.edit(h.bin.hdr_size, f)?;
        self.write_header()
    }

    /// Set the UUID (`luksUUID --uuid`).
    pub fn set_uuid(&mut self, uuid: &str) -> Result<(), LuksError> {
        check_uuid(uuid)?;
        self.header.set_uuid(uuid);
        self.write_header()
    }

    /// Set the LUKS2 label and/or subsystem (`config --label/--subsystem`);
    /// None leaves a field as it is.
    pub fn set_label(
        &mut self,
        label: Option<&str>,
        subsystem: Option<&str>,
    ) -> Result<(), LuksError> {
        for (n, v) in [("Label", label), ("Subsystem", subsystem)] {
            if v.is_some_and(|v| v.len() >= 48) {
                return Err(LuksError::Usage(format!(
                    "{n} is too long (at most 47 bytes)."
                )));
            }
        }
        let Some(h) = self.header.luks2_mut() else {
            return Err(LuksError::Usage(
                "Label is supported only for LUKS2 devices.".into(),
            ));
        };
        if let Some(l) = label {
            h.bin.label = l.to_string();
        }
        if let Some(s) = subsystem {
            h.bin.subsystem = s.to_string();
        }
        self.write_header()
    }

    /// Set a LUKS2 keyslot's priority: 0 ignore, 1 normal, 2 prefer.
    /// cryptsetup stores normal by removing the member.
    pub fn set_priority(&mut self, slot: u32, priority: u32) -> Result<(), LuksError> {
        let known = self.header.luks2().is_some() && self.header.slot_taken(slot);
        if !known {
            return Err(LuksError::Usage(format!("Keyslot {slot} is not active.")));
        }
        self.edit_json("Keyslot priority", |top| {
            if let Some(k) = top
                .get_mut("keyslots")
                .and_then(|k| k.get_mut(slot.to_string()))
                .and_then(Value::as_object_mut)
            {
                if priority == 1 {
                    k.shift_remove("priority");
                } else {
                    k.insert("priority".into(), Value::from(priority));
                }
            }
        })
    }

    /// Give keyslot `to` every token assignment keyslot `from` has (before
    /// a swap, so tokens follow a changed passphrase). Writes nothing.
    pub(crate) fn copy_token_assignment(&mut self, from: u32, to: u32) -> Result<(), LuksError> {
        let Some(h) = self.header.luks2_mut() else {
            return Ok(());
        };
        let (f, t) = (
            Value::String(from.to_string()),
            Value::String(to.to_string()),
        );
        h.meta = h.meta.edit(h.bin.hdr_size, |top| {
            if let Some(g) = top.get_mut("tokens").and_then(Value::as_object_mut) {
                for (_, item) in g.iter_mut() {
                    if let Some(arr) = item.get_mut("keyslots").and_then(Value::as_array_mut) {
                        if arr.contains(&f) && !arr.contains(&t) {
                            arr.push(t.clone());
                        }
                    }
                }
            }
        })?;
        Ok(())
    }

    /// Exchange the JSON objects of LUKS2 keyslots `a` and `b` (their
    /// material and KDF, not their digest or token membership), as
    /// cryptsetup does to keep a changed passphrase under its old number;
    /// both end up last in the object, in cryptsetup's order. Writes
    /// nothing: the caller's next header write carries it.
    pub(crate) fn swap_luks2_slots(&mut self, a: u32, b: u32) -> Result<(), LuksError> {
        let Some(h) = self.header.luks2_mut() else {
            return Ok(());
        };
        let (sa, sb) = (a.to_string(), b.to_string());
        h.meta = h.meta.edit(h.bin.hdr_size, |top| {
            if let Some(ks) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                let va = ks.shift_remove(&sa);
                let vb = ks.shift_remove(&sb);
                if let (Some(va), Some(vb)) = (va, vb) {
                    ks.insert(sa.clone(), vb);
                    ks.insert(sb.clone(), va);
                }
            }
        })?;
        Ok(())
    }
}
