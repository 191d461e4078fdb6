#!/usr/bin/env python3
"""Verity read speed (issue 29): in one run, on one tmpfs image,

  * udm's verity export read whole against the same image's raw export
    (`--file`), both through `nbdcopy ... null:`, rounds alternating;
  * udm's verity read of the whole image against `veritysetup verify`
    (its userspace checker, the nearest peer) on the same files;
  * the server's CPU per GiB for each export (utime + stime from /proc),
    so the hash check's own cost is the difference, set against the
    core's SHA-256 rate (`openssl speed -evp sha256`, SHA-NI when the CPU
    has it: OpenSSL and the sha2 crate both pick it at run time).

Medians of `--rounds`; compare only figures of one run (the machine may be
shared). Run from the repository root:

    python3 bench/verity_bench.py --udm target/release/udm [--size-mib 1024]
"""

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import sh, wait_socket  # noqa: E402

SALT = "5a" * 32


def cpu_seconds(pid):
    """User plus system CPU time of process `pid` so far, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(cmd):
    """Wall time of `cmd`, and its CPU time (user + system)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    sh(cmd, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def sha256_rate():
    """The core's SHA-256 rate on 4 KiB buffers (bytes/s), from openssl."""
    out = subprocess.run(
        ["openssl", "speed", "-evp", "sha256", "-bytes", "4096", "-seconds", "2"],
        capture_output=True, text=True, check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("sha256") or line.startswith("SHA2-256"):
            v = line.split()[-1]
            return float(v.rstrip("k")) * 1000
    raise RuntimeError("no sha256 line in openssl speed output")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--udm", default="target/release/udm")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0,
                    help="udm serve --threads (0: its default)")
    ap.add_argument("--connections", type=int, default=4,
                    help="nbdcopy --connections")
    ap.add_argument("--json")
    a = ap.parse_args()
    udm = os.path.abspath(a.udm)
    tmp = tempfile.mkdtemp(prefix="udm-verity-bench.", dir="/dev/shm")
    server = None
    try:
        data, hashf = os.path.join(tmp, "data"), os.path.join(tmp, "hash")
        with open(data, "wb") as f:
            for _ in range(a.size_mib):
                f.write(os.urandom(1 << 20))
        fmt = subprocess.run(
            ["veritysetup", "format", data, hashf, f"--salt={SALT}"],
            capture_output=True, text=True, check=True).stdout
        root = re.search(r"Root hash:\s+(\S+)", fmt).group(1)
        blocks = a.size_mib * 256
        table = os.path.join(tmp, "v.table")
        with open(table, "w") as f:
            f.write(f"0 {a.size_mib * 2048} verity 1 {data} {hashf} 4096 4096 "
                    f"{blocks} 1 sha256 {root} {SALT}\n")
        sock = os.path.join(tmp, "nbd.sock")
        cmd = [udm, "serve", "--socket", sock, "--no-control",
               "--table", f"v={table}", "--file", f"raw={data}"]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        server = subprocess.Popen(cmd)
        wait_socket(sock, server)

        def copy(name):
            uri = f"nbd+unix:///{name}?socket={sock}"
            c0 = cpu_seconds(server.pid)
            t, _ = timed(["nbdcopy", f"--connections={a.connections}", uri, "null:"])
            return t, cpu_seconds(server.pid) - c0

        copy("v")  # warm the hash cache and the page tables once
        copy("raw")
        res = {"raw": [], "verity": [], "raw_cpu": [], "verity_cpu": [], "veritysetup": [],
               "veritysetup_cpu": []}
        for _ in range(a.rounds):
            t, c = copy("raw")
            res["raw"].append(t)
            res["raw_cpu"].append(c)
            t, c = copy("v")
            res["verity"].append(t)
            res["verity_cpu"].append(c)
            t, c = timed(["veritysetup", "verify", data, hashf, root])
            res["veritysetup"].append(t)
            res["veritysetup_cpu"].append(c)
        sha = sha256_rate()
        gib = a.size_mib / 1024
        med = {k: statistics.median(v) for k, v in res.items()}
        rate = {k: a.size_mib / 1024 / med[k] for k in ("raw", "verity", "veritysetup")}
        hash_cpu = (med["verity_cpu"] - med["raw_cpu"]) / gib
        print(f"image {a.size_mib} MiB on tmpfs, {a.rounds} rounds, nbdcopy "
              f"--connections={a.connections}, load {os.getloadavg()[0]:.1f}")
        for k in ("raw", "verity", "veritysetup"):
            print(f"{k:12} {med[k]:7.3f} s  {rate[k]:6.2f} GiB/s   runs "
                  + " ".join(f"{x:.3f}" for x in res[k]))
        print(f"verity / raw read rate:           {rate['verity'] / rate['raw']:.2f}x")
        print(f"udm verity / veritysetup verify:  {rate['verity'] / rate['veritysetup']:.2f}x")
        print(f"server CPU per GiB: raw {med['raw_cpu'] / gib:.3f} s, verity "
              f"{med['verity_cpu'] / gib:.3f} s; hash check {hash_cpu:.3f} s/GiB; "
              f"veritysetup verify {med['veritysetup_cpu'] / gib:.3f} s/GiB")
        print(f"openssl sha256 (4 KiB): {sha / 2**30:.2f} GiB/s = {2**30 / sha:.3f} s/GiB "
              f"per core; hash check / SHA-256 cost: {hash_cpu * sha / 2**30:.2f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"runs": res, "sha256_bytes_per_s": sha,
                           "size_mib": a.size_mib}, f, indent=1)
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
