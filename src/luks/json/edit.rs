//! Changes to LUKS2 JSON metadata. Each edit works on a copy of the JSON
//! value and re-validates the result, so a change that would produce a
//! header udm (or cryptsetup) refuses to read is never written.

use super::Metadata;
use crate::luks::error::LuksError;
use serde_json::{Map, Value};

impl Metadata {
    /// A validated copy of this metadata with `f` applied to the JSON.
    pub fn edit(
        &self,
        hdr_size: u64,
        f: impl FnOnce(&mut Map<String, Value>),
    ) -> Result<Metadata, LuksError> {
        let mut v = self.value.clone();
        if let Some(top) = v.as_object_mut() {
            f(top);
        }
        Metadata::parse(v, hdr_size)
    }

    /// A copy with keyslot `slot` added (JSON `ks`) and bound to digest `digest`.
    pub fn with_keyslot(
        &self,
        hdr_size: u64,
        slot: u32,
        ks: Value,
        digest: u32,
    ) -> Result<Metadata, LuksError> {
        self.edit(hdr_size, |top| {
            if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                k.insert(slot.to_string(), ks);
            }
            if let Some(d) = top
                .get_mut("digests")
                .and_then(|d| d.get_mut(digest.to_string()))
                .and_then(|d| d.get_mut("keyslots"))
                .and_then(Value::as_array_mut)
            {
                d.push(Value::String(slot.to_string()));
            }
        })
    }

    /// A copy without keyslot `slot`; digests and tokens forget it, and a
    /// digest left with no keyslot and no segment (an unbound key's) goes,
    /// as cryptsetup erases unused digests on every header write.
    pub fn without_keyslot(&self, hdr_size: u64, slot: u32) -> Result<Metadata, LuksError> {
        let name = slot.to_string();
        self.edit(hdr_size, |top| {
            if let Some(k) = top.get_mut("keyslots").and_then(Value::as_object_mut) {
                k.shift_remove(&name);
            }
            for group in ["digests", "tokens"] {
                if let Some(g) = top.get_mut(group).and_then(Value::as_object_mut) {
                    for (_, item) in g.iter_mut() {
                        if let Some(a) = item.get_mut("keyslots").and_then(Value::as_array_mut) {
                            a.retain(|e| e.as_str() != Some(name.as_str()));
                        }
                    }
                }
            }
            let empty = |d: &Value, key: &str| {
                d.get(key)
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.is_empty())
            };
            if let Some(ds) = top.get_mut("digests").and_then(Value::as_object_mut) {
                ds.retain(|_, d| !(empty(d, "keyslots") && empty(d, "segments")));
            }
        })
    }
}
