//! Every environment variable udm reads, in one table. udm's behaviour is
//! set by its command line; these exist for three other reasons, and the
//! table says which: a setting the kernel's tools take from the
//! environment too (`UDM_CONTROL` as `DM_DEV_DIR`), an A/B switch that
//! lets a benchmark compare two paths of one binary in one run, or a test
//! hook (only with the `test-hooks` feature, or read only by tests). The
//! modules that read them keep their own constants; `tests/knobs.rs` holds
//! those, this table and docs/KNOBS.md to one another.

/// Why a variable exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A setting for users.
    Setting,
    /// An A/B switch for benchmarks: the default is the fast path.
    Measure,
    /// Read by tests only (or by code built with `test-hooks`).
    Test,
}

/// One variable: its name, default, and what it sets.
#[derive(Debug, Clone, Copy)]
pub struct Knob {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub what: &'static str,
}

const fn k(name: &'static str, kind: Kind, default: &'static str, what: &'static str) -> Knob {
    Knob {
        name,
        kind,
        default,
        what,
    }
}

use Kind::{Measure, Setting, Test};

/// The table (docs/KNOBS.md shows the same rows).
pub const KNOBS: &[Knob] = &[
    k("UDM_CONTROL", Setting, "/run/udm/control (root), else $XDG_RUNTIME_DIR/udm/control", "the control socket clients talk to when no --control is given"),
    k("UDM_LOG", Setting, "info", "the log filter (as RUST_LOG, which is read when it is unset)"),
    k("UDM_THIN_NO_SPACE_TIMEOUT", Setting, "60", "seconds a queueing thin pool holds a write that finds no free block (the kernel's no_space_timeout module parameter; 0: until space comes)"),
    k("UDM_INTEGRITYSETUP_OUTPUT", Setting, "2.6", "whose wording integritysetup dump and status print: 2.6 or 2.8"),
    k("UDM_FILE_IO", Measure, "pwrite", "the default path of file stores: pwrite or uring"),
    k("UDM_FILE_WRITERS", Measure, "1", "writer threads per file store on the io_uring path, or ring (writes as ring entries)"),
    k("UDM_FILE_READ_MAP", Measure, "1", "0: reads of tmpfs files do not use the file's mapping"),
    k("UDM_FILE_WRITE_MAP", Measure, "0", "1: a disk file's pages are offered for encrypting in place"),
    k("UDM_CRYPT_DEFER", Measure, "1", "0: a submitted crypt write is encrypted by the submitter, not the store's writer"),
    k("UDM_LEND_MIN", Measure, "4096", "bytes from which reads are lent from the page cache; off: never"),
    k("UDM_REPLY_CORK", Measure, "1", "0: each NBD reply is sent at once, not gathered"),
    k("UDM_FUSE_THREADS", Measure, "cores, 4 to 16", "FUSE session threads (see fuse/tuning.rs for the FUSE rows)"),
    k("UDM_FUSE_CLONE_FD", Measure, "1", "each FUSE session thread on its own cloned /dev/fuse"),
    k("UDM_FUSE_MAX_WRITE", Measure, "1 MiB", "FUSE max_write and max_readahead, bytes"),
    k("UDM_FUSE_MAX_PAGES", Measure, "1", "FUSE_MAX_PAGES"),
    k("UDM_FUSE_ASYNC_DIO", Measure, "1", "FUSE_ASYNC_DIO"),
    k("UDM_FUSE_PARALLEL_WRITES", Measure, "1", "FOPEN_PARALLEL_DIRECT_WRITES"),
    k("UDM_FUSE_DIRECT_IO", Measure, "1", "FOPEN_DIRECT_IO"),
    k("UDM_FUSE_MAX_BACKGROUND", Measure, "128", "FUSE background requests in flight"),
    k("UDM_SNAPSHOT_MERGE_DELAY_MS", Test, "unset", "a pause between snapshot merge steps, so a test can kill the server mid-merge"),
    k("UDM_SNAPSHOT_MODEL_ROUNDS", Test, "a few", "rounds of the snapshot reopen model test (bench/reopen.sh runs more)"),
    k("UDM_TEST_PANIC", Test, "unset", "test-hooks: panic at these injection points (point[,point])"),
    k("UDM_TEST_PANIC_ARM", Test, "unset", "test-hooks: inject only once this file exists"),
    k("UDM_TEST_REENCRYPT_STOP_AFTER", Test, "unset", "test-hooks: stop a reencryption after N steps"),
    k("UDM_TEST_REENCRYPT_CRASH_IN", Test, "unset", "test-hooks: abort a reencryption inside a step"),
    k("UDM_FOREIGN_SIGBUS", Test, "unset", "set by a store test for the child process it runs"),
];

/// The row of `name`, if udm reads it.
pub fn knob(name: &str) -> Option<&'static Knob> {
    KNOBS.iter().find(|k| k.name == name)
}
