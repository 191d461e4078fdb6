#!/usr/bin/env python3
"""Why a loaded machine hurts the mapper file's 1 MiB jobs more than
nbdfuse's (docs/BENCHMARKS.md, issue 27): for each path (the mapper file
of `udm serve --mapper-dir`; nbdfuse over the same server's NBD export),
one server on a 256 MiB tmpfs image, fio libaio --direct=1 1 MiB QD16
writes then reads for 4 s, and per run: MB/s, the CPU of every process of
the path per MB (utime + stime from /proc), its thread count, and the mean
number of its threads in state R (sampled every 10 ms). Needs root.

Usage: bench/fuse_load.py UDM_BINARY [ROUNDS]
"""

import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import sh, wait_socket  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def cpu(pid):
    """User plus system CPU seconds of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def running(pids, secs=2.5):
    """Mean number of the processes' threads in state R, sampled every 10 ms."""
    total = samples = 0
    t = time.time()
    while time.time() - t < secs:
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                total += state == "R"
        samples += 1
        time.sleep(0.01)
    return total / samples


def start_fio(path, rw):
    return subprocess.Popen(
        ["fio", "--output-format=json", "--name=j", f"--filename={path}", f"--rw={rw}",
         "--bs=1M", "--direct=1", "--time_based=1", "--runtime=4", "--size=128M",
         "--ioengine=libaio", "--iodepth=16"],
        stdout=subprocess.PIPE, text=True)


def one_path(udm, d, img, kind, rnd):
    sock, mp, nf = f"{d}/s.sock", f"{d}/m", f"{d}/nf"
    os.makedirs(nf, exist_ok=True)
    args = [udm, "serve", "--socket", sock, "--no-control", "--file", f"disk={img}"]
    if kind == "mapper":
        args += ["--mapper-dir", mp]
    srv = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    wait_socket(sock, srv)
    pids, nbf, path = [srv.pid], None, f"{mp}/disk"
    if kind == "nbdfuse":
        nbf = subprocess.Popen(["nbdfuse", nf, f"nbd+unix:///disk?socket={sock}"])
        path = f"{nf}/nbd"
        pids.append(nbf.pid)
    try:
        while not os.path.exists(path):
            time.sleep(0.1)
        for rw in ("write", "read"):
            c0 = sum(cpu(p) for p in pids)
            job = start_fio(path, rw)
            time.sleep(0.8)
            run = running(pids)
            out = job.communicate()[0]
            c1 = sum(cpu(p) for p in pids)
            j = json.loads(out[out.index("{"):])["jobs"][0][rw]
            mb = j["io_bytes"] / 1e6
            print(f"round {rnd} {kind:8} {rw:5} {j['bw_bytes'] / 1e6:7.0f} MB/s  "
                  f"CPU {(c1 - c0) / mb * 1e3:6.3f} ms/MB  "
                  f"threads {sum(threads(x) for x in pids)}  running (R) {run:.2f}  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        if nbf:
            subprocess.run(["fusermount3", "-u", nf])
            nbf.wait(timeout=20)
        srv.terminate()
        srv.wait(timeout=30)


def main():
    udm = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    d = "/dev/shm/udm-fuse-load"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    try:
        img = f"{d}/a.img"
        sh(["dd", "if=/dev/urandom", f"of={img}", "bs=1M", "count=256", "status=none"])
        for rnd in range(1, rounds + 1):
            for kind in ("mapper", "nbdfuse"):
                one_path(udm, d, img, kind, rnd)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
