#!/usr/bin/env python3
"""udm over Ceph RBD against qemu-nbd over the same images, same run.

A throwaway single-node cluster (scripts/ceph-dev.sh, memstore OSD on this
machine) holds two 1 GiB images: `raw` (prefilled) and `lk` (LUKS2 made by
`udm luks format`, its plaintext prefilled). Each configuration is an NBD
server on a Unix socket over one of them:

  udm-rbd            udm serve --table: linear over rbd:rbd/raw
  udm-rbd-depth0     the same with udm_queue_depth=0 (ablation: requests
                     run as for a local file, on the engine's per-core
                     workers and the connection reader)
  qemu-rbd           qemu-nbd (qemu's rbd driver), default cache=writeback
  qemu-rbd-nocache   qemu-nbd --cache=none (librbd cache off, as udm)
  udm-rbd-luks       udm serve --luks over rbd:rbd/lk
  qemu-rbd-luks      qemu-nbd, rbd driver with encrypt.format=luks2
                     (librbd's own LUKS layer) over the same image

and is measured with fio (ioengine=nbd, one connection): 1 MiB sequential
write/read at QD16, 4 KiB random read/write at QD32. Configurations are
interleaved round by round. The first round(s) (`--warmup`, default 1) are
run the same way and thrown away: on a fresh cluster the first round is
faster for every server (the OSD's memory is fresh), and a median of few
rounds would keep that bias. The report gives medians of the measured
rounds (`--rounds`, default 5), the ratios of the medians, and the paired
ratio of every round (the two servers of a pair ran one after the other
in the same round, so these show how steady a ratio is).

Usage: bench/rbd.sh [--runtime S] [--rounds N] [--warmup N] [--only a,b]
                    [--json FILE] [--qemu-dir DIR]
  --runtime S    seconds per fio job (after a 1 s ramp), default 8
  --rounds N     measured rounds, default 5
  --warmup N     rounds run first and not counted, default 1
  --only a,b     only these configurations (names above)
  --json FILE    every round's figures and the medians, as JSON
  --qemu-dir DIR where `scripts/ceph-dev.sh qemu` unpacks qemu-nbd with its
                 rbd driver (default /tmp/udm-qemu-rbd; reused if there)
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import sh, wait_socket

JOBS = [
    ("seq write 1M qd16", "write", "1M", 16),
    ("seq read 1M qd16", "read", "1M", 16),
    ("rand read 4k qd32", "randread", "4k", 32),
    ("rand write 4k qd32", "randwrite", "4k", 32),
]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UDM = os.path.join(ROOT, "target/release/udm")
SIZE = "960M"  # inside both the raw image and the LUKS2 plaintext (1008 MiB)


def fio(uri, rw, bs, qd, runtime, extra=()):
    out = subprocess.run(
        ["fio", "--output-format=json", "--name=j", "--ioengine=nbd", f"--uri={uri}",
         f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}", "--time_based=1",
         f"--runtime={runtime}", "--ramp_time=1", f"--size={SIZE}", "--numjobs=1",
         *extra],
        check=True, capture_output=True, text=True,
    ).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw in ("read", "randread") else j["write"]
    return side["bw_bytes"] / 1e6, side["iops"]


class Server:
    def __init__(self, argv, sock, env=None):
        if os.path.exists(sock):
            os.unlink(sock)
        self.p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env=env, start_new_session=True)
        self.sock = sock
        wait_socket(sock, self.p)

    def uri(self, export=""):
        return f"nbd+unix:///{export}?socket={self.sock}"

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--qemu-dir", default="/tmp/udm-qemu-rbd")
    a = ap.parse_args()
    if a.rounds < 1 or a.warmup < 0:
        ap.error("--rounds must be at least 1 and --warmup at least 0")

    work = tempfile.mkdtemp(prefix="udm-rbd-bench", dir="/tmp")
    cdir = os.path.join(work, "cluster")
    qbin = subprocess.run(["bash", f"{ROOT}/scripts/ceph-dev.sh", "qemu", a.qemu_dir],
                          check=True, capture_output=True, text=True).stdout.strip()
    sh(["bash", f"{ROOT}/scripts/ceph-dev.sh", "start", cdir],
       env=dict(os.environ, MEMSTORE_BYTES=str(6 << 30)), stdout=subprocess.DEVNULL)
    conf = os.path.join(cdir, "ceph.conf")
    servers = []
    try:
        rbd = ["rbd", "-c", conf]
        pw = os.path.join(work, "pass")
        with open(pw, "w") as f:
            f.write("bench passphrase")
        os.chmod(pw, 0o600)
        sh(rbd + ["create", "--size", "1G", "rbd/raw"])
        sh(rbd + ["create", "--size", "1G", "rbd/lk"])
        sh(rbd + ["bench", "--io-type", "write", "--io-size", "4M", "--io-threads", "16",
                  "--io-total", "1G", "--io-pattern", "seq", "rbd/raw"], stdout=subprocess.DEVNULL)
        path = lambda img: f"rbd:rbd/{img}:conf={conf}"
        sh([UDM, "luks", "format", "-q", "--type", "luks2", "--pbkdf", "pbkdf2",
            "--pbkdf-force-iterations", "1000", "--key-file", pw, path("lk")])
        table = os.path.join(work, "lin.table")
        with open(table, "w") as f:
            f.write(f"0 {2 << 20} linear {path('raw')} 0\n")
        table0 = os.path.join(work, "lin0.table")
        with open(table0, "w") as f:
            f.write(f"0 {2 << 20} linear {path('raw')}:udm_queue_depth=0 0\n")
        qenv = dict(os.environ)
        secret = f"secret,id=sec0,file={pw}"
        luks_opts = f"driver=rbd,pool=rbd,image=lk,conf={conf},encrypt.format=luks2,encrypt.key-secret=sec0"
        s = lambda n: os.path.join(work, f"{n}.sock")
        configs = {
            "udm-rbd": lambda: Server([UDM, "serve", "--socket", s("u"), "--table", f"lin={table}"], s("u")),
            "udm-rbd-depth0": lambda: Server([UDM, "serve", "--socket", s("u0"), "--table", f"lin={table0}"], s("u0")),
            "qemu-rbd": lambda: Server([f"{qbin}/qemu-nbd", "-f", "raw", "-t", "-k", s("q"), path("raw")], s("q"), qenv),
            "qemu-rbd-nocache": lambda: Server([f"{qbin}/qemu-nbd", "-f", "raw", "--cache=none", "-t", "-k", s("qn"),
                                                path("raw")], s("qn"), qenv),
            "udm-rbd-luks": lambda: Server([UDM, "serve", "--socket", s("ul"), "--luks", f"v={path('lk')}",
                                            "--key-file", pw], s("ul")),
            "qemu-rbd-luks": lambda: Server([f"{qbin}/qemu-nbd", "-t", "-k", s("ql"), "--object", secret,
                                             "--image-opts", luks_opts], s("ql"), qenv),
        }
        only = [x for x in a.only.split(",") if x]
        names = [n for n in configs if not only or n in only]
        # Prefill the LUKS plaintext (so reads hit real objects, as on raw).
        srv = configs["udm-rbd-luks"]()
        servers.append(srv)
        sh(["fio", "--name=fill", "--ioengine=nbd", f"--uri={srv.uri('v')}", "--rw=write", "--bs=4M",
            "--iodepth=16", f"--size={SIZE}"], stdout=subprocess.DEVNULL)
        servers.remove(srv)
        srv.stop()
        results = {n: {j[0]: [] for j in JOBS} for n in names}
        for r in range(a.warmup + a.rounds):
            warm = r < a.warmup
            tag = f"warm-up {r + 1}" if warm else f"round {r - a.warmup + 1}"
            for n in names:
                srv = configs[n]()
                servers.append(srv)
                export = "v" if n == "udm-rbd-luks" else ("lin" if n.startswith("udm") else "")
                for label, rw, bs, qd in JOBS:
                    mbs, iops = fio(srv.uri(export), rw, bs, qd, a.runtime)
                    if not warm:
                        results[n][label].append(mbs if bs == "1M" else iops)
                    print(f"{tag:9} {n:18} {label:20} "
                          f"{mbs:8.0f} MB/s {iops:9.0f} IOPS", flush=True)
                servers.remove(srv)
                srv.stop()
        med = {n: {l: statistics.median(v) for l, v in results[n].items()} for n in names}
        fmt = lambda l, v: f"{v:.0f} MB/s" if "1M" in l else f"{v / 1000:.1f}k IOPS"
        print("\n| server | " + " | ".join(j[0] for j in JOBS) + " |")
        print("|---|" + "---|" * len(JOBS))
        for n in names:
            print(f"| {n} | " + " | ".join(fmt(j[0], med[n][j[0]]) for j in JOBS) + " |")
        ratios = [("udm-rbd / qemu-rbd", "udm-rbd", "qemu-rbd"),
                  ("udm-rbd / qemu-rbd-nocache", "udm-rbd", "qemu-rbd-nocache"),
                  ("udm-rbd-luks / udm-rbd", "udm-rbd-luks", "udm-rbd"),
                  ("udm-rbd-luks / qemu-rbd-luks", "udm-rbd-luks", "qemu-rbd-luks"),
                  ("udm-rbd / udm-rbd-depth0", "udm-rbd", "udm-rbd-depth0")]
        ratios = [r for r in ratios if r[1] in med and r[2] in med]
        print(f"\n| ratio of medians ({a.rounds} rounds) | " + " | ".join(j[0] for j in JOBS) + " |")
        print("|---|" + "---|" * len(JOBS))
        for label, x, y in ratios:
            print(f"| {label} | " + " | ".join(f"{med[x][j[0]] / med[y][j[0]]:.2f}" for j in JOBS) + " |")
        # Paired per round: both servers of a pair ran in the same round.
        paired = {label: {j[0]: [rx / ry for rx, ry in zip(results[x][j[0]], results[y][j[0]])]
                          for j in JOBS} for label, x, y in ratios}
        print("\n| per-round ratio (round 1 / 2 / …) | " + " | ".join(j[0] for j in JOBS) + " |")
        print("|---|" + "---|" * len(JOBS))
        for label, _, _ in ratios:
            print(f"| {label} | " + " | ".join(" / ".join(f"{v:.2f}" for v in paired[label][j[0]])
                                                for j in JOBS) + " |")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"rounds": results, "medians": med, "paired_ratios": paired,
                           "warmup": a.warmup, "runtime": a.runtime}, f, indent=1)
    finally:
        for srv in servers:
            srv.stop()
        subprocess.run(["bash", f"{ROOT}/scripts/ceph-dev.sh", "stop", cdir])
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    sys.exit(main())
