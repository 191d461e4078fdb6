#!/usr/bin/python3
"""dm-thin against linear, same run, one `udm serve` (issue 30).

Usage: thin_bench.py UDM [SECONDS] [RUNS] [DIR]

In DIR (default /dev/shm) makes two pools (64 KiB data blocks: one with
the kernel's default block zeroing, one with skip_block_zeroing) and a
linear device over a sparse file of the thin devices' size, all in one
`udm serve`, driven over its control socket (the protocol of
docs/CONTROL.md, spoken here so no client process is timed). Each of RUNS
rounds (default 5) measures, with fio's nbd engine, queue depth 8:

(a) 4 KiB random writes to unprovisioned blocks: a new thin device per
    round (16 GiB, so few writes land in a block already provisioned),
    at most 8192 writes or SECONDS (default 10), against the same writes
    to the linear device with another seed (fresh pages of its file);
(b) 4 KiB random reads of 256 MiB written first, thin against linear;
(c) `create_snap` of a fully mapped 1 GiB thin device and of a 100 GiB
    one with as many blocks mapped across its length: the control
    request's round trip (the message and its commit), with a `status`
    round trip beside it for the socket's own cost.

Prints a Markdown table of the medians and the same-run ratios.
"""
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import fio_nbd, scratch_dir, sparse, wait_socket  # noqa: E402

UDM = sys.argv[1]
SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
RUNS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
BASE = sys.argv[4] if len(sys.argv) > 4 else "/dev/shm"
BLOCK = 64 << 10
THIN = 16 << 30          # virtual size of the write and read thin devices
# Data devices: the zeroing pool's fills with whole blocks (tmpfs pages);
# the other's holds (b)'s data and (c)'s 4 KiB per mapped block, sparse.
DATA = {"z": 1 << 30, "s": 4 << 30}
READ_SPAN = 256 << 20
SNAP_SMALL, SNAP_BIG = 1 << 30, 100 << 30


class Control:
    """One connection to the control socket, requests one at a time."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)

    def _recv(self, n):
        b = b""
        while len(b) < n:
            c = self.s.recv(n - len(b))
            if not c:
                raise RuntimeError("control socket closed")
            b += c
        return b

    def call(self, op, payload=b"", **kw):
        req = json.dumps(dict(v=1, op=op, **kw)).encode()
        self.s.sendall(b"UDMC" + struct.pack(">II", len(req), len(payload)) + req + payload)
        h = self._recv(12)
        jl, pl = struct.unpack(">II", h[4:])
        rep = json.loads(self._recv(jl))
        self._recv(pl)
        if not rep.get("ok"):
            raise RuntimeError(f"{op} {kw}: {rep.get('code')} {rep.get('error')}")
        return rep.get("result")

    def create(self, name, table):
        self.call("create", table.encode(), names=[name], has_table=True)

    def message(self, dev, text):
        self.call("message", text.encode(), names=[dev], sector=0, message=[])


def fio(uri, name, rw, extra=()):
    return fio_nbd(uri, name, rw, extra)["iops"]


def pool_table(p, meta, data, features):
    feat = f"1 {features}" if features else "0"
    return f"0 {DATA[p] // 512} thin-pool {meta} {data} {BLOCK // 512} 0 {feat}\n"


def main():
    with scratch_dir("udm-thinbench-", BASE) as d:
        res = serve_and_run(d)
    report(res)


def serve_and_run(d):
    files = {}
    for p in ("z", "s"):
        files[p] = (sparse(os.path.join(d, p + ".meta"), 64 << 20),
                    sparse(os.path.join(d, p + ".data"), DATA[p]))
    lin = sparse(os.path.join(d, "lin.img"), SNAP_BIG)
    sock, ctl = os.path.join(d, "nbd.sock"), os.path.join(d, "control")
    srv = subprocess.Popen([UDM, "serve", "--socket", sock, "--control", ctl],
                           stderr=subprocess.DEVNULL)
    try:
        wait_socket(sock, srv)
        wait_socket(ctl, srv)
        c = Control(ctl)
        c.create("zpool", pool_table("z", *files["z"], ""))
        c.create("spool", pool_table("s", *files["s"], "skip_block_zeroing"))
        c.create("lin", f"0 {SNAP_BIG // 512} linear {lin} 0\n")
        uri = lambda n: f"nbd+unix:///{n}?socket={sock}"
        return run_rounds(c, uri)
    finally:
        srv.terminate()
        srv.wait()


def thin(c, pool, dev_id, size, name):
    c.message(pool, f"create_thin {dev_id}")
    c.create(name, f"0 {size // 512} thin @{pool} {dev_id}\n")


def remove(c, name):
    """Remove a device; fio's disconnect may not have reached the server yet."""
    for _ in range(100):
        try:
            return c.call("remove", names=[name])
        except RuntimeError as e:
            if "busy" not in str(e).lower() and "EBUSY" not in str(e):
                raise
            time.sleep(0.1)
    raise RuntimeError(f"{name} stayed busy")


def run_rounds(c, uri):
    res = {k: [] for k in ("w_lin", "w_thin", "w_thin_skip", "r_lin", "r_thin",
                           "snap_1g", "snap_100g", "status")}
    # randrepeat=0: with fio's default the offsets repeat whatever the
    # seed, so the linear device would rewrite the pages of its first round.
    limit = ["--size=%d" % THIN, "--io_size=32m", "--runtime=%d" % SECS, "--randrepeat=0"]
    # (b)'s data, written once: 256 MiB through thin 1000 and linear.
    thin(c, "spool", 1000, THIN, "rd")
    for n in ("rd", "lin"):
        fio(uri(n), "fill", "write", ["--bs=1m", "--size=%d" % READ_SPAN])
    # (c)'s devices: every block of 1 GiB mapped, and as many across 100 GiB.
    thin(c, "spool", 2000, SNAP_SMALL, "s1g")
    thin(c, "spool", 3000, SNAP_BIG, "s100g")
    # One 4 KiB write per block, stopping after one pass (fio's io_size).
    once = "--io_size=%d" % (SNAP_SMALL // BLOCK * 4096)
    fio(uri("s1g"), "map", "write:60k", ["--size=%d" % SNAP_SMALL, once])
    stride = SNAP_BIG // (SNAP_SMALL // BLOCK)
    fio(uri("s100g"), "map", "write:%dk" % (stride // 1024 - 4), ["--size=%d" % SNAP_BIG, once])
    for r in range(RUNS):
        seed = ["--randseed=%d" % (r + 1)]
        res["w_lin"].append(fio(uri("lin"), "w", "randwrite", limit + ["--randseed=%d" % (100 + r)]))
        for pool, key in (("zpool", "w_thin"), ("spool", "w_thin_skip")):
            thin(c, pool, r, THIN, "w")
            res[key].append(fio(uri("w"), "w", "randwrite", limit + seed))
            remove(c, "w")
            c.message(pool, f"delete {r}")
        rd = ["--size=%d" % READ_SPAN, "--time_based", "--runtime=%d" % SECS] + seed
        res["r_lin"].append(fio(uri("lin"), "r", "randread", rd))
        res["r_thin"].append(fio(uri("rd"), "r", "randread", rd))
        for origin, key in ((2000, "snap_1g"), (3000, "snap_100g")):
            t = time.perf_counter()
            c.message("spool", f"create_snap {origin + 1 + r} {origin}")
            res[key].append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        c.call("status", names=["spool"])
        res["status"].append((time.perf_counter() - t) * 1000)
    return res


def report(res):
    m = {k: statistics.median(v) for k, v in res.items()}
    print(f"Medians of {RUNS} rounds; fio nbd engine, 4 KiB, QD 8.\n")
    print("| workload | thin | linear | thin / linear | goal |")
    print("|---|---:|---:|---:|---|")
    print("| (a) random writes, unprovisioned blocks, zeroing (IOPS) | %.0f | %.0f | %.2f | ≥ 0.7 |"
          % (m["w_thin"], m["w_lin"], m["w_thin"] / m["w_lin"]))
    print("| (a) the same, skip_block_zeroing (IOPS) | %.0f | %.0f | %.2f | ≥ 0.7 |"
          % (m["w_thin_skip"], m["w_lin"], m["w_thin_skip"] / m["w_lin"]))
    print("| (b) random reads, provisioned blocks (IOPS) | %.0f | %.0f | %.2f | ≥ 0.95 |"
          % (m["r_thin"], m["r_lin"], m["r_thin"] / m["r_lin"]))
    print("\n| (c) create_snap round trip (ms) | median | min | max |")
    print("|---|---:|---:|---:|")
    for k, label in (("snap_1g", "1 GiB, fully mapped"), ("snap_100g", "100 GiB, as many blocks mapped"),
                     ("status", "a `status` request, for scale")):
        print("| %s | %.2f | %.2f | %.2f |" % (label, m[k], min(res[k]), max(res[k])))


main()
