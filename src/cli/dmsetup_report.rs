//! dmsetup's report fields (`info -c -o FIELDS`, `-o help`), its name
//! splitting (`splitname`, the `subsystem`/`vg_name`/`lv_name`/`lv_layer`
//! fields) and its `--concise` device lists, for `cli/dmsetup.rs`. A leaf:
//! it knows the control socket's result types and nothing of the verbs.

use crate::control::model::{DeviceInfo, MAJOR};

/// Read-ahead a device reports, in 512-byte sectors: the kernel's default
/// for a dm device. udm devices are NBD exports; read-ahead belongs to the
/// client's block device (`blockdev --setra` there), so it is fixed.
pub const READ_AHEAD: u32 = 256;

/// A section of `-o help`: title, its `*_all` name, fields and their help.
type Section = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The fields `-o` takes and their help lines, by section, in dmsetup's
/// order (the statistics fields, which need dm-stats regions, are not
/// among them: `dmsetup status --stats` has udm's counters).
const SECTIONS: &[Section] = &[
    (
        "Mapped Device Name Fields",
        "name_all",
        &[
            ("name", "Name of mapped device."),
            ("mangled_name", "Mangled name of mapped device."),
            ("unmangled_name", "Unmangled name of mapped device."),
            ("uuid", "Unique (optional) identifier for mapped device."),
            (
                "mangled_uuid",
                "Mangled unique (optional) identifier for mapped device.",
            ),
            (
                "unmangled_uuid",
                "Unmangled unique (optional) identifier for mapped device.",
            ),
            ("read_ahead", "Read ahead value."),
        ],
    ),
    (
        "Mapped Device Information Fields",
        "info_all",
        &[
            ("blkdevname", "Name of block device."),
            (
                "attr",
                "(L)ive, (I)nactive, (s)uspended, (r)ead-only, read-(w)rite.",
            ),
            (
                "tables_loaded",
                "Which of the live and inactive table slots are filled.",
            ),
            ("suspended", "Whether the device is suspended."),
            ("readonly", "Whether the device is read-only or writeable."),
            ("devno", "Device major and minor numbers"),
            ("major", "Block device major number."),
            ("minor", "Block device minor number."),
            ("open", "Number of references to open device, if requested."),
            ("segments", "Number of segments in live table, if present."),
            ("events", "Number of most recent event."),
        ],
    ),
    (
        "Mapped Device Relationship Information Fields",
        "deps_all",
        &[
            ("device_count", "Number of devices used by this one."),
            (
                "devs_used",
                "List of names of mapped devices used by this one.",
            ),
            (
                "devnos_used",
                "List of device numbers of devices used by this one.",
            ),
            (
                "blkdevs_used",
                "List of names of block devices used by this one.",
            ),
            (
                "device_ref_count",
                "Number of mapped devices referencing this one.",
            ),
            (
                "names_using_dev",
                "List of names of mapped devices using this one.",
            ),
            (
                "devnos_using_dev",
                "List of device numbers of mapped devices using this one.",
            ),
        ],
    ),
    (
        "Mapped Device Name Components Fields",
        "splitname_all",
        &[
            (
                "subsystem",
                "Userspace subsystem responsible for this device.",
            ),
            ("vg_name", "LVM Volume Group name."),
            ("lv_name", "LVM Logical Volume name."),
            ("lv_layer", "LVM device layer."),
        ],
    ),
];

/// `-o help`: the field list as dmsetup prints it.
pub fn help() -> String {
    let mut out = String::new();
    for (title, all, fields) in SECTIONS {
        out.push_str(&format!("{title}\n{}\n", "-".repeat(title.len())));
        out.push_str(&format!("  {all:<21} - All fields in this section.\n"));
        for (f, h) in *fields {
            out.push_str(&format!("  {f:<21} - {h}\n"));
        }
        out.push_str(" \n");
    }
    out.push_str(
        "Special Fields\n--------------\n  help                  - Show help.\n  \
         ?                     - Show help.\n \n",
    );
    out
}

/// The field ids of a `-o` list, with `*_all` expanded. `Err` names an
/// unknown field.
pub fn expand(spec: &str) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for id in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some((_, _, fields)) = SECTIONS.iter().find(|(_, all, _)| *all == id) {
            out.extend(fields.iter().map(|(f, _)| *f));
            continue;
        }
        match SECTIONS
            .iter()
            .flat_map(|(_, _, f)| f.iter())
            .find(|(f, _)| *f == id)
        {
            Some((f, _)) => out.push(*f),
            None => {
                return Err(format!(
                    "Unrecognised field: {id} (dmsetup info -c -o help lists them; \
                     statistics fields are not reported by udm: use dmsetup status --stats)"
                ))
            }
        }
    }
    Ok(out)
}

/// Heading, default width and whether the values are right-aligned.
pub fn heading(id: &str) -> (&'static str, usize, bool) {
    match id {
        "name" => ("Name", 16, false),
        "mangled_name" => ("MangledName", 16, false),
        "unmangled_name" => ("UnmangledName", 16, false),
        "uuid" => ("UUID", 32, false),
        "mangled_uuid" => ("MangledUUID", 32, false),
        "unmangled_uuid" => ("UnmangledUUID", 32, false),
        "read_ahead" => ("RAhead", 6, true),
        "blkdevname" => ("BlkDevName", 16, false),
        "attr" => ("Stat", 4, false),
        "tables_loaded" => ("Tables", 6, false),
        "suspended" => ("Suspended", 9, false),
        "readonly" => ("Read-only", 9, false),
        "devno" => ("DevNo", 5, false),
        "major" => ("Maj", 3, true),
        "minor" => ("Min", 3, true),
        "open" => ("Open", 4, true),
        "segments" => ("Targ", 4, true),
        "events" => ("Event", 6, true),
        "device_count" => ("#Devs", 5, true),
        "devs_used" => ("DevNamesUsed", 16, false),
        "devnos_used" => ("DevNosUsed", 16, false),
        "blkdevs_used" => ("BlkDevNamesUsed", 16, false),
        "device_ref_count" => ("#Refs", 5, true),
        "names_using_dev" => ("RefNames", 8, false),
        "devnos_using_dev" => ("RefDevNos", 9, false),
        "subsystem" => ("Subsys", 6, false),
        "vg_name" => ("VG", 4, false),
        "lv_name" => ("LV", 4, false),
        "lv_layer" => ("LVLayer", 7, false),
        _ => ("?", 1, false),
    }
}

fn yes_no(b: bool, yes: &str, no: &str) -> String {
    if b { yes } else { no }.to_string()
}

/// The devices using `d` (a table of theirs names it).
fn users<'a>(d: &DeviceInfo, all: &'a [DeviceInfo]) -> Vec<&'a DeviceInfo> {
    all.iter()
        .filter(|o| {
            o.deps
                .iter()
                .any(|x| x.kind == "device" && x.name == d.name)
        })
        .collect()
}

/// Field `id` of device `d` (`all`: every device, for the reverse
/// relations).
pub fn value(id: &str, d: &DeviceInfo, all: &[DeviceInfo]) -> String {
    let list = |it: Vec<String>| it.join(",");
    match id {
        "name" | "mangled_name" | "unmangled_name" => d.name.clone(),
        "uuid" | "mangled_uuid" | "unmangled_uuid" => d.uuid.clone(),
        "read_ahead" => READ_AHEAD.to_string(),
        // No block device: an NBD export has none until a client makes one.
        "blkdevname" => String::new(),
        "attr" => format!(
            "{}{}{}{}",
            if d.live_table { 'L' } else { '-' },
            if d.inactive_table { 'I' } else { '-' },
            if d.suspended { 's' } else { '-' },
            if d.read_only { 'r' } else { 'w' }
        ),
        "tables_loaded" => match (d.live_table, d.inactive_table) {
            (true, true) => "Both",
            (true, false) => "Live",
            (false, true) => "Inactive",
            (false, false) => "None",
        }
        .to_string(),
        "suspended" => yes_no(d.suspended, "Suspended", "Active"),
        "readonly" => yes_no(d.read_only, "Read-only", "Writeable"),
        "devno" => format!("{MAJOR}:{}", d.minor),
        "major" => MAJOR.to_string(),
        "minor" => d.minor.to_string(),
        "open" => d.open_count.to_string(),
        "segments" => d.target_count.to_string(),
        "events" => d.event_nr.to_string(),
        "device_count" => d.deps.len().to_string(),
        "devs_used" => list(
            d.deps
                .iter()
                .filter(|x| x.kind == "device")
                .map(|x| x.name.clone())
                .collect(),
        ),
        "devnos_used" => list(
            d.deps
                .iter()
                .map(|x| match x.minor {
                    Some(m) => format!("{MAJOR}:{m}"),
                    None => x.name.clone(),
                })
                .collect(),
        ),
        "blkdevs_used" => list(
            d.deps
                .iter()
                .filter(|x| x.kind == "path")
                .map(|x| x.name.clone())
                .collect(),
        ),
        "device_ref_count" => users(d, all).len().to_string(),
        "names_using_dev" => list(users(d, all).iter().map(|u| u.name.clone()).collect()),
        "devnos_using_dev" => list(
            users(d, all)
                .iter()
                .map(|u| format!("{MAJOR}:{}", u.minor))
                .collect(),
        ),
        "subsystem" => subsystem(&d.uuid).to_string(),
        "vg_name" | "lv_name" | "lv_layer" => {
            if subsystem(&d.uuid) != "LVM" {
                return String::new();
            }
            let (vg, lv, layer) = split_lvm_name(&d.name);
            match id {
                "vg_name" => vg,
                "lv_name" => lv,
                _ => layer,
            }
        }
        _ => String::new(),
    }
}

/// The subsystem a uuid names: its upper-case prefix before `-`
/// (`LVM-…`, `CRYPT-…`), as libdevmapper reads it.
pub fn subsystem(uuid: &str) -> &str {
    match uuid.split_once('-') {
        Some((p, _))
            if !p.is_empty() && p.len() <= 8 && p.bytes().all(|b| b.is_ascii_uppercase()) =>
        {
            p
        }
        _ => "",
    }
}

/// An LVM device name's volume group, logical volume and layer: split at
/// single dashes, a doubled dash standing for a dash in a name.
pub fn split_lvm_name(name: &str) -> (String, String, String) {
    let mut parts = vec![String::new()];
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '-' && chars.peek() != Some(&'-') && parts.len() < 3 {
            parts.push(String::new());
            continue;
        }
        if c == '-' && chars.peek() == Some(&'-') {
            chars.next();
        }
        if let Some(p) = parts.last_mut() {
            p.push(c);
        }
    }
    parts.resize(3, String::new());
    (parts[0].clone(), parts[1].clone(), parts[2].clone())
}

/// One device of a `--concise` list: `name,uuid,minor,flags,table[,table]`.
#[derive(Debug, PartialEq, Eq)]
pub struct ConciseDevice {
    pub name: String,
    pub uuid: String,
    pub read_only: bool,
    /// Table lines.
    pub lines: Vec<String>,
}

/// Split `text` at unescaped `sep`, unescaping `\,` `\;` `\\`.
fn split_escaped(text: &str, sep: char) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let cur = out.last_mut().expect("never empty");
        match c {
            // Kept escaped: each field is unescaped once split.
            '\\' => {
                cur.push('\\');
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c == sep => out.push(String::new()),
            c => cur.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('\\', Some(n @ (',' | ';' | '\\'))) => {
                out.push(n);
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// Append `s` with `,` `;` `\` escaped (no temporary copies: table
/// lines may hold keys).
fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if matches!(c, ',' | ';' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// Parse dmsetup's `--concise` device list (`create --concise`).
pub fn parse_concise(text: &str) -> Result<Vec<ConciseDevice>, String> {
    let mut out = Vec::new();
    for dev in split_escaped(text.trim(), ';') {
        let f = split_escaped(&dev, ',');
        if f.len() < 5 {
            return Err(format!(
                "--concise: '{}' needs name,uuid,minor,flags,table[,table...]",
                unescape(&dev)
            ));
        }
        let flags = unescape(&f[3]);
        let read_only = match flags.as_str() {
            "ro" => true,
            "" | "rw" => false,
            other => {
                return Err(format!(
                    "--concise: device '{}': flags must be ro or rw, got '{other}'",
                    unescape(&f[0])
                ))
            }
        };
        if !f[2].is_empty() {
            return Err(format!(
                "--concise: device '{}': udm devices are named, not numbered; leave the \
                 minor empty",
                unescape(&f[0])
            ));
        }
        out.push(ConciseDevice {
            name: unescape(&f[0]),
            uuid: unescape(&f[1]),
            read_only,
            lines: f[4..].iter().map(|l| unescape(l)).collect(),
        });
    }
    Ok(out)
}

/// Append a device as `table --concise` prints it (without the `;`).
/// `out` should have room for twice the lines' length, so that it never
/// grows and leaves a copy of a key behind.
pub fn push_concise(out: &mut String, d: &DeviceInfo, lines: &[&str]) {
    push_escaped(out, &d.name);
    out.push(',');
    push_escaped(out, &d.uuid);
    out.push_str(&format!(
        ",{},{}",
        d.minor,
        if d.read_only { "ro" } else { "rw" }
    ));
    for l in lines {
        out.push(',');
        push_escaped(out, l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvm_names_split_at_single_dashes() {
        let s = |n: &str| split_lvm_name(n);
        assert_eq!(
            s("vg-lv_da--ta"),
            ("vg".into(), "lv_da-ta".into(), "".into())
        );
        assert_eq!(
            s("vg-lv-layer-x"),
            ("vg".into(), "lv".into(), "layer-x".into())
        );
        assert_eq!(s("plain"), ("plain".into(), "".into(), "".into()));
        assert_eq!(subsystem("LVM-abc"), "LVM");
        assert_eq!(subsystem("CRYPT-LUKS2-x"), "CRYPT");
        assert_eq!(subsystem("lower-x"), "");
    }

    #[test]
    fn concise_lists_round_trip_with_escapes() {
        let l = parse_concise("a,,,rw,0 8 zero,8 8 error;b\\,x,CRYPT-1,,ro,0 2048 linear /p\\;q 0")
            .unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].lines, ["0 8 zero", "8 8 error"]);
        assert_eq!(l[1].name, "b,x");
        assert!(l[1].read_only);
        assert_eq!(l[1].lines, ["0 2048 linear /p;q 0"]);
        assert!(parse_concise("a,,3,rw,0 8 zero").is_err(), "minor refused");
        assert!(parse_concise("a,,,xx,0 8 zero").is_err());
        assert!(parse_concise("a,,,rw").is_err());
        let d: DeviceInfo = serde_json::from_value(serde_json::json!({
            "name": "b,x", "uuid": "u", "major": 0, "minor": 4, "read_only": true,
            "suspended": false, "live_table": true, "inactive_table": false,
            "deferred_remove": false, "open_count": 0, "event_nr": 0, "target_count": 1,
            "target_types": ["linear"], "size_sectors": 8, "deps": [], "allow": []
        }))
        .unwrap();
        let mut out = String::new();
        push_concise(&mut out, &d, &["0 8 linear /p;q 0"]);
        assert_eq!(out, "b\\,x,u,4,ro,0 8 linear /p\\;q 0");
        let back = parse_concise(&out.replace(",4,", ",,")).unwrap();
        assert_eq!(back[0].lines, ["0 8 linear /p;q 0"]);
        assert_eq!(value("names_using_dev", &d, std::slice::from_ref(&d)), "");
        assert_eq!(value("read_ahead", &d, &[]), "256");
    }

    #[test]
    fn field_lists_expand_groups_and_name_unknown_fields() {
        assert_eq!(expand("splitname_all").unwrap().len(), 4);
        assert!(expand("name,+x").unwrap_err().contains("+x"));
        assert!(expand("read_count").unwrap_err().contains("status --stats"));
        let h = help();
        assert!(h.starts_with("Mapped Device Name Fields\n-------------------------\n"));
        assert!(h.contains(
            "  names_using_dev       - List of names of mapped devices using this one.\n"
        ));
    }
}
