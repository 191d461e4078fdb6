#!/usr/bin/env python3
"""Server CPU per request of udm's file I/O paths, in the same run: the
io_uring store against pread/pwrite (`--file-io uring|pwrite`), for 4 KiB
random reads and writes at QD32 and 1 MiB sequential reads at QD16, over a
linear table and a LUKS1 volume, on each directory given (a disk
filesystem and tmpfs; tmpfs files are mapped, so both paths are the same
there unless --no-mmap is added).

CPU per request = the server's utime + stime (/proc/PID/stat, all its
threads, the kernel's io_uring workers included: they are threads of the
process) over the fio run, divided by the requests fio completed.
Configurations are interleaved round by round; medians are reported.

Usage: bench/nbd_cpu.py [--runtime S] [--rounds N] [--dir DIR[,DIR...]]
                        [--tables linear,luks] [--io uring,pwrite]
                        [--variant NAME:ENV=VALUE[,ENV=VALUE]] [--udm BINARY]
--variant adds a configuration run with extra environment variables (an
A/B of a knob), e.g. --variant sqpoll:UDM_URING_SQPOLL=1.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

from nbd_bench import fio_json, serve, setup, stop

JOBS = [
    ("rand read 4k qd32", "randread", "4k", 32),
    ("rand write 4k qd32", "randwrite", "4k", 32),
    ("seq read 1M qd16", "read", "1M", 16),
    ("seq write 1M qd16", "write", "1M", 16),
]
HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the line; fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / HZ


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--dir", default="/var/tmp/udm-bench,/dev/shm/udm-bench")
    ap.add_argument("--tables", default="linear,luks")
    ap.add_argument("--io", default="uring,pwrite")
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--jobs", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--udm", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "udm"))
    ap.add_argument("--compare", default="", help="another udm binary, run as @old in the same rounds")
    a = ap.parse_args()
    udm = os.path.abspath(a.udm)
    bins = [("", udm)] + ([("@old", os.path.abspath(a.compare))] if a.compare else [])
    jobs = [j for j in JOBS if not a.jobs or j[0] in a.jobs.split(",")]
    variants = [("", {})]
    for v in a.variant:
        name, _, kv = v.partition(":")
        variants.append((name, dict(x.split("=", 1) for x in kv.split(",") if x)))

    runs = []  # (label, dir, sock, argv, env)
    for d in a.dir.split(","):
        sock, configs = setup(d, a.size_mib, udm)
        for t in a.tables.split(","):
            for io in a.io.split(","):
                for (vname, env), (suffix, binary) in [(v, b) for v in variants for b in bins]:
                    label = f"udm-{t}{suffix} {io}" + (f" {vname}" if vname else "")
                    cmd = [binary if w == udm else w for w in configs[f"udm-{t}"]]
                    runs.append((label, d, sock, cmd + ["--file-io", io], env))
    results = {(r[0], r[1]): {j[0]: [] for j in jobs} for r in runs}
    for rnd in range(a.rounds):
        for label, d, sock, cmd, env in runs:
            p = serve(cmd, sock, env)
            try:
                for job in jobs:
                    c0 = cpu_seconds(p.pid)
                    side = fio_json(f"nbd+unix:///bench?socket={sock}", job[1], job[2], job[3], a.runtime,
                                    (a.size_mib << 20) // 2)
                    c1 = cpu_seconds(p.pid)
                    n = side["total_ios"]
                    us = (c1 - c0) * 1e6 / n if n else float("nan")
                    results[(label, d)][job[0]].append((us, side["iops"], side["bw_bytes"] / 1e6))
                    print(f"round {rnd + 1} {d} {label:24} {job[0]:20} {us:7.2f} us/req "
                          f"{side['iops']:9.0f} IOPS {side['bw_bytes'] / 1e6:7.0f} MB/s", file=sys.stderr)
            finally:
                stop(p)

    print(f"\nServer CPU per request, µs (median of {a.rounds} rounds x {a.runtime} s; "
          "in brackets the IOPS or MB/s of the same runs)")
    print("| dir | server, file I/O | " + " | ".join(j[0] for j in jobs) + " |")
    print("|---|---|" + "---|" * len(jobs))
    for (label, d), per_job in results.items():
        cells = []
        for job in jobs:
            xs = per_job[job[0]]
            us = statistics.median(x[0] for x in xs)
            rate = (f"{statistics.median(x[2] for x in xs):.0f} MB/s" if job[2] == "1M"
                    else f"{statistics.median(x[1] for x in xs) / 1000:.1f}k IOPS")
            cells.append(f"{us:.2f} ({rate})")
        print(f"| {d} | {label} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[1]} {k[0]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
