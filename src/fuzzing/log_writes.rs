//! The `log_writes` driver: a dm-log-writes log device replayed by the
//! reader of `udm replay-log` (`targets::log_replay`); and its seeds,
//! logs that udm's own log-writes target wrote.
//!
//! Input: `plan` (which replay plan: check points, a limit, start and end
//! marks), `size` (the replay device's size, 16 KiB to 256 KiB), then the
//! log device.

use std::collections::HashMap;
use std::sync::Arc;

use super::verity::{mem_dev, Named};
use crate::core::{BlockDevice, WriteBuf};
use crate::store::MemStore;
use crate::targets::log_replay::{self, Check, LogReader, ReplayPlan};
use crate::targets::{TargetArgs, TargetOptions};

/// The marks the seeds hold (and the one the target writes at the end).
const MARKS: [&str; 3] = ["start", "end", "dm-log-writes-end"];

/// Runs one input; true if the whole log was read and replayed.
pub fn log_writes(input: &[u8]) -> bool {
    let [plan, size, log @ ..] = input else {
        return false;
    };
    let log: Arc<dyn BlockDevice> = mem_dev(log, 0);
    let dev = MemStore::new(16384 * (1 + u64::from(size & 0x0f)));
    // Every entry, read and described, as `replay-log -v` lists them.
    let mut entries = 0u64;
    if let Ok(mut r) = LogReader::open(log.clone()) {
        while let Ok(Some(e)) = r.next_entry() {
            assert_eq!(e.index, entries, "entries out of order");
            let _ = e.describe();
            entries += 1;
        }
    }
    let _ = log_replay::find_mark(log.clone(), MARKS[usize::from(size >> 4) % 3]);
    let p = ReplayPlan {
        start_mark: (plan & 0x04 != 0).then(|| MARKS[0].to_string()),
        start_entry: u64::from(plan >> 6),
        limit: (plan & 0x08 != 0).then_some(u64::from(*size)),
        end_mark: (plan & 0x10 != 0).then(|| MARKS[1 + usize::from(plan >> 5 & 1)].to_string()),
        check: match plan & 0x03 {
            0 => None,
            1 => Some(Check::Flush),
            2 => Some(Check::Fua),
            _ => Some(Check::Every(1 + u64::from(size >> 6))),
        },
    };
    let mut checkpoints = 0u64;
    let done = log_replay::replay(log, &dev, &p, &mut |_| {
        checkpoints += 1;
        Ok(())
    });
    if let Ok(rep) = &done {
        assert!(
            rep.applied <= entries,
            "applied more entries than the log has"
        );
        assert_eq!(rep.checks, checkpoints, "check points miscounted");
    }
    done.is_ok()
}

/// Seed inputs for [`log_writes`]: logs written by udm's log-writes
/// target over in-memory devices (writes, a FUA write, flushes, a
/// discard, zeroes and marks), cut after their last used sector.
pub fn log_writes_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let log_of = |ops: &dyn Fn(&dyn crate::targets::Target)| -> Vec<u8> {
        let dev = Arc::new(MemStore::new(64 << 10));
        let log = Arc::new(MemStore::new(256 << 10));
        let mut r = Named(HashMap::from([
            ("dev", dev as Arc<dyn BlockDevice>),
            ("log", log.clone() as Arc<dyn BlockDevice>),
        ]));
        let args = ["dev".to_string(), "log".to_string()];
        let t = (crate::targets::log_writes::TYPE.new)(TargetArgs {
            args: &args,
            len: 64 << 10,
            resolver: &mut r,
            options: &TargetOptions::default(),
        })
        .expect("log-writes over two memory devices");
        ops(&*t);
        drop(t);
        let mut b = vec![0u8; 256 << 10];
        log.read(0, &mut b).expect("read the log");
        let used = b.iter().rposition(|&x| x != 0).map_or(512, |i| i + 1);
        b.truncate(used.div_ceil(512) * 512);
        b
    };
    let data = |n: usize, k: u8| -> Vec<u8> { (0..n).map(|i| (i as u8).wrapping_mul(k)).collect() };
    let w = |t: &dyn crate::targets::Target, at: u64, n: usize, k: u8, fua: bool| {
        t.write(at, WriteBuf::Borrowed(&data(n, k)), fua)
            .expect("logged write");
    };
    let mark = |t: &dyn crate::targets::Target, m: &str| {
        t.message(&["mark".to_string(), m.to_string()])
            .expect("mark");
    };
    let seed = |plan: u8, size: u8, log: Vec<u8>| {
        let mut v = vec![plan, size];
        v.extend_from_slice(&log);
        v
    };
    let writes = log_of(&|t| {
        w(t, 0, 4096, 3, false);
        w(t, 8192, 1024, 5, false);
        t.flush().expect("flush");
        w(t, 512, 512, 7, true);
    });
    let marked = log_of(&|t| {
        w(t, 4096, 2048, 11, false);
        mark(t, "start");
        w(t, 0, 512, 13, false);
        t.discard(16384, 8192).expect("discard");
        t.flush().expect("flush");
        mark(t, "end");
        w(t, 32768, 4096, 17, true);
    });
    let zeroes = log_of(&|t| {
        t.write_zeroes(0, 8192, false).expect("zeroes");
        w(t, 60 << 10, 4096, 19, false);
        t.flush().expect("flush");
    });
    vec![
        ("writes_flush_fua", seed(0, 3, writes.clone())),
        ("writes_check_flush", seed(1, 3, writes)),
        ("marks_start_end", seed(0x14, 3, marked.clone())),
        ("marks_check_fua_limit", seed(0x0a, 0x23, marked.clone())),
        ("marks_every_entry", seed(0x03, 0x43, marked)),
        ("zeroes_and_tail", seed(0x30, 0x13, zeroes)),
    ]
}
