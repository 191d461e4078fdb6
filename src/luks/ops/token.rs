//! LUKS2 tokens (`token add|remove|import|export|unassign`): JSON objects
//! in the header that tell unlocking tools where a passphrase lives. udm
//! stores and checks them as cryptsetup does; of the built-in types it
//! knows `luks2-keyring` (a kernel keyring key description).

use super::Device;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::json::MAX_TOKENS;
use crate::luks::volume::{Header, Volume};
use serde_json::{Map, Value};

fn luks2(v: &Volume, dev: &Device) -> Result<(), LuksError> {
    match v.header {
        Header::Luks2(_) => Ok(()),
        Header::Luks1(_) => Err(LuksError::NotLuks2(dev.meta_path().display().to_string())),
    }
}

fn tokens(v: &Volume) -> Map<String, Value> {
    match &v.header {
        Header::Luks2(h) => h.meta.value["tokens"]
            .as_object()
            .cloned()
            .unwrap_or_default(),
        Header::Luks1(_) => Map::new(),
    }
}

fn keyslot_ids(v: &Volume) -> Vec<u32> {
    match &v.header {
        Header::Luks2(h) => {
            let mut k: Vec<u32> = h.meta.keyslots.keys().copied().collect();
            k.extend(h.meta.other_keyslots.keys());
            k.sort_unstable();
            k
        }
        Header::Luks1(_) => Vec::new(),
    }
}

/// Where a new token goes: `id`, or the first free number. A used id needs
/// `replace`.
fn token_slot(v: &Volume, id: Option<u32>, replace: bool) -> Result<u32, LuksError> {
    let t = tokens(v);
    match id {
        Some(n) if n >= MAX_TOKENS => Err(LuksError::Usage(format!("Token {n} is invalid."))),
        Some(n) if t.contains_key(&n.to_string()) && !replace => {
            Err(LuksError::Usage(format!("Token {n} in use.")))
        }
        Some(n) => Ok(n),
        None => (0..MAX_TOKENS)
            .find(|n| !t.contains_key(&n.to_string()))
            .ok_or_else(|| LuksError::Usage("No free token slot.".into())),
    }
}

fn check_slot(v: &Volume, slot: Option<u32>) -> Result<(), LuksError> {
    if let Some(s) = slot {
        if !keyslot_ids(v).contains(&s) {
            return Err(LuksError::Usage(format!("Keyslot {s} is not active.")));
        }
    }
    Ok(())
}

/// Validate a token object as cryptsetup does: a `type` string, a
/// `keyslots` array naming existing keyslots, and for the reserved
/// `luks2-` prefix only types udm knows (`luks2-keyring` with a
/// `key_description` string).
fn validate(v: &Volume, t: &Value) -> Result<(), LuksError> {
    let bad = |why: &str| LuksError::Usage(format!("Failed to import token from file ({why})."));
    let o = t.as_object().ok_or_else(|| bad("not a JSON object"))?;
    let ty = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no \"type\" string"))?;
    let ks = o
        .get("keyslots")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no \"keyslots\" array"))?;
    let ids = keyslot_ids(v);
    for k in ks {
        let n: Option<u32> = k.as_str().and_then(|s| s.parse().ok());
        if !n.is_some_and(|n| ids.contains(&n)) {
            return Err(bad(&format!("keyslot {k} does not exist")));
        }
    }
    if ty.starts_with("luks2-") {
        if ty != "luks2-keyring" {
            return Err(bad(&format!("unknown built-in token type {ty}")));
        }
        if !o.get("key_description").is_some_and(Value::is_string) {
            return Err(bad("luks2-keyring token without a key_description string"));
        }
    }
    Ok(())
}

/// Store `token` as number `n` and assign keyslot `slot` (None: every
/// keyslot, cryptsetup's `CRYPT_ANY_SLOT`; `assign` false: none).
fn store(
    v: &mut Volume,
    n: u32,
    token: Value,
    slot: Option<u32>,
    assign: bool,
) -> Result<(), LuksError> {
    let ids = keyslot_ids(v);
    v.edit_json("Tokens", |top| {
        let mut token = token;
        if assign {
            if let Some(arr) = token.get_mut("keyslots").and_then(Value::as_array_mut) {
                let add: Vec<u32> = match slot {
                    Some(s) => vec![s],
                    None => ids.clone(),
                };
                for s in add {
                    let s = Value::String(s.to_string());
                    if !arr.contains(&s) {
                        arr.push(s);
                    }
                }
            }
        }
        if let Some(t) = top.get_mut("tokens").and_then(Value::as_object_mut) {
            t.insert(n.to_string(), token);
        }
    })
}

/// `token add --key-description D`: a luks2-keyring token; returns its id.
pub fn add_keyring(
    dev: &Device,
    description: &str,
    id: Option<u32>,
    slot: Option<u32>,
    unbound: bool,
    replace: bool,
    fb: &dyn Feedback,
) -> Result<u32, LuksError> {
    let mut v = dev.load(true, fb)?;
    luks2(&v, dev)?;
    let n = token_slot(&v, id, replace)?;
    check_slot(&v, slot)?;
    let t = serde_json::json!({"type": "luks2-keyring", "keyslots": [], "key_description": description});
    store(&mut v, n, t, slot, !unbound)
        .map_err(|e| LuksError::Usage(format!("Failed to add luks2-keyring token {n} ({e}).")))?;
    Ok(n)
}

/// `token import`: a token from JSON text; returns its id.
pub fn import(
    dev: &Device,
    json: &[u8],
    id: Option<u32>,
    slot: Option<u32>,
    replace: bool,
    fb: &dyn Feedback,
) -> Result<u32, LuksError> {
    let mut v = dev.load(true, fb)?;
    luks2(&v, dev)?;
    let n = token_slot(&v, id, replace)?;
    check_slot(&v, slot)?;
    let t: Value = serde_json::from_slice(json)
        .map_err(|e| LuksError::Usage(format!("Failed to import token from file ({e}).")))?;
    validate(&v, &t)?;
    store(&mut v, n, t, slot, slot.is_some())?;
    Ok(n)
}

/// `token export`: the token's JSON as cryptsetup writes it (compact).
pub fn export(dev: &Device, id: u32, fb: &dyn Feedback) -> Result<String, LuksError> {
    let v = dev.load(false, fb)?;
    luks2(&v, dev)?;
    tokens(&v)
        .get(&id.to_string())
        .map(|t| serde_json::to_string(t).unwrap_or_default())
        .ok_or_else(|| LuksError::Usage(format!("Failed to get token {id} for export.")))
}

/// `token remove`.
pub fn remove(dev: &Device, id: u32, fb: &dyn Feedback) -> Result<(), LuksError> {
    let mut v = dev.load(true, fb)?;
    luks2(&v, dev)?;
    if id >= MAX_TOKENS {
        return Err(LuksError::Usage(format!("Token {id} is invalid.")));
    }
    if !tokens(&v).contains_key(&id.to_string()) {
        return Err(LuksError::Usage(format!("Token {id} is not in use.")));
    }
    v.edit_json("Tokens", |top| {
        if let Some(t) = top.get_mut("tokens").and_then(Value::as_object_mut) {
            t.shift_remove(&id.to_string());
        }
    })
}

/// `token unassign`: drop keyslot `slot` from token `id`.
pub fn unassign(dev: &Device, id: u32, slot: u32, fb: &dyn Feedback) -> Result<(), LuksError> {
    let mut v = dev.load(true, fb)?;
    luks2(&v, dev)?;
    let s = Value::String(slot.to_string());
    let assigned = tokens(&v)
        .get(&id.to_string())
        .and_then(|t| t["keyslots"].as_array().cloned())
        .is_some_and(|a| a.contains(&s));
    if !assigned {
        return Err(LuksError::Usage(format!(
            "Token {id} is not assigned to keyslot {slot}."
        )));
    }
    v.edit_json("Tokens", |top| {
        if let Some(a) = top
            .get_mut("tokens")
            .and_then(|t| t.get_mut(id.to_string()))
            .and_then(|t| t.get_mut("keyslots"))
            .and_then(Value::as_array_mut)
        {
            a.retain(|e| *e != s);
        }
    })
}
