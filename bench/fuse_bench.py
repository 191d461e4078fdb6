#!/usr/bin/env python3
"""The mapper file (udm serve --mapper-dir) against nbdfuse over udm's own
NBD export (what users had before), in the same run, on tmpfs images
served by one udm server (one image each).

fio on the file: psync (QD emulated by that many threads) and libaio
--direct=1, at 1 MiB QD16 sequential and 4 KiB QD32 random, reads and
writes; then a loop device on each file with ext4 and fio on a file in the
file system. Configurations alternate job by job so that noise from the
shared machine hits both alike. Needs root (FUSE, loop, mount).

With `--options`, it then measures what each FUSE choice of the mapper
file buys: one server per variant (the defaults, then each `UDM_FUSE_*`
knob of src/fuse/tuning.rs turned off or down, one at a time), rounds
alternating variant by variant, libaio --direct=1 on the file; each
variant's median over the rounds against the defaults' of the same run.

Usage: bench/fuse_bench.py [--udm BIN] [--runtime S] [--size-mib N] [--json FILE]
                           [--options] [--option-rounds N] [--skip-peer]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import sh, wait_socket

FILE_JOBS = [
    ("seq read 1M qd16", "read", "1M", 16),
    ("seq write 1M qd16", "write", "1M", 16),
    ("rand read 4k qd32", "randread", "4k", 32),
    ("rand write 4k qd32", "randwrite", "4k", 32),
]

FS_JOBS = [
    ("ext4 seq write 1M qd16", "write", "1M", 16),
    ("ext4 rand read 4k qd32", "randread", "4k", 32),
]


def fio(path, engine, rw, bs, qd, runtime, size):
    jobs = ["--ioengine=psync", f"--numjobs={qd}"] if engine == "psync" else [
        "--ioengine=libaio", f"--iodepth={qd}", "--numjobs=1"]
    p = subprocess.run(
        ["fio", "--output-format=json", "--name=j", f"--filename={path}", f"--rw={rw}",
         f"--bs={bs}", "--direct=1", "--time_based=1", f"--runtime={runtime}",
         f"--size={size}", "--group_reporting=1"] + jobs,
        capture_output=True, text=True,
    )
    if p.returncode != 0:
        sys.exit(f"fio on {path} failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    out = p.stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw in ("read", "randread") else j["write"]
    return side["bw_bytes"] / 1e6, side["iops"]


# Each variant: a name and the environment that makes it (src/fuse/tuning.rs).
VARIANTS = [
    ("defaults", {}),
    ("1 session thread", {"UDM_FUSE_THREADS": "1"}),
    ("no cloned /dev/fuse fds", {"UDM_FUSE_CLONE_FD": "0"}),
    ("max_write 128 KiB", {"UDM_FUSE_MAX_WRITE": "131072"}),
    ("no FUSE_MAX_PAGES", {"UDM_FUSE_MAX_PAGES": "0"}),
    ("no FUSE_ASYNC_DIO", {"UDM_FUSE_ASYNC_DIO": "0"}),
    ("no FOPEN_PARALLEL_DIRECT_WRITES", {"UDM_FUSE_PARALLEL_WRITES": "0"}),
    ("max_background 12 (kernel default)", {"UDM_FUSE_MAX_BACKGROUND": "12"}),
    ("no FOPEN_DIRECT_IO (page cache)", {"UDM_FUSE_DIRECT_IO": "0"}),
]


def options_run(a, d, img):
    """What each FUSE choice buys: see the module doc."""
    mapper = os.path.join(d, "opt-mapper")
    sock = os.path.join(d, "opt.sock")
    got = {}
    for rnd in range(a.option_rounds):
        for name, env in VARIANTS:
            srv = subprocess.Popen(
                [a.udm, "serve", "--socket", sock, "--no-control", "--mapper-dir", mapper,
                 "--file", f"disk={img}"],
                stderr=subprocess.DEVNULL, env={**os.environ, **env})
            try:
                wait_socket(sock, srv)
                f = os.path.join(mapper, "disk")
                wait_file(f)
                for job, rw, bs, qd in FILE_JOBS:
                    mbs, _ = fio(f, "libaio", rw, bs, qd, a.runtime, f"{a.size_mib // 2}M")
                    got.setdefault((name, job), []).append(mbs)
            finally:
                srv.terminate()
                srv.wait(timeout=30)
            print(f"round {rnd + 1}: {name}: " + ", ".join(
                f"{job} {got[(name, job)][-1]:.0f}" for job, *_ in FILE_JOBS), flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\nFUSE options, libaio --direct=1, medians of {a.option_rounds} rounds, "
          f"MB/s and ratio to the defaults:")
    print("| variant | " + " | ".join(j for j, *_ in FILE_JOBS) + " |")
    print("|---" * (len(FILE_JOBS) + 1) + "|")
    for name, _ in VARIANTS:
        cells = []
        for job, *_ in FILE_JOBS:
            v, base = med[(name, job)], med[("defaults", job)]
            cells.append(f"{v:.0f}" if name == "defaults" else f"{v:.0f} ({v / base:.2f}x)")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return {f"{n} / {j}": v for (n, j), v in got.items()}


def wait_file(path, limit=20):
    t = time.time()
    while not os.path.exists(path):
        if time.time() - t > limit:
            sys.exit(f"{path} did not appear")
        time.sleep(0.1)


def loop_fs(file, mnt):
    dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", file],
                         check=True, capture_output=True, text=True).stdout.strip()
    sh(["mkfs.ext4", "-q", "-F", dev])
    os.makedirs(mnt, exist_ok=True)
    sh(["mount", dev, mnt])
    return dev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--udm", default="target/debug/udm")
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--json")
    ap.add_argument("--options", action="store_true",
                    help="also measure each FUSE option against the defaults")
    ap.add_argument("--option-rounds", type=int, default=2)
    ap.add_argument("--skip-peer", action="store_true",
                    help="only the options (needs --options)")
    a = ap.parse_args()
    d = "/dev/shm/udm-fusebench"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    # One image each (the loop+ext4 runs make a file system on each),
    # filled once, so reads read data, not holes.
    imgs = [os.path.join(d, x) for x in ("a.img", "b.img")]
    for img in imgs:
        sh(["dd", "if=/dev/urandom", f"of={img}", "bs=1M", f"count={a.size_mib}", "status=none"])
    rows = []
    if not a.skip_peer:
        rows = peer_run(a, d, imgs)
    opts = options_run(a, d, imgs[0]) if a.options else None
    shutil.rmtree(d, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"peer": rows, "options": opts}, f, indent=1)


def peer_run(a, d, imgs):
    """The mapper file against nbdfuse: see the module doc."""
    sock, mapper, nf = (os.path.join(d, x) for x in ("nbd.sock", "mapper", "nbdfuse"))
    srv = subprocess.Popen([a.udm, "serve", "--socket", sock, "--no-control", "--mapper-dir", mapper,
                            "--file", f"disk={imgs[0]}", "--file", f"other={imgs[1]}"],
                           stderr=subprocess.DEVNULL)
    os.makedirs(nf, exist_ok=True)
    wait_socket(sock, srv)
    nbdfuse = subprocess.Popen(["nbdfuse", nf, f"nbd+unix:///other?socket={sock}"])
    files = {"udm": os.path.join(mapper, "disk"), "nbdfuse": os.path.join(nf, "nbd")}
    for f in files.values():
        wait_file(f)
    size = f"{a.size_mib // 2}M"
    rows = []
    try:
        for engine in ("psync", "libaio"):
            for name, rw, bs, qd in FILE_JOBS:
                r = {k: fio(f, engine, rw, bs, qd, a.runtime, size) for k, f in files.items()}
                rows.append((f"{engine} {name}", r))
                print(rows[-1], flush=True)
        mounts = {}
        try:
            for k, f in files.items():
                mnt = os.path.join(d, f"mnt-{k}")
                mounts[k] = (loop_fs(f, mnt), mnt)
            for name, rw, bs, qd in FS_JOBS:
                r = {k: fio(os.path.join(mnt, "f"), "libaio", rw, bs, qd, a.runtime, "64M")
                     for k, (_, mnt) in mounts.items()}
                rows.append((name, r))
                print(rows[-1], flush=True)
        finally:
            for dev, mnt in mounts.values():
                subprocess.run(["umount", mnt])
                subprocess.run(["losetup", "-d", dev])
    finally:
        subprocess.run(["fusermount3", "-u", nf])
        nbdfuse.wait(timeout=20)
        srv.terminate()
        srv.wait(timeout=30)
    print("| workload | udm mapper file MB/s (IOPS) | nbdfuse MB/s (IOPS) | ratio |")
    print("|---|---|---|---|")
    for name, r in rows:
        (ub, ui), (nb, ni) = r["udm"], r["nbdfuse"]
        print(f"| {name} | {ub:.0f} ({ui:.0f}) | {nb:.0f} ({ni:.0f}) | {ub / nb:.2f}x |")
    return rows


if __name__ == "__main__":
    main()
