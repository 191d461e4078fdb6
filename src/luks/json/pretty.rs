//! LUKS2 metadata printed as cryptsetup prints it (`luksDump
//! --dump-json-metadata`, `token export`): json-c's pretty style, two-space
//! indent, no space after the colon, `/` not escaped, an empty object or
//! array as the opening bracket, a newline and the closing one. Scripts
//! that compare or parse this text get the same bytes from udm.

use serde_json::Value;
use std::fmt::Write;

/// `v` in json-c's `JSON_C_TO_STRING_PRETTY | NOSLASHESCAPE` form, with no
/// trailing newline (cryptsetup prints none either).
pub fn to_pretty(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v, 0);
    out
}

fn indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

fn write_value(out: &mut String, v: &Value, level: usize) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(out, s),
        Value::Array(a) => {
            out.push_str("[\n");
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                write_value(out, e, level + 1);
            }
            if !a.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push(']');
        }
        Value::Object(o) => {
            out.push_str("{\n");
            for (i, (k, e)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\n");
                }
                indent(out, level + 1);
                write_string(out, k);
                out.push(':');
                write_value(out, e, level + 1);
            }
            if !o.is_empty() {
                out.push('\n');
            }
            indent(out, level);
            out.push('}');
        }
    }
}

/// Characters a header must not send to a terminal raw: controls (C0,
/// DEL, C1) and the invisible format characters that reorder or hide text.
pub fn hostile_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}'
        )
}

/// json-c's string escaping without slash escaping.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{c}' => out.push_str("\\f"),
            // json-c stops at 0x20; DEL, C1 and the invisible format
            // characters are escaped too, so a header cannot drive the
            // terminal through a JSON dump (normal headers print the same).
            c if (c as u32) < 0x20 || hostile_char(c) => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_c_layout() {
        let v: Value =
            serde_json::from_str(r#"{"a":{},"b":[],"c":["0"],"d":{"x":1,"y":"p/q\"r"}}"#).unwrap();
        assert_eq!(
            to_pretty(&v),
            "{\n  \"a\":{\n  },\n  \"b\":[\n  ],\n  \"c\":[\n    \"0\"\n  ],\n  \"d\":{\n    \"x\":1,\n    \"y\":\"p/q\\\"r\"\n  }\n}"
        );
    }
}
