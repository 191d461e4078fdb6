#!/usr/bin/env python3
"""CPU per request at each layer, and the server pinned to 1 and 2 cores
(issue 31 item 5, docs/SCALING.md).

For each core set (`--cpus`, default "0" and "0,1") and export (a tmpfs
file served raw, linear over it, crypt aes-xts-plain64 over it), one
`udm serve` pinned with taskset (as many workers and event loops as
cores), fio's nbd engine 4 KiB random reads and writes at QD32 (pinned to
the other core when the server has one, else sharing both): IOPS and the
server's CPU per request (utime + stime from /proc over the fio run ÷
fio's requests). With `--perf`, `perf record` samples the server during
one more run per export and the samples are summed by layer from the
symbol names (udm's module paths; kernel symbols by subsystem).

Run from the repository root; compare figures of one run only:

    python3 bench/scale_cpu.py --udm target/release/udm [--perf]
"""

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import sh, wait_socket  # noqa: E402

# (layer, substrings of a symbol); the first match wins, so more specific
# paths come first.
LAYERS = [
    ("crypt", ["udm::targets::crypt", "udm::crypto::", "aes::", "xts"]),
    ("store (incl. its mincore calls)", ["udm::store::", "mincore", "walk_pgd", "walk_p4d",
                                         "walk_pud", "walk_pmd", "mt_find"]),
    ("mapping (dm core, linear)", ["udm::dm::", "udm::mapper::", "udm::targets::linear"]),
    ("dm stats clock reads", ["clock_gettime", "read_hpet", "read_tsc", "kvm_clock"]),
    ("engine", ["udm::engine::"]),
    ("mem (buffers, budget)", ["udm::mem::"]),
    ("NBD parse/reply", ["udm::nbd::", "udm::protocol::", "mio::"]),
    ("copy (memcpy/memset)", ["memcpy", "memmove", "memset", "copy_user", "rep_movs"]),
    ("kernel: wake-ups, scheduler", ["futex", "schedule", "try_to_wake_up", "finish_task_switch",
                                     "pick_next", "enqueue_", "dequeue_", "__switch_to",
                                     "select_task_rq", "update_curr", "sched_", "yield",
                                     "spin_unlock_irqrestore", "ttwu", "wake_up"]),
    ("kernel: socket I/O (NBD)", ["tcp_", "unix_", "skb", "sock", "sendmsg", "recvmsg",
                                  "_copy_to_iter", "_copy_from_iter", "ep_", "epoll", "writev",
                                  "readv", "vfs_read", "vfs_write", "kmalloc", "slab", "memcg",
                                  "alloc_pages", "get_page_from_freelist", "free_pages",
                                  "page_frag", "fdget", "fput", "_copy_to_user",
                                  "_copy_from_user", "__virt_addr_valid", "check_heap_object",
                                  "__check_object_size"]),
    ("kernel: syscall entry, other", ["[k]"]),
    ("other user code (libc, std)", [""]),
]


def cpu_list(spec):
    """The CPUs of a taskset list such as "0,2-5"."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fio(uri, rw, runtime, pin):
    cmd = ["fio", "--name=j", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
           "--iodepth=32", "--direct=1", "--time_based=1", f"--runtime={runtime}",
           "--size=256M", "--output-format=json"]
    if pin:
        cmd = ["taskset", "-c", pin] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw.endswith("read") else j["write"]
    return side["total_ios"], side["iops"]


def layer_of(sym):
    for name, keys in LAYERS:
        if any(k in sym for k in keys):
            return name
    return LAYERS[-1][0]


def perf_layers(pid, seconds, out):
    data = out + ".data"
    rec = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-p", str(pid), "-o", data,
                            "--", "sleep", str(seconds)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return rec, data


def perf_report(data):
    rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "sym",
                          "--stdio", "--percent-limit", "0"],
                         capture_output=True, text=True).stdout
    shares = collections.Counter()
    for line in rep.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "%" not in line:
            continue
        pct, _, sym = line.partition("%")
        try:
            shares[layer_of(sym.strip())] += float(pct)
        except ValueError:
            continue
    return shares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--udm", default="target/release/udm")
    ap.add_argument("--runtime", type=int, default=5)
    ap.add_argument("--cpus", nargs="+", default=["0", "0,1"])
    ap.add_argument("--perf", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    udm = os.path.abspath(a.udm)
    tmp = tempfile.mkdtemp(prefix="udm-scale-cpu.", dir="/dev/shm")
    results = []
    try:
        img = os.path.join(tmp, "img")
        with open(img, "wb") as f:
            for _ in range(256):
                f.write(os.urandom(1 << 20))
        sectors = 256 * 2048
        with open(os.path.join(tmp, "lin.table"), "w") as f:
            f.write(f"0 {sectors} linear {img} 0\n")
        ct = os.path.join(tmp, "crypt.table")
        with open(os.open(ct, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(f"0 {sectors} crypt aes-xts-plain64 {os.urandom(64).hex()} 0 {img} 0\n")
        for cpus in a.cpus:
            n = len(cpu_list(cpus))
            fio_pin = "1" if cpus == "0" else None
            sock = os.path.join(tmp, "nbd.sock")
            cmd = ["taskset", "-c", cpus, udm, "serve", "--socket", sock, "--no-control",
                   "--threads", str(n), "--net-threads", str(n), "--file", f"raw={img}",
                   "--table", f"lin={tmp}/lin.table", "--table", f"crypt={tmp}/crypt.table"]
            server = subprocess.Popen(cmd, env={**os.environ, "UDM_LOG": "warn"})
            try:
                wait_socket(sock, server)
                for name in ("raw", "lin", "crypt"):
                    uri = f"nbd+unix:///{name}?socket={sock}"
                    for rw in ("randread", "randwrite"):
                        c0 = cpu_seconds(server.pid)
                        ios, iops = fio(uri, rw, a.runtime, fio_pin)
                        us = (cpu_seconds(server.pid) - c0) / ios * 1e6
                        row = {"cpus": cpus, "export": name, "rw": rw, "iops": iops,
                               "cpu_us_per_req": us}
                        if a.perf and cpus == a.cpus[0]:
                            rec, data = perf_layers(server.pid, max(a.runtime - 1, 1),
                                                    os.path.join(tmp, f"{name}-{rw}"))
                            fio(uri, rw, a.runtime, fio_pin)
                            rec.wait()
                            row["layers_pct"] = dict(perf_report(data))
                        results.append(row)
                        print(f"cpus {cpus:4} {name:6} {rw:9} {iops / 1000:7.1f}k IOPS  "
                              f"server {us:6.2f} us CPU/request", flush=True)
                        if "layers_pct" in row:
                            for layer, pct in sorted(row["layers_pct"].items(),
                                                     key=lambda x: -x[1]):
                                print(f"    {layer:32} {pct:5.1f} %  {pct / 100 * us:6.2f} us")
            finally:
                server.terminate()
                server.wait()
        print(f"load at the end: {os.getloadavg()[0]:.1f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(results, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
