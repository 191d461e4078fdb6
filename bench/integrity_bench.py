#!/usr/bin/python3
"""J-mode dm-integrity against linear: 4 KiB random writes, same run.

Usage: integrity_bench.py UDM [SECONDS] [DIR]

Makes two files of the same size in DIR (default /dev/shm), formats one
with `udm integritysetup format` (crc32c, the defaults), serves it as an
`integrity ... J` table and the other as a `linear` table from one
`udm serve`, and runs fio's nbd engine on each in turn: 4 KiB random
writes, queue depth 8, SECONDS each (default 10). Prints a Markdown table
(IOPS, MiB/s, mean and p99 completion latency).
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import fio_nbd, scratch_dir, sparse, wait_socket  # noqa: E402

UDM = sys.argv[1]
SECS = int(sys.argv[2]) if len(sys.argv) > 2 else 10
BASE = sys.argv[3] if len(sys.argv) > 3 else "/dev/shm"
SIZE = 256 << 20


def fio(uri, name):
    j = fio_nbd(uri, name, "randwrite", ["--time_based", "--runtime=%d" % SECS])
    lat = j["clat_ns"]
    return (j["iops"], j["bw"] / 1024, lat["mean"] / 1000,
            lat["percentile"]["99.000000"] / 1000)


def main():
    with scratch_dir("udm-ibench-", BASE) as d:
        rows = serve_and_run(d)
    report(rows)


def serve_and_run(d):
    ig = sparse(os.path.join(d, "ig.img"), SIZE)
    lin = sparse(os.path.join(d, "lin.img"), SIZE)
    subprocess.run([UDM, "integritysetup", "format", "-q", ig], check=True,
                   capture_output=True)
    dump = subprocess.run([UDM, "integritysetup", "dump", ig], check=True,
                          capture_output=True, text=True).stdout
    sectors = int(next(l.split()[1] for l in dump.splitlines()
                       if l.startswith("provided_data_sectors")))
    with open(os.path.join(d, "ig.table"), "w") as t:
        t.write("0 %d integrity %s 0 4 J 3 fix_padding fix_hmac "
                "internal_hash:crc32c\n" % (sectors, ig))
    with open(os.path.join(d, "lin.table"), "w") as t:
        t.write("0 %d linear %s 0\n" % (sectors, lin))
    sock = os.path.join(d, "nbd.sock")
    srv = subprocess.Popen(
        [UDM, "serve", "--socket", sock,
         "--table", "ig=" + os.path.join(d, "ig.table"),
         "--table", "lin=" + os.path.join(d, "lin.table")],
        stderr=subprocess.DEVNULL)
    try:
        wait_socket(sock, srv)
        rows = []
        for name in ("lin", "ig"):
            uri = "nbd+unix:///%s?socket=%s" % (name, sock)
            rows.append((name, fio(uri, name)))
        return rows
    finally:
        srv.terminate()
        srv.wait()


def report(rows):
    print("| device | IOPS | MiB/s | mean µs | p99 µs |")
    print("|---|---:|---:|---:|---:|")
    names = {"lin": "linear", "ig": "integrity J (crc32c)"}
    for name, (iops, mib, mean, p99) in rows:
        print("| %s | %.0f | %.1f | %.0f | %.0f |" % (names[name], iops, mib, mean, p99))
    lin_iops, ig_iops = rows[0][1][0], rows[1][1][0]
    print("\nintegrity J / linear: %.2f of the IOPS" % (ig_iops / lin_iops))


main()
