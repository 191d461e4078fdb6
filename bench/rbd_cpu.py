#!/usr/bin/env python3
"""CPU per request of NBD servers over one RBD image, same cluster, same run.

On a machine where the cluster's OSD shares the cores with the server, every
microsecond the server spends per request is taken from the OSD, so IOPS
alone hides what a change to the server saved. This harness keeps one
throwaway cluster (scripts/ceph-dev.sh, memstore OSD) with one prefilled
1 GiB image, and serves it in turn — interleaved round by round — by each
udm binary given (a linear table over `rbd:rbd/raw`) and, with `--qemu`, by
qemu-nbd's rbd driver (`--cache=none`, librbd's cache off as udm runs it).
For each it runs one fio job (ioengine=nbd, one connection) and reads, from
/proc, over exactly the fio run:

  iops              fio's figure
  server µs/req     the server's CPU (utime + stime of every thread, librbd's
                    included) per request
  osd µs/req        the same for the ceph-osd process
  cs/req            the server's context switches (voluntary + not, summed
                    over its threads) per request
  idle %            the machine's idle time

With `--strace` one extra, separate fio run per server is made under
`strace -c -f` and the system calls per request are printed (strace slows
the server several times: its IOPS are not comparable).

With `--luks` each udm binary also serves a LUKS2 volume on a second image
(`LABEL-luks`, formatted by the first binary and prefilled through it), so
the cost of the crypt layer per request is read against the raw image in
the same rounds.

Usage: bench/rbd_cpu.py [--runtime S] [--rounds N] [--rw RW] [--bs BS]
                        [--qd N] [--qemu] [--luks] [--strace] LABEL=UDM_BINARY ...
(build first: cargo build --release --features rbd)
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = "960M"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def ctx_switches(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        n += int(line.split()[1])
        except OSError:
            pass
    return n


def idle_jiffies():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)


def fio_argv(uri, a):
    return ["fio", "--output-format=json", "--name=j", "--ioengine=nbd", f"--uri={uri}",
            f"--rw={a.rw}", f"--bs={a.bs}", f"--iodepth={a.qd}", "--time_based=1",
            f"--runtime={a.runtime}", f"--size={SIZE}", "--numjobs=1"]


def fio_result(out, rw):
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["read"] if rw in ("read", "randread") else j["write"]
    return side["iops"], side["total_ios"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rw", default="randwrite")
    ap.add_argument("--bs", default="4k")
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--qemu", action="store_true")
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--luks", action="store_true")
    ap.add_argument("--qemu-dir", default="/tmp/udm-qemu-rbd")
    ap.add_argument("servers", nargs="*")
    a = ap.parse_args()
    udms = [s.split("=", 1) for s in a.servers]

    work = tempfile.mkdtemp(prefix="udm-rbd-cpu", dir="/tmp")
    cdir = os.path.join(work, "cluster")
    qbin = None
    if a.qemu:
        qbin = subprocess.run(["bash", f"{ROOT}/scripts/ceph-dev.sh", "qemu", a.qemu_dir],
                              check=True, capture_output=True, text=True).stdout.strip()
    sh(["bash", f"{ROOT}/scripts/ceph-dev.sh", "start", cdir],
       env=dict(os.environ, MEMSTORE_BYTES=str(4 << 30)), stdout=subprocess.DEVNULL)
    conf = os.path.join(cdir, "ceph.conf")
    try:
        with open(os.path.join(cdir, "pids")) as f:
            pids = f.read().split()
        osd = None
        for p in pids:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "ceph-osd":
                    osd = int(p)
        rbd = ["rbd", "-c", conf]
        sh(rbd + ["create", "--size", "1G", "rbd/raw"])
        sh(rbd + ["bench", "--io-type", "write", "--io-size", "4M", "--io-threads", "16",
                  "--io-total", "1G", "--io-pattern", "seq", "rbd/raw"], stdout=subprocess.DEVNULL)
        path = f"rbd:rbd/raw:conf={conf}"
        table = os.path.join(work, "lin.table")
        with open(table, "w") as f:
            f.write(f"0 {2 << 20} linear {path} 0\n")
        sock = os.path.join(work, "s.sock")
        configs = {label: ([binary, "serve", "--socket", sock, "--table", f"lin={table}"], "lin")
                   for label, binary in udms}
        if a.luks and udms:
            pw = os.path.join(work, "pass")
            with open(pw, "w") as f:
                f.write("bench passphrase")
            os.chmod(pw, 0o600)
            lk = f"rbd:rbd/lk:conf={conf}"
            sh(rbd + ["create", "--size", "1G", "rbd/lk"])
            sh([udms[0][1], "luks", "format", "-q", "--type", "luks2", "--pbkdf", "pbkdf2",
                "--pbkdf-force-iterations", "1000", "--key-file", pw, lk])
            for label, binary in udms:
                configs[f"{label}-luks"] = ([binary, "serve", "--socket", sock, "--luks", f"v={lk}",
                                             "--key-file", pw], "v")
        if qbin:
            configs["qemu-rbd-nocache"] = ([f"{qbin}/qemu-nbd", "-f", "raw", "--cache=none", "-t",
                                            "-k", sock, path], "")

        def start(argv):
            if os.path.exists(sock):
                os.unlink(sock)
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            wait_socket(sock, p)
            return p

        def stop(p):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

        uri = lambda export: f"nbd+unix:///{export}?socket={sock}"
        if a.luks and udms:
            # Prefill the plaintext, so reads hit real objects as on raw.
            p = start(configs[f"{udms[0][0]}-luks"][0])
            sh(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri('v')}", "--rw=write",
                "--bs=4M", "--iodepth=16", f"--size={SIZE}"], stdout=subprocess.DEVNULL)
            stop(p)
        rows = {n: [] for n in configs}
        # Round 0 is a warm-up on the fresh cluster, not reported.
        for r in range(a.rounds + 1):
            for name, (argv, export) in configs.items():
                p = start(argv)
                c0, o0, x0, (i0, t0) = cpu_seconds(p.pid), cpu_seconds(osd), ctx_switches(p.pid), idle_jiffies()
                out = sh(fio_argv(uri(export), a), capture_output=True, text=True).stdout
                c1, o1, x1, (i1, t1) = cpu_seconds(p.pid), cpu_seconds(osd), ctx_switches(p.pid), idle_jiffies()
                stop(p)
                iops, n = fio_result(out, a.rw)
                row = dict(iops=iops, srv=(c1 - c0) / n * 1e6, osd=(o1 - o0) / n * 1e6,
                           cs=(x1 - x0) / n, idle=100.0 * (i1 - i0) / max(1, t1 - t0))
                tag = "warm-up" if r == 0 else f"round {r}"
                print(f"{tag:8} {name:18} {iops:8.0f} IOPS  server {row['srv']:6.1f} µs/req  "
                      f"osd {row['osd']:6.1f} µs/req  {row['cs']:5.2f} cs/req  idle {row['idle']:4.1f} %",
                      flush=True)
                if r > 0:
                    rows[name].append(row)
        print(f"\nmedians of {a.rounds} rounds, {a.rw} {a.bs} QD{a.qd}, {a.runtime} s each:")
        print("| server | IOPS | server CPU µs/req | OSD CPU µs/req | ctx switches/req | idle % |")
        print("|---|---|---|---|---|---|")
        for name, rs in rows.items():
            m = lambda k: statistics.median(x[k] for x in rs)
            print(f"| {name} | {m('iops') / 1000:.2f}k | {m('srv'):.1f} | {m('osd'):.1f} | "
                  f"{m('cs'):.2f} | {m('idle'):.1f} |")
        if a.strace:
            print("\nsystem calls per request under strace -c -f (separate run):")
            for name, (argv, export) in configs.items():
                p = start(argv)
                tr = subprocess.Popen(["strace", "-c", "-f", "-q", "-p", str(p.pid), "-o",
                                       os.path.join(work, "strace.txt")])
                time.sleep(1)
                out = sh(fio_argv(uri(export), a), capture_output=True, text=True).stdout
                tr.send_signal(signal.SIGINT)
                tr.wait()
                stop(p)
                _, n = fio_result(out, a.rw)
                calls = []
                with open(os.path.join(work, "strace.txt")) as f:
                    for line in f:
                        w = line.split()
                        if len(w) >= 5 and w[0][0].isdigit() and w[-1] not in ("total",):
                            calls.append((int(w[3]), w[-1]))
                calls.sort(reverse=True)
                print(f"{name}: " + ", ".join(f"{c} {k / n:.2f}" for k, c in calls[:6]), flush=True)
    finally:
        subprocess.run(["bash", f"{ROOT}/scripts/ceph-dev.sh", "stop", cdir])
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    sys.exit(main())
