//! cryptsetup 2.6.1's progress lines (src/utils_progress.c), on stdout as
//! it prints them: `--progress-frequency N` gives a "Progress: …" line
//! every N seconds and a "Finished, …" line at the end; `--progress-json`
//! gives one JSON object per line (every N seconds, else every half
//! second), the last at 100 %. Scripts that parse either read udm's the
//! same way.

use std::fmt::Write;

/// `usecs` as cryptsetup's `time_to_human_string`: "12m44s" below 90
/// minutes, "26h12m44s" below 36 hours, else "3 days".
pub(super) fn human_time(usecs: u64) -> String {
    const SEC: u64 = 1_000_000;
    let s = usecs / SEC;
    if usecs < 90 * 60 * SEC {
        format!("{:02}m{:02}s", s / 60, s % 60)
    } else if usecs < 36 * 3600 * SEC {
        format!("{:02}h{:02}m{:02}s", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{:02} days", s / 86400)
    }
}

/// Bytes in cryptsetup's "written" units.
fn written(bytes: u64) -> String {
    let (n, unit) = match bytes {
        b if b < 1 << 32 => (b >> 20, "MiB"),
        b if b < 1 << 42 => (b >> 30, "GiB"),
        b if b < 1 << 52 => (b >> 40, "TiB"),
        b if b < 1 << 62 => (b >> 50, "PiB"),
        b => (b >> 60, "EiB"),
    };
    format!("{n:4} {unit} written")
}

/// A speed in bytes per second in cryptsetup's units.
fn speed(bps: f64) -> String {
    let (v, unit) = if bps > 1073741824.0 {
        (bps / 1073741824.0, "GiB")
    } else if bps > 1048576.0 {
        (bps / 1048576.0, "MiB")
    } else if bps > 1024.0 {
        (bps / 1024.0, "KiB")
    } else {
        (bps, "B")
    };
    format!("speed {v:5.1} {unit}/s")
}

/// One `--progress-frequency` line: `done` of `total` bytes, `bps` since
/// the start, `elapsed` microseconds; the final one at `done == total`.
pub(super) fn line(done: u64, total: u64, bps: f64, elapsed_us: u64) -> String {
    if done >= total {
        return format!(
            "Finished, time {}, {}, {}\n",
            human_time(elapsed_us),
            written(done),
            speed(bps)
        );
    }
    let eta = eta_us(total, bps, elapsed_us);
    format!(
        "Progress: {:5.1}%, ETA {}, {}, {}\n",
        done as f64 / total.max(1) as f64 * 100.0,
        human_time(eta),
        written(done),
        speed(bps)
    )
}

/// cryptsetup's ETA: the whole size at the speed so far, less the time
/// spent (it counts from the device's start, not from what is left).
fn eta_us(total: u64, bps: f64, elapsed_us: u64) -> u64 {
    if bps <= 0.0 {
        return 0;
    }
    (total as f64 / bps * 1e6 - elapsed_us as f64).max(0.0) as u64
}

/// One `--progress-json` line.
pub(super) fn json(device: &str, done: u64, total: u64, bps: f64, elapsed_us: u64) -> String {
    let eta_ms = if done >= total {
        0
    } else {
        eta_us(total, bps, elapsed_us) / 1000
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{{\"device\":\"{device}\",\"device_bytes\":\"{done}\",\"device_size\":\"{total}\",\
         \"speed\":\"{}\",\"eta_ms\":\"{eta_ms}\",\"time_ms\":\"{}\"}}",
        bps as u64,
        elapsed_us / 1000
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_as_cryptsetup_words_them() {
        assert_eq!(human_time(0), "00m00s");
        assert_eq!(human_time(764_000_000), "12m44s");
        assert_eq!(human_time(94_364_000_000), "26h12m44s");
        assert_eq!(human_time(3 * 86_400_000_000), "03 days");
    }

    #[test]
    fn lines_as_cryptsetup_prints_them() {
        // 512 MiB of 1 GiB in 4 s: the whole in 8 s, 4 s to go.
        let l = line(512 << 20, 1 << 30, 128.0 * 1048576.0, 4_000_000);
        assert_eq!(
            l,
            "Progress:  50.0%, ETA 00m04s,  512 MiB written, speed 128.0 MiB/s\n"
        );
        let f = line(1 << 30, 1 << 30, 128.0 * 1048576.0, 8_000_000);
        assert_eq!(
            f,
            "Finished, time 00m08s, 1024 MiB written, speed 128.0 MiB/s\n"
        );
        let j = json("/dev/x", 512 << 20, 1 << 30, 134217728.0, 4_000_000);
        assert_eq!(
            j,
            "{\"device\":\"/dev/x\",\"device_bytes\":\"536870912\",\"device_size\":\"1073741824\",\
             \"speed\":\"134217728\",\"eta_ms\":\"4000\",\"time_ms\":\"4000\"}\n"
        );
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["eta_ms"], "4000");
        let end = json("/dev/x", 1 << 30, 1 << 30, 134217728.0, 8_000_000);
        assert!(end.contains("\"eta_ms\":\"0\""));
    }
}
