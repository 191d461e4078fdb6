//! LUKS2 tokens (`token add|remove|import|export|unassign`): JSON objects
//! in the header that tell unlocking tools where a passphrase lives. udm
//! stores and checks them as cryptsetup does; of the built-in types it
//! knows `luks2-keyring` (a kernel keyring key description), and unlocks
//! with it: the key's bytes are tried as the passphrase of the token's
//! keyslots, in cryptsetup's order and with its errors.

use super::Device;
use super::VolumeKey;
use crate::luks::error::LuksError;
use crate::luks::feedback::Feedback;
use crate::luks::json::MAX_TOKENS;
use crate::luks::volume::{SlotUse, Volume};
use serde_json::{Map, Value};

fn luks2(v: &Volume, dev: &Device) -> Result<(), LuksError> {
    match v.header.luks2() {
        Some(_) => Ok(()),
        None => Err(LuksError::NotLuks2(dev.meta_path().display().to_string())),
    }
}

fn tokens(v: &Volume) -> Map<String, Value> {
    v.header
        .luks2()
        .and_then(|h| h.meta.value["tokens"].as_object().cloned())
        .unwrap_or_default()
}

fn keyslot_ids(v: &Volume) -> Vec<u32> {
    let Some(h) = v.header.luks2() else {
        return Vec::new();
    };
    let mut k: Vec<u32> = h.meta.keyslots.keys().copied().collect();
    k.extend(h.meta.other_keyslots.keys());
    k.sort_unstable();
    k
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

/// Whether tokens are tried before a passphrase is asked for, and which.
#[derive(Clone, Debug, Default)]
pub struct TokenUse {
    /// Try tokens first (cryptsetup's `open` and `luksResume` always do).
    pub try_first: bool,
    /// `--token-only`: no passphrase if no token unlocks.
    pub only: bool,
    /// `--token-id`.
    pub id: Option<u32>,
    /// `--token-type`.
    pub kind: Option<String>,
}

impl TokenUse {
    pub fn wanted(&self) -> bool {
        self.try_first || self.only
    }
}

/// Why no token unlocked, in cryptsetup's order of precedence: a token
/// whose passphrase opened none of its keyslots (exit 2) beats tokens that
/// could not be used at all (exit 1).
#[derive(Debug)]
pub enum TokenMiss {
    Unusable,
    Wrong,
    Failed(LuksError),
}

impl TokenMiss {
    /// The error `--token-only` ends with; cryptsetup prints its text in
    /// verbose mode only.
    pub fn into_error(self, t: &TokenUse) -> LuksError {
        match self {
            TokenMiss::Failed(e) => e,
            TokenMiss::Unusable => LuksError::Token {
                msg: match &t.kind {
                    Some(k) => format!("No usable token (type {k}) is available."),
                    None => "No usable token is available.".into(),
                },
                code: 1,
            },
            TokenMiss::Wrong => LuksError::Token {
                msg: match (t.id, &t.kind) {
                    (Some(n), _) => format!(
                        "Token {n} cannot unlock assigned keyslot(s) (wrong keyslot passphrase)."
                    ),
                    (None, Some(k)) => format!(
                        "Token (type {k}) cannot unlock assigned keyslot(s) (wrong keyslot passphrase)."
                    ),
                    (None, None) => String::new(),
                },
                code: 2,
            },
        }
    }
}

/// The keyslot numbers a token names, in its order.
fn token_keyslots(tok: &Value) -> Option<Vec<u32>> {
    tok.get("keyslots")?
        .as_array()?
        .iter()
        .map(|k| k.as_str().and_then(|s| s.parse().ok()))
        .collect()
}

/// Unlock with the volume's tokens as cryptsetup does: `--token-id` tries
/// that token alone; otherwise every token (of `--token-type`, if given)
/// in header order, first for keyslots of preferred priority, then for
/// normal ones. A keyslot that cannot serve (`usable`) is passed over.
pub fn unlock_by_token(
    v: &Volume,
    t: &TokenUse,
    usable: SlotUse,
) -> Result<(u32, VolumeKey), TokenMiss> {
    let toks = tokens(v);
    if let Some(n) = t.id {
        return match toks.get(&n.to_string()) {
            Some(tok) => try_token(v, tok, t, 0, usable),
            None => Err(TokenMiss::Unusable),
        };
    }
    let mut miss = TokenMiss::Unusable;
    for prio in [2, 1] {
        for tok in toks.values() {
            match try_token(v, tok, t, prio, usable) {
                Ok(r) => return Ok(r),
                Err(TokenMiss::Wrong) => miss = TokenMiss::Wrong,
                Err(TokenMiss::Unusable) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Err(miss)
}

/// One token, for keyslots of priority `prio` or higher.
fn try_token(
    v: &Volume,
    tok: &Value,
    t: &TokenUse,
    prio: u32,
    usable: SlotUse,
) -> Result<(u32, VolumeKey), TokenMiss> {
    let kind = tok.get("type").and_then(Value::as_str).unwrap_or("");
    if t.kind.as_deref().is_some_and(|k| k != kind) {
        return Err(TokenMiss::Unusable);
    }
    let Some(slots) = token_keyslots(tok) else {
        return Err(TokenMiss::Unusable);
    };
    let serves = |s: u32| {
        v.active_slots().contains(&s)
            && v.slot_priority(s) >= prio
            && (usable == SlotUse::Any || !v.slot_is_unbound(s))
    };
    if !slots.iter().any(|&s| serves(s)) {
        return Err(TokenMiss::Unusable);
    }
    // The one handler built into cryptsetup that udm has too.
    let desc = match (kind, tok.get("key_description").and_then(Value::as_str)) {
        ("luks2-keyring", Some(d)) => d,
        _ => return Err(TokenMiss::Unusable),
    };
    let pass = crate::luks::keyring::user_key(desc).map_err(|_| TokenMiss::Wrong)?;
    let mut miss = TokenMiss::Unusable;
    for s in slots.into_iter().filter(|&s| v.slot_priority(s) >= prio) {
        match v.unlock_for(&pass, Some(s), usable) {
            Ok(r) => return Ok(r),
            Err(LuksError::WrongPassphrase) => miss = TokenMiss::Wrong,
            Err(LuksError::NoUsableKeyslot) => {}
            Err(e) => return Err(TokenMiss::Failed(e)),
        }
    }
    Err(miss)
}
