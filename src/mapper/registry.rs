//! The set of named devices a server exports, built from tables and files.
//!
//! Tables may name another device of the same server as `@NAME` (stacking,
//! e.g. crypt over striped). Devices are built on demand in dependency
//! order; a cycle is refused with the chain that forms it. Paths are opened
//! once and shared, so two segments over one file use one descriptor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zeroize::Zeroizing;

use super::mapped::MappedDevice;
use crate::core::table;
use crate::core::BlockDevice;
use crate::store::{Location, OpenFlags};
use crate::targets::{DeviceResolver, TargetOptions};

/// How one named device is defined.
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

/// Options for building.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    pub read_only: bool,
    pub direct: bool,
    /// Never map tmpfs files (see `store::file`).
    pub no_mmap: bool,
    pub target: TargetOptions,
}

/// A built device.
pub struct Entry {
    pub name: String,
    pub device: Arc<dyn BlockDevice>,
    /// Set for table devices, for `table` output.
    pub mapped: Option<Arc<MappedDevice>>,
}

/// All devices of a server, in the order they were specified.
pub struct Registry {
    pub entries: Vec<Entry>,
}

/// A built device and, for tables, its mapped form.
type Built = (Arc<dyn BlockDevice>, Option<Arc<MappedDevice>>);

struct Builder {
    specs: Vec<(String, Option<DeviceSpec>)>,
    built: HashMap<String, Built>,
    building: Vec<String>,
    files: HashMap<PathBuf, Arc<dyn BlockDevice>>,
    opts: BuildOptions,
}

impl Registry {
    /// Build every device. Names must be unique and non-empty.
    pub fn build(specs: Vec<(String, DeviceSpec)>, opts: BuildOptions) -> Result<Registry, String> {
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &specs {
            if name.is_empty() || name.contains(char::is_whitespace) || name.starts_with('@') {
                return Err(format!(
                    "invalid device name '{name}': use a non-empty name without spaces or a leading '@'"
                ));
            }
            if !seen.insert(name.clone()) {
                return Err(format!("device name '{name}' is used twice"));
            }
        }
        let order: Vec<String> = specs.iter().map(|(n, _)| n.clone()).collect();
        let mut b = Builder {
            specs: specs.into_iter().map(|(n, s)| (n, Some(s))).collect(),
            built: HashMap::new(),
            building: Vec::new(),
            files: HashMap::new(),
            opts,
        };
        for name in &order {
            b.build_named(name)?;
        }
        let entries = order
            .into_iter()
            .map(|name| {
                let (device, mapped) = b.built.remove(&name).expect("every name was built");
                Entry {
                    name,
                    device,
                    mapped,
                }
            })
            .collect();
        Ok(Registry { entries })
    }

    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }
}

impl Builder {
    fn build_named(&mut self, name: &str) -> Result<Arc<dyn BlockDevice>, String> {
        if let Some((d, _)) = self.built.get(name) {
            return Ok(d.clone());
        }
        if self.building.iter().any(|n| n == name) {
            let mut chain = self.building.clone();
            chain.push(name.to_string());
            return Err(format!(
                "device '{name}' depends on itself: {}",
                chain.join(" -> @")
            ));
        }
        let idx = self
            .specs
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| format!("no device named '{name}' is defined on this server"))?;
        let spec = self.specs[idx]
            .1
            .take()
            .ok_or_else(|| format!("device '{name}' could not be built"))?;
        self.building.push(name.to_string());
        let result = match &spec {
            DeviceSpec::File(path) => self.open_file(path).map(|d| (d, None)),
            DeviceSpec::Table { text, source } => {
                let opts = self.opts.target.clone();
                table::parse(text)
                    .and_then(|lines| super::build(&lines, self, &opts))
                    .map(|m| {
                        let m = Arc::new(m);
                        (m.clone() as Arc<dyn BlockDevice>, Some(m))
                    })
                    .map_err(|e| format!("device '{name}' (table {source}): {e}"))
            }
        };
        self.building.pop();
        let (dev, mapped) = result?;
        self.built.insert(name.to_string(), (dev.clone(), mapped));
        Ok(dev)
    }

    /// Open a path (a file, or a remote image: `store::Location`), once.
    fn open_file(&mut self, path: &Path) -> Result<Arc<dyn BlockDevice>, String> {
        let flags = OpenFlags {
            read_only: self.opts.read_only,
            direct: self.opts.direct,
            no_map: self.opts.no_mmap,
        };
        open_shared(&mut self.files, path, flags)
    }
}

/// Open the file, block device or remote image (`store::Location`) at
/// `path` as a store, once: `files` (keyed by canonical path, or by the
/// remote spec) hands out the store already opened, so two segments over
/// one file share one descriptor and over one image one connection.
pub(super) fn open_shared(
    files: &mut HashMap<PathBuf, Arc<dyn BlockDevice>>,
    path: &Path,
    flags: OpenFlags,
) -> Result<Arc<dyn BlockDevice>, String> {
    let loc = match path.to_str() {
        Some(s) => Location::parse(s)?,
        None => Location::File(path.to_path_buf()),
    };
    let key = loc.share_key(&path.to_string_lossy())?;
    if let Some(d) = files.get(&key) {
        return Ok(d.clone());
    }
    let loc = match loc {
        Location::File(_) => Location::File(key.clone()),
        remote => remote,
    };
    let d = loc.open(flags)?;
    files.insert(key, d.clone());
    Ok(d)
}

impl DeviceResolver for Builder {
    fn resolve(&mut self, spec: &str) -> Result<Arc<dyn BlockDevice>, String> {
        match spec.strip_prefix('@') {
            Some(name) => self.build_named(name),
            None => self.open_file(Path::new(spec)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tbl(s: &str) -> DeviceSpec {
        DeviceSpec::Table {
            text: Zeroizing::new(s.to_string()),
            source: "test".into(),
        }
    }

    #[test]
    fn stacking_and_cycles() {
        let r = Registry::build(
            vec![
                ("top".into(), tbl("0 8 linear @base 8\n")),
                ("base".into(), tbl("0 16 zero\n")),
            ],
            BuildOptions::default(),
        )
        .unwrap();
        assert_eq!(r.get("top").unwrap().device.size(), 4096);
        let e = Registry::build(
            vec![
                ("a".into(), tbl("0 8 linear @b 0\n")),
                ("b".into(), tbl("0 8 linear @a 0\n")),
            ],
            BuildOptions::default(),
        )
        .err()
        .unwrap();
        assert!(e.contains("depends on itself"), "{e}");
        let e = Registry::build(
            vec![("a".into(), tbl("0 8 linear @zz 0\n"))],
            BuildOptions::default(),
        )
        .err()
        .unwrap();
        assert!(e.contains("no device named 'zz'"), "{e}");
    }

    #[test]
    fn area_must_fit() {
        let e = Registry::build(
            vec![
                ("top".into(), tbl("0 16 linear @base 8\n")),
                ("base".into(), tbl("0 16 zero\n")),
            ],
            BuildOptions::default(),
        )
        .err()
        .unwrap();
        assert!(e.contains("does not fit"), "{e}");
        assert!(e.contains("line 1"), "{e}");
    }
}
