#!/usr/bin/env python3
"""fio (ioengine=nbd) against udm and its peers on the same images (tmpfs by
default, or any directories given).

Each configuration is a server started on a Unix socket, measured with the
five jobs of issues 2 and 31 (1 MiB sequential read/write at QD16, 4 KiB
random read/write at QD32, 4 KiB random read at QD1), one connection each. Configurations are interleaved
so that noise from the shared machine hits them alike: each round starts
every server (one socket each), then runs each job on every server back to
back (the order of the servers turns by one each round), so the runs that
a ratio compares are seconds apart, not the minute a server's five jobs
take (`--order server`: the old order, one server at a time). The report
gives the median of the rounds and the same-run ratio to a baseline, and
the median of the per-round ratios (each round's pair measured
back to back).

Usage: bench/nbd_bench.py [--runtime S] [--rounds N] [--only a,b] [--jobs a,b] [--json FILE]
                          [--compare OLD_UDM_BINARY] [--dir DIR[,DIR...]]
                          [--variant NAME:ENV=VALUE[,ENV=VALUE]]... [--order job|server]
--variant runs every udm configuration once more with extra environment
variables, as CONFIG+NAME, in the same rounds (an A/B of a knob). Each
round's line also gives the server's CPU per request (utime + stime of
all its threads over the fio run, divided by fio's requests).

The issue-31 table, ext4 and tmpfs in one run:
  bench/nbd_bench.py --dir /var/tmp/udm-bench,/dev/shm/udm-bench \
      --only nbdkit-file,qemu-nbd-file,udm-linear,udm-luks
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

from benchlib import sh, wait_socket

JOBS = [
    ("seq read 1M qd16", "read", "1M", 16),
    ("seq write 1M qd16", "write", "1M", 16),
    ("rand read 4k qd32", "randread", "4k", 32),
    ("rand write 4k qd32", "randwrite", "4k", 32),
    ("rand read 4k qd1", "randread", "4k", 1),
]


def fio_json(uri, rw, bs, qd, runtime, size):
    """One fio run over NBD: the read or write side of its JSON report."""
    out = subprocess.run(
        [
            "fio", "--output-format=json", "--name=j", "--ioengine=nbd", f"--uri={uri}",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--direct=1", "--time_based=1",
            f"--runtime={runtime}", f"--size={size}", "--numjobs=1", "--group_reporting=1",
        ],
        check=True, capture_output=True, text=True,
    ).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    return j["read"] if rw in ("read", "randread") else j["write"]


def fio(uri, rw, bs, qd, runtime, size):
    side = fio_json(uri, rw, bs, qd, runtime, size)
    return side["bw_bytes"] / 1e6, side["iops"]


HZ = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of process `pid`, all its threads (fields 14 and 15 of
    /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def crypt_configs(d, sock, udm, size_mib):
    """A LUKS1 aes-xts-plain64 image (the format all three servers read),
    served by udm as a crypt table and as --luks, by nbdkit's luks filter
    and by qemu-nbd's luks driver; plus qemu-nbd raw as a second peer."""
    img = os.path.join(d, "luks1.img")
    pw = os.path.join(d, "pass.txt")
    with open(pw, "w") as f:
        f.write("benchpass")
    if not os.path.exists(img) or os.path.getsize(img) != size_mib << 20:
        # Written whole (not a sparse truncate), as raw.img: on a disk
        # filesystem, random writes into holes pay block allocation that
        # the plain image's writes do not.
        sh(["dd", "if=/dev/urandom", f"of={img}", "bs=1M", f"count={size_mib}", "status=none"])
        sh(["cryptsetup", "luksFormat", "--batch-mode", "--type", "luks1", "--pbkdf-force-iterations", "1000",
            "-c", "aes-xts-plain64", "-s", "512", "--key-file", pw, img])
    dump = subprocess.run(["cryptsetup", "luksDump", "--dump-volume-key", "--batch-mode", "--key-file", pw, img],
                          check=True, capture_output=True, text=True).stdout
    offset = int(next(l for l in dump.splitlines() if l.startswith("Payload offset:")).split(":")[1])
    key_lines, grab = [], False
    for line in dump.splitlines():
        if line.startswith("MK dump:"):
            grab = True
            line = line.split(":", 1)[1]
        elif grab and not line.startswith((" ", "\t")):
            break
        if grab:
            key_lines.append(line.strip())
    key = "".join(" ".join(key_lines).split())
    sectors = (size_mib << 20) // 512 - offset
    table = os.path.join(d, "crypt.table")
    with open(table, "w") as f:
        f.write(f"0 {sectors} crypt aes-xts-plain64 {key} 0 {img} {offset}\n")
    os.chmod(table, 0o600)
    raw = os.path.join(d, "raw.img")
    return {
        "qemu-nbd-file": ["qemu-nbd", "-t", "-f", "raw", "-k", sock, "-x", "", raw],
        "udm-crypt": [udm, "serve", "--socket", sock, "--table", f"bench={table}"],
        "udm-luks": [udm, "serve", "--socket", sock, "--luks", f"bench={img}", "--key-file", pw],
        # The ablation of direct access to tmpfs files: encrypt into a
        # buffer, then pwrite it (decrypt after pread).
        "udm-crypt-nomap": [udm, "serve", "--no-mmap", "--socket", sock, "--table", f"bench={table}"],
        "nbdkit-luks": ["nbdkit", "-f", "-U", sock, "file", img, "--filter=luks", f"passphrase=+{pw}"],
        "qemu-nbd-luks": ["qemu-nbd", "-t", "-k", sock, "-x", "", "--object", f"secret,id=sec0,file={pw}",
                          "--image-opts", f"driver=luks,key-secret=sec0,file.driver=file,file.filename={img}"],
    }


def setup(d, size_mib, udm, no_crypt=False):
    """The images in directory `d` (made once, kept between runs) and every
    server configuration over them: name -> argv; the socket is d/bench.sock."""
    os.makedirs(d, exist_ok=True)
    sock = os.path.join(d, "bench.sock")
    size = size_mib << 20
    img = os.path.join(d, "raw.img")
    legs = [os.path.join(d, f"leg{i}.img") for i in range(2)]
    if not os.path.exists(img) or os.path.getsize(img) != size:
        sh(["dd", "if=/dev/urandom", f"of={img}", "bs=1M", f"count={size_mib}", "status=none"])
    for leg in legs:
        if not os.path.exists(leg) or os.path.getsize(leg) != size // 2:
            sh(["dd", "if=/dev/urandom", f"of={leg}", "bs=1M", f"count={size_mib // 2}", "status=none"])
    sectors = size // 512
    with open(os.path.join(d, "linear.table"), "w") as f:
        f.write(f"0 {sectors} linear {img} 0\n")
    with open(os.path.join(d, "striped.table"), "w") as f:
        f.write(f"0 {sectors} striped 2 128 {legs[0]} 0 {legs[1]} 0\n")
    with open(os.path.join(d, "stacked.table"), "w") as f:
        f.write(f"0 {sectors} linear @low 0\n")
    configs = {
        "nbdkit-file": ["nbdkit", "-f", "-U", sock, "file", img],
        "udm-file": [udm, "serve", "--socket", sock, "--file", f"bench={img}"],
        "udm-linear": [udm, "serve", "--socket", sock, "--table", f"bench={d}/linear.table"],
        "udm-striped": [udm, "serve", "--socket", sock, "--table", f"bench={d}/striped.table"],
        # A linear device over another (`low`): compiled to udm-linear's
        # one route, plus the check of the device under it.
        "udm-stacked": [udm, "serve", "--socket", sock, "--table", f"low={d}/linear.table",
                        "--table", f"bench={d}/stacked.table"],
        # Plain reads of tmpfs files go through udm's mapping; this is the
        # ablation (pread).
        "udm-linear-nomap": [udm, "serve", "--no-mmap", "--socket", sock, "--table", f"bench={d}/linear.table"],
    }
    if not no_crypt:
        configs.update(crypt_configs(d, sock, udm, size_mib))
    return sock, configs


def serve(cmd, sock, env=None):
    """Start a server on `sock` and wait until it listens."""
    if os.path.exists(sock):
        os.unlink(sock)
    env = dict(os.environ, UDM_LOG="warn", **(env or {}))
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_socket(sock, p)
    except Exception:
        stop(p)
        raise
    return p


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def uri_of(name, sock):
    return f"nbd+unix:///bench?socket={sock}" if "udm" in name else f"nbd+unix:///?socket={sock}"


def table(d, a, configs, results, jobs):
    """Print the medians of directory `d`'s runs with the same-run ratio to
    nbdkit's file plugin (or the first configuration)."""
    base = "nbdkit-file" if "nbdkit-file" in configs else next(iter(configs))
    med = {k: {j: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for j, v in js.items()}
           for k, js in results.items()}
    print(f"\nMedian of {a.rounds} rounds x {a.runtime} s, one connection, image {a.size_mib} MiB in {d}; "
          f"ratio = same-run median / {base}")
    print("| server | " + " | ".join(j[0] for j in jobs) + " |")
    print("|---|" + "---|" * len(jobs))
    for k in configs:
        cells = []
        for job in jobs:
            mbs, iops = med[k][job[0]]
            ratio = mbs / med[base][job[0]][0] if med[base][job[0]][0] else 0
            if job[2] == "1M":
                cells.append(f"{mbs:.0f} MB/s ({ratio:.2f}x)")
            else:
                cells.append(f"{iops / 1000:.1f}k IOPS ({ratio:.2f}x)")
        print(f"| {k} | " + " | ".join(cells) + " |")
    # Each round's ratio (its runs were back to back), then their median:
    # less exposed to the machine's speed drifting between rounds.
    paired = {}
    for k in configs:
        paired[k] = {}
        for job in jobs:
            rs = [x[0] / b[0] for x, b in zip(results[k][job[0]], results[base][job[0]]) if b[0]]
            paired[k][job[0]] = statistics.median(rs) if rs else 0
    print(f"\nMedian of the per-round ratios to {base} (each round's runs back to back)")
    print("| server | " + " | ".join(j[0] for j in jobs) + " |")
    print("|---|" + "---|" * len(jobs))
    for k in configs:
        print(f"| {k} | " + " | ".join(f"{paired[k][j[0]]:.2f}x" for j in jobs) + " |")
    return med, paired


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--only", default="")
    ap.add_argument("--jobs", default="",
                    help="comma-separated workloads to run (default all five), e.g. 'rand write 4k qd32'")
    ap.add_argument("--json", default="")
    ap.add_argument("--no-crypt", action="store_true", help="skip the crypt/LUKS configurations")
    ap.add_argument("--dir", default="/dev/shm/udm-bench",
                    help="where the images live (default tmpfs; e.g. /var/tmp/udm-bench for a disk "
                         "filesystem); several, comma-separated, are measured in the same rounds, "
                         "one table each")
    ap.add_argument("--udm", default=os.path.join(os.path.dirname(__file__), "..", "target", "release", "udm"))
    ap.add_argument("--compare", default="",
                    help="another udm binary (e.g. an older commit's): every udm configuration is also run "
                         "with it, as NAME@old, interleaved in the same rounds")
    ap.add_argument("--order", choices=("job", "server"), default="job",
                    help="job (default): every server up for the round, each job run on all of them "
                         "back to back; server: one server at a time runs all the jobs")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:ENV=VALUE[,ENV=VALUE]: every udm configuration is also run with these "
                         "environment variables, as CONFIG+NAME, in the same rounds")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        vname, _, kv = v.partition(":")
        variants.append((vname, dict(x.split("=", 1) for x in kv.split(",") if x)))
    envs = {}

    jobs = [j for j in JOBS if not a.jobs or j[0] in a.jobs.split(",")]
    if not jobs:
        sys.exit(f"--jobs {a.jobs!r} names no workload; the workloads are: " + ", ".join(j[0] for j in JOBS))
    udm = os.path.abspath(a.udm)
    dirs = {}
    for d in a.dir.split(","):
        sock, configs = setup(d, a.size_mib, udm, a.no_crypt)
        if a.only:
            keep = a.only.split(",")
            configs = {k: v for k, v in configs.items() if k in keep}
        if a.compare:
            old = os.path.abspath(a.compare)
            for k in [k for k in configs if k.startswith("udm")]:
                configs[k + "@old"] = [old if w == udm else w for w in configs[k]]
        for vname, env in variants:
            for k in [k for k in configs if k.startswith("udm") and "+" not in k]:
                configs[f"{k}+{vname}"] = configs[k]
                envs[f"{k}+{vname}"] = env
        dirs[d] = (sock, configs, {k: {job[0]: [] for job in jobs} for k in configs})

    size = a.size_mib << 20

    def run(r, d, name, p, sock, job, results):
        c0 = cpu_seconds(p.pid)
        side = fio_json(uri_of(name, sock), job[1], job[2], job[3], a.runtime, size // 2)
        cpu = cpu_seconds(p.pid) - c0
        mbs, iops = side["bw_bytes"] / 1e6, side["iops"]
        us = cpu * 1e6 / side["total_ios"] if side["total_ios"] else float("nan")
        results[name][job[0]].append((mbs, iops))
        print(f"round {r + 1} {d} {name:14} {job[0]:20} {mbs:9.0f} MB/s {iops:9.0f} IOPS "
              f"{us:7.1f} us/req", file=sys.stderr)

    for r in range(a.rounds):
        for d, (sock, configs, results) in dirs.items():
            if a.order == "server":
                for name, cmd in configs.items():
                    p = serve(cmd, sock, envs.get(name))
                    try:
                        for job in jobs:
                            run(r, d, name, p, sock, job, results)
                    finally:
                        stop(p)
                continue
            names = list(configs)
            names = names[r % len(names):] + names[:r % len(names)]
            procs = {}
            try:
                for i, name in enumerate(names):
                    s = f"{sock}.{i}"
                    procs[name] = (serve([s if w == sock else w for w in configs[name]], s, envs.get(name)), s)
                for job in jobs:
                    for name in names:
                        p, s = procs[name]
                        run(r, d, name, p, s, job, results)
            finally:
                for p, _ in procs.values():
                    stop(p)

    out = {}
    for d, (sock, configs, results) in dirs.items():
        med, paired = table(d, a, configs, results, jobs)
        out[d] = {"results": results, "median": med, "paired_ratio": paired}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"runtime": a.runtime, "rounds": a.rounds, "order": a.order, "dirs": out}, f, indent=1)


if __name__ == "__main__":
    for t in ("fio", "nbdkit", "qemu-nbd", "cryptsetup"):
        if not shutil.which(t):
            sys.exit(f"{t} is missing: run scripts/test.sh (installs the peers) first")
    main()
