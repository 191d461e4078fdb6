//! Building a mapped device from parsed table lines: each line's target
//! type is looked up in the targets' own list and constructed over the
//! devices its arguments name, and every error keeps the line and field.
//!
//! There is one way from a table to a device a client uses: [`build`]
//! makes the table's targets, `compile` turns them (and the stack under
//! them) into routes, and `Devices` puts the routes behind a
//! [`crate::dm::LiveDevice`]. Devices given on the command line
//! ([`DeviceSpec`]) take the same way as those created at runtime.

use std::path::PathBuf;
use std::sync::Arc;

use zeroize::Zeroizing;

use super::mapped::{MappedDevice, Segment};
use crate::core::table::{TableError, TableLine, SECTOR};
use crate::targets::{self, DeviceResolver, Target, TargetArgs, TargetOptions};

/// How a device given at start (`udm serve --table/--file/--luks`) is
/// defined, before it becomes a table for `Devices`.
pub enum DeviceSpec {
    /// dmsetup table text; `source` names where it came from, for errors.
    /// Zeroizing because a crypt table carries its key.
    Table {
        text: Zeroizing<String>,
        source: String,
    },
    /// A file, block device or remote image (`rbd:…`, `nbd://…`) served
    /// as it is.
    File(PathBuf),
}

/// How the stores under a server's tables are opened, and the targets'
/// options.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    pub read_only: bool,
    pub direct: bool,
    /// Never map tmpfs files (see `store::file`).
    pub no_mmap: bool,
    pub target: TargetOptions,
}

/// Build a mapped device from parsed lines: construct each target, check
/// the block-size alignment of every segment.
pub fn build(
    lines: &[TableLine],
    resolver: &mut dyn DeviceResolver,
    options: &TargetOptions,
) -> Result<MappedDevice, TableError> {
    let mut segments = Vec::with_capacity(lines.len());
    for l in lines {
        let ty = targets::lookup(&l.target).ok_or_else(|| {
            TableError::new(
                l.line_no,
                Some("target".into()),
                format!(
                    "unknown target type '{}'; udm supports {}",
                    l.target,
                    targets::type_names()
                ),
            )
        })?;
        crate::core::fault::inject_at("load", &l.target);
        let target: Arc<dyn Target> = (ty.new)(TargetArgs {
            args: &l.args,
            len: l.len * SECTOR,
            resolver,
            options,
        })
        .map_err(|e| {
            TableError::new(
                l.line_no,
                Some(match e.arg {
                    Some(i) => ty.arg_name(i),
                    None => l.target.clone(),
                }),
                e.msg,
            )
        })?;
        let lbs = target.limits().logical_block_size as u64;
        if lbs > SECTOR && ((l.start * SECTOR) % lbs != 0 || (l.len * SECTOR) % lbs != 0) {
            return Err(TableError::new(
                l.line_no,
                None,
                format!(
                    "segment [{}, +{}) is not aligned to its target's {lbs}-byte logical block size",
                    l.start, l.len
                ),
            ));
        }
        segments.push(Segment {
            start: l.start * SECTOR,
            len: l.len * SECTOR,
            target,
        });
    }
    Ok(MappedDevice::new(segments))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::table;
    use crate::core::BlockDevice;

    /// Found by the `table` fuzz target: a crypt cipher spec with a
    /// backslash (ECB ignores the ivmode text) and a device name with a
    /// space printed raw, so `table` output did not read back as the table.
    #[test]
    fn printed_table_reads_back() {
        struct Any;
        impl DeviceResolver for Any {
            fn resolve(&mut self, _: &str) -> Result<Arc<dyn BlockDevice>, String> {
                Ok(Arc::new(crate::store::MemStore::new(1 << 20)))
            }
        }
        let key = "00".repeat(16);
        let text = format!(
            "0 8 linear /tmp/a\\ b 0\n8 8 crypt aes-ecb-x\\\\y\\#z {key} 0 \\#d 0\n\
             16 16 striped 2 8 c\\\\d 0 e\\ f 8\n"
        );
        let lines = table::parse(&text).unwrap();
        assert_eq!(lines[1].args[0], "aes-ecb-x\\y#z");
        let opts = TargetOptions::default();
        let dev = build(&lines, &mut Any, &opts).unwrap();
        let shown = dev.table_text(true);
        let again = table::parse(&shown).unwrap();
        for (a, b) in lines.iter().zip(&again) {
            assert_eq!((a.start, a.len, &a.target), (b.start, b.len, &b.target));
        }
        assert_eq!(again[0].args, vec!["/tmp/a b", "0"]);
        assert_eq!(again[1].args[0], "aes-ecb-x\\y#z");
        assert_eq!(again[1].args[3], "#d");
        assert_eq!(again[2].args[2..], ["c\\d", "0", "e f", "8"]);
        assert_eq!(
            build(&again, &mut Any, &opts).unwrap().table_text(true),
            shown
        );
    }
}
