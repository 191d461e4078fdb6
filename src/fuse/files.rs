//! What the mapper directory shows: one regular file per export, read from
//! the export set at every lookup (so a device created, removed or resized
//! shows at once; nothing is cached in the kernel), with its inode number,
//! size, owner and mode.
//!
//! Inode numbers follow the device, not the name: a name re-created over
//! another device gets a new number, so a process holding the old file
//! never reaches the new device through a stale inode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};

use crate::nbd::export::{Allow, Peer, PeerKind};
use crate::nbd::{ExportSet, Exported};

/// The directory's own inode.
pub(super) const ROOT: u64 = 1;

/// Whether a name can be a file name in the directory.
pub(super) fn listable(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// The identity of an export's device: its engine queue (shared by the
/// entries a rename or a restriction makes).
fn key(e: &Exported) -> usize {
    Arc::as_ptr(&e.queue) as usize
}

/// File mode bits from the export's access: group and others get the
/// owner's bits only when the rules admit every local user (`unix` in
/// each); no rule, `uid:N`, network and `tls` rules leave the file to its
/// owner (the open check then admits the users the rules name). No rule
/// is not "everyone": over NBD the socket's own mode (0600) keeps other
/// users out, so the file, which needs no socket, must too.
pub(super) fn mode_of(e: &Exported) -> u16 {
    let owner = if e.export.is_read_only() { 0o4 } else { 0o6 };
    if local_user_allowed(e, None) {
        owner * 0o111
    } else {
        owner * 0o100
    }
}

/// Whether the user `uid` may open the export's file: the server's own
/// user always (it can reach the device anyway), anyone else as a Unix
/// socket client of that user would be admitted over NBD.
pub(super) fn admits(e: &Exported, uid: u32, server_uid: u32) -> bool {
    uid == server_uid || local_user_allowed(e, Some(uid))
}

/// Whether the export's rules admit a Unix socket client of user `uid`
/// (`None`: a user no `uid:` rule names), as the NBD handshake would,
/// and there is a rule at all: an export without one is its server
/// user's alone here.
fn local_user_allowed(e: &Exported, uid: Option<u32>) -> bool {
    let peer = Peer {
        kind: PeerKind::Unix,
        ip: None,
        uid,
    };
    e.has_rules() && e.allows(&peer, false)
}

/// Whether any user but `server_uid` could be admitted to the export:
/// every rule has a `unix` entry or a `uid:` entry naming someone else.
fn admits_others(e: &Exported, server_uid: u32) -> bool {
    let rules = e.rules();
    !rules.is_empty()
        && rules.iter().all(|r| {
            r.iter()
                .any(|a| matches!(a, Allow::Unix) || matches!(a, Allow::Uid(u) if *u != server_uid))
        })
}

/// Inode numbers of the exports seen so far.
pub(super) struct Files {
    pub exports: Arc<ExportSet>,
    inodes: Mutex<Inodes>,
    pub uid: u32,
    pub gid: u32,
    /// The mount's time: the files' times (a device has no mtime of its own).
    pub since: SystemTime,
}

#[derive(Default)]
struct Inodes {
    by_key: HashMap<usize, u64>,
    by_ino: HashMap<u64, usize>,
    next: u64,
}

impl Files {
    pub(super) fn new(exports: Arc<ExportSet>) -> Files {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Files {
            exports,
            inodes: Mutex::new(Inodes {
                next: ROOT + 1,
                ..Inodes::default()
            }),
            uid,
            gid,
            since: SystemTime::now(),
        }
    }

    /// The inode number of `e`, given on first sight.
    pub(super) fn ino(&self, e: &Exported) -> u64 {
        let mut t = self.inodes.lock().unwrap_or_else(|p| p.into_inner());
        let k = key(e);
        if let Some(&i) = t.by_key.get(&k) {
            return i;
        }
        // Forget devices that are gone (their queue address may be reused).
        let live: Vec<usize> = self.exports.list().iter().map(|x| key(x)).collect();
        t.by_key.retain(|k, _| live.contains(k));
        let Inodes { by_key, by_ino, .. } = &mut *t;
        by_ino.retain(|_, k| by_key.contains_key(k));
        let i = t.next;
        t.next += 1;
        t.by_key.insert(k, i);
        t.by_ino.insert(i, k);
        i
    }

    /// The export named `name`, if it is in the directory.
    pub(super) fn by_name(&self, name: &str) -> Option<Arc<Exported>> {
        if !listable(name) {
            return None;
        }
        self.exports.find(name.as_bytes())
    }

    /// The export behind inode `ino`, while its device is exported.
    pub(super) fn by_ino(&self, ino: u64) -> Option<Arc<Exported>> {
        let k = *self
            .inodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_ino
            .get(&ino)?;
        self.exports
            .list()
            .into_iter()
            .find(|e| key(e) == k && listable(&e.export.name))
    }

    /// The export named `name` if user `uid` may open it: to anyone else
    /// the name does not exist, as NBD_OPT_LIST does not show it.
    pub(super) fn by_name_for(&self, name: &str, uid: u32) -> Option<Arc<Exported>> {
        self.by_name(name).filter(|e| admits(e, uid, self.uid))
    }

    /// The files user `uid` may open, in the order the devices were added.
    pub(super) fn list_for(&self, uid: u32) -> Vec<(u64, String)> {
        self.visible(uid)
            .iter()
            .map(|e| (self.ino(e), e.export.name.clone()))
            .collect()
    }

    /// The exports in the directory that user `uid` may open.
    pub(super) fn visible(&self, uid: u32) -> Vec<Arc<Exported>> {
        self.exports
            .list()
            .into_iter()
            .filter(|e| listable(&e.export.name) && admits(e, uid, self.uid))
            .collect()
    }

    /// Whether users other than the server's may enter the directory at
    /// all: only when some export's rules admit one.
    pub(super) fn root_open(&self) -> bool {
        self.exports
            .list()
            .iter()
            .any(|e| listable(&e.export.name) && admits_others(e, self.uid))
    }

    pub(super) fn file_attr(&self, e: &Exported) -> FileAttr {
        let size = e.export.device.size();
        let block = e.export.device.limits().logical_block_size.max(512);
        self.attr(self.ino(e), FileType::RegularFile, size, mode_of(e), block)
    }

    /// 0700 unless an export admits other users (then 0755: they list
    /// only what they may open, `readdir`).
    pub(super) fn root_attr(&self) -> FileAttr {
        let perm = if self.root_open() { 0o755 } else { 0o700 };
        self.attr(ROOT, FileType::Directory, 0, perm, 4096)
    }

    fn attr(&self, ino: u64, kind: FileType, size: u64, perm: u16, blksize: u32) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.since,
            mtime: self.since,
            ctime: self.since,
            crtime: self.since,
            kind,
            perm,
            nlink: if kind == FileType::Directory { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize,
            flags: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nbd::export::{parse_allow_list, AccessPolicy};
    use crate::nbd::Export;
    use crate::store::MemStore;

    fn files(policy: AccessPolicy) -> Files {
        Files::new(Arc::new(policy.test_set()))
    }

    fn add(f: &Files, name: &str, ro: bool) -> Arc<Exported> {
        f.exports
            .add(Export {
                name: name.into(),
                description: String::new(),
                device: Arc::new(MemStore::new(1 << 20)),
                read_only: ro,
            })
            .unwrap()
    }

    #[test]
    fn modes_follow_read_only_and_the_rules() {
        let f = files(AccessPolicy {
            names: vec![("mine".into(), parse_allow_list("uid:1000").unwrap())],
            ..AccessPolicy::default()
        });
        let open = add(&f, "open", false);
        assert_eq!(
            mode_of(&open),
            0o600,
            "no rule admits only the server's user"
        );
        assert!(!admits(&open, 1000, 0), "no rule admitted another user");
        assert!(!f.root_open(), "no export admits others: the root is 0700");
        assert_eq!(f.root_attr().perm, 0o700);
        assert_eq!(mode_of(&add(&f, "ro", true)), 0o400);
        let mine = add(&f, "mine", false);
        assert_eq!(mode_of(&mine), 0o600);
        assert!(admits(&mine, 1000, 0));
        assert!(!admits(&mine, 1001, 0), "uid:1000 admitted another user");
        assert!(admits(&mine, 0, 0), "the server's own user is the owner");
        assert!(f.root_open(), "uid:1000 may enter the directory");
        assert_eq!(f.root_attr().perm, 0o755);
        let names = |uid| {
            f.list_for(uid)
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(1000), ["mine"], "uid 1000 sees only its export");
        assert!(names(1001).is_empty(), "{:?}", names(1001));
        assert_eq!(names(f.uid), ["open", "ro", "mine"]);
        assert!(f.by_name_for("open", 1000).is_none());
        assert!(f.by_name_for("mine", 1000).is_some());
    }

    #[test]
    fn a_unix_rule_opens_the_file_to_every_local_user() {
        let f = files(AccessPolicy {
            default: parse_allow_list("unix").unwrap(),
            ..AccessPolicy::default()
        });
        let e = add(&f, "shared", false);
        assert_eq!(mode_of(&e), 0o666);
        assert!(admits(&e, 4242, 0));
        assert!(f.root_open());
    }

    #[test]
    fn a_recreated_name_gets_a_new_inode_and_the_old_one_goes_stale() {
        let f = files(AccessPolicy::default());
        let a = add(&f, "v", false);
        let first = f.ino(&a);
        assert_eq!(f.ino(&a), first, "unstable inode");
        assert_eq!(f.file_attr(&a).size, 1 << 20);
        f.exports.remove("v");
        assert!(f.by_ino(first).is_none(), "a removed device still answers");
        let b = add(&f, "v", false);
        assert_ne!(f.ino(&b), first);
        assert_eq!(f.list_for(f.uid), vec![(f.ino(&b), "v".to_string())]);
        assert!(f.by_name("../v").is_none());
    }
}
