//! Checking a table before serving it (`udm table check`).
//!
//! Every line goes through its target's own constructor, exactly as a real
//! build does, so the check applies the targets' own rules — argument
//! counts, the key length against the cipher, stripe count against the
//! devices given, chunk size, sector_size and iv_offset alignment, feature
//! arguments — and cannot drift from them. Only the devices differ: by
//! default each device argument gets a placeholder that fits any area and
//! refuses all I/O, so nothing is opened; with [`CheckDevices::OpenReadOnly`]
//! paths are opened read-only, so the areas are checked against the real
//! sizes and block sizes too.

use std::sync::Arc;

use super::compile::Files;
use crate::core::device::Refusing;
use crate::core::table::{TableError, TableLine};
use crate::core::BlockDevice;
use crate::store::{Location, OpenFlags};
use crate::targets::{DeviceResolver, TargetOptions};

/// What a check does with the devices a table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckDevices {
    /// Open nothing: every device is a placeholder of unlimited size.
    Placeholders,
    /// Open paths read-only and check every area against the device's
    /// size. `@NAME` (another device of a server) stays a placeholder: its
    /// size is known only when the server builds it.
    OpenReadOnly,
}

/// Check parsed table lines; the error names the line and the field.
pub fn check(lines: &[TableLine], devices: CheckDevices) -> Result<(), TableError> {
    let mut resolver = CheckResolver {
        open: devices == CheckDevices::OpenReadOnly,
        files: Files::default(),
        placeholder: placeholder(),
    };
    // One crypt thread: a check needs no worker pool.
    let options = TargetOptions {
        crypt_threads: 1,
        ..Default::default()
    };
    super::build(lines, &mut resolver, &options).map(drop)
}

struct CheckResolver {
    open: bool,
    files: Files,
    placeholder: Arc<dyn BlockDevice>,
}

impl DeviceResolver for CheckResolver {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if spec.starts_with('@') {
            return Ok(self.placeholder.clone());
        }
        if !self.open {
            // The path's syntax (a remote image's URI) is checked, nothing
            // is opened.
            Location::parse(spec)?;
            return Ok(self.placeholder.clone());
        }
        let flags = OpenFlags {
            read_only: true,
            direct: false,
            no_map: true,
        };
        self.files.open(spec, flags)
    }
}

/// A device that was not opened: large enough for any area, 512-byte
/// blocks, and no I/O (a check never reads or writes).
fn placeholder() -> Arc<dyn BlockDevice> {
    Arc::new(Refusing {
        size: u64::MAX,
        why: "I/O on a device that a table check did not open",
        line: (),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::table::parse;

    fn err(text: &str) -> TableError {
        check(&parse(text).unwrap(), CheckDevices::Placeholders)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"))
    }

    /// The integrity constructor reads a superblock; over a placeholder it
    /// checks the line against a stand-in and reads nothing.
    #[test]
    fn integrity_lines_check_without_devices() {
        let ok = "0 96736 integrity /nonexistent/v.img 32768 32 J 3 block_size:4096 \
                  fix_padding fix_hmac\n";
        check(&parse(ok).unwrap(), CheckDevices::Placeholders).unwrap();
        let crc = "0 2048 integrity /nonexistent/v.img 0 - D 1 internal_hash:crc32c\n";
        check(&parse(crc).unwrap(), CheckDevices::Placeholders).unwrap();
        let e = err("0 2048 integrity /nonexistent/v.img 0 4 J 1 block_size:1000\n");
        assert!(e.to_string().contains("block_size"), "{e}");
        let e = err("0 2048 integrity /nonexistent/v.img 0 - J 0\n");
        assert!(e.to_string().contains("tag size"), "{e}");
    }

    /// A thin line names a pool that only a server builds: the check
    /// applies both lines' own rules without one.
    #[test]
    fn thin_pool_and_thin_lines_check_without_devices() {
        let ok = "0 2048 thin-pool /nonexistent/m /nonexistent/d 128 0 \
                  2 skip_block_zeroing error_if_no_space\n";
        check(&parse(ok).unwrap(), CheckDevices::Placeholders).unwrap();
        for ok in [
            "0 4096 thin @pool 0\n",
            "0 4096 thin @pool 7 /nonexistent/o\n",
        ] {
            check(&parse(ok).unwrap(), CheckDevices::Placeholders).unwrap();
        }
        for (text, field, word) in [
            (
                "0 2048 thin-pool /m /d 100 0\n",
                "argument 3 (data block size)",
                "multiple of 128",
            ),
            (
                "0 2048 thin-pool /m /d 128 0 1 no_such\n",
                "argument 6",
                "unknown feature",
            ),
            (
                "0 4096 thin @pool x\n",
                "argument 2 (dev id)",
                "thin device id",
            ),
            (
                "0 4096 thin @pool 16777216\n",
                "argument 2 (dev id)",
                "too large",
            ),
            ("0 4096 thin @pool\n", "thin", "pool dev"),
        ] {
            let e = err(text);
            assert!(
                e.field.as_deref().is_some_and(|f| f.starts_with(field)),
                "{text}: {e}"
            );
            assert!(e.msg.contains(word), "{text}: {e}");
        }
    }

    #[test]
    fn constructors_rules_apply_without_devices() {
        let k64 = "ab".repeat(64);
        let ok = format!(
            "0 8 linear /nonexistent/a 0\n8 16 striped 2 8 /x 0 @y 8\n\
             24 8 crypt aes-xts-plain64 {k64} 0 /nonexistent/b 0 1 allow_discards\n32 8 zero\n"
        );
        check(&parse(&ok).unwrap(), CheckDevices::Placeholders).unwrap();
        for (text, line, field, word) in [
            (
                format!("0 8 crypt aes-xts-plain64 {} 0 /d 0\n", "ab".repeat(24)),
                1,
                "argument 2 (key)",
                "XTS key",
            ),
            (
                "0 8 zero\n8 24 striped 3 8 /a 0 /b 0\n".to_string(),
                2,
                "argument 1 (#stripes)",
                "3 stripes",
            ),
            (
                "0 24 striped 2 8 /a 0 /b 0\n".to_string(),
                1,
                "striped",
                "divisible",
            ),
            (
                format!("0 8 crypt aes-xts-plain64 {k64} 1 /d 0 1 sector_size:4096\n"),
                1,
                "argument 3 (iv_offset)",
                "multiple",
            ),
            (
                format!("0 8 crypt aes-xts-plain64 {k64} 0 /d 0 1 no_such_feature\n"),
                1,
                "argument 7",
                "unknown optional parameter",
            ),
            (
                "0 8 linear nbd://host:99999/x 0\n".to_string(),
                1,
                "argument 1 (device)",
                "bad NBD URI",
            ),
            (
                "0 8 nosuch a b\n".to_string(),
                1,
                "target",
                "unknown target type",
            ),
        ] {
            let e = err(&text);
            assert_eq!(e.line, line, "{text}: {e}");
            assert_eq!(e.field.as_deref(), Some(field), "{text}: {e}");
            assert!(e.msg.contains(word), "{text}: {e}");
            assert!(!e.to_string().contains("abab"), "key in the error: {e}");
        }
    }
}
