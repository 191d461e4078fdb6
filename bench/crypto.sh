#!/bin/sh
# Cipher-alone benchmark beside OpenSSL, in the same run.
#
# Runs `openssl speed -evp aes-256-xts -bytes 8192` (single thread), then the
# criterion bench benches/crypto_xts.rs, then openssl again, and prints udm's
# AES-256-XTS throughput (criterion median) for 512- and 4096-byte sectors
# and its ratio to the mean of the two OpenSSL figures.
#
# Then (unless CRYPT_TARGET=0) runs benches/crypto_target.rs and prints the
# crypt target over the in-memory store against the bare cipher of the same
# run (direct access: the cipher moves the bytes; and the ablation over a
# store without direct access: cipher, then copy), and 2 versus 1 crypt
# threads for one QD1 stream of 1 MiB writes.
# CRYPT_TARGET=only skips the cipher-vs-OpenSSL part.
#
# Usage: bench/crypto.sh [criterion filter]   (default: every cipher bench)
set -eu
cd "$(dirname "$0")/.."
filter="${1:-xts_aes256/|ceiling}"
secs="${OPENSSL_SECONDS:-3}"

ossl() {
    openssl speed -evp aes-256-xts -bytes 8192 -seconds "$secs" 2>/dev/null |
        awk '/^AES-256-XTS/ { v = $2; sub(/k$/, "", v); printf "%.0f\n", v * 1000 }'
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cpus, load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "openssl: $(openssl version)"
if [ "${CRYPT_TARGET:-1}" != only ]; then
o1=$(ossl)
echo "openssl speed -evp aes-256-xts -bytes 8192 (before): $o1 B/s"
rm -rf target/criterion/xts_* target/criterion/ceiling target/criterion/crypt_target
cargo bench --bench crypto_xts -- "$filter" >/tmp/udm-crypto-bench.$$ 2>&1 || {
    cat /tmp/udm-crypto-bench.$$
    exit 1
}
o2=$(ossl)
echo "openssl speed -evp aes-256-xts -bytes 8192 (after):  $o2 B/s"
rm -f /tmp/udm-crypto-bench.$$
python3 - "$o1" "$o2" <<'PY'
import json, os, sys
ossl = (int(sys.argv[1]) + int(sys.argv[2])) / 2
root = "target/criterion"
print(f"\nopenssl mean: {ossl / 1e9:.2f} GB/s\n")
print(f"{'bench':45} {'median':>12} {'GB/s':>7} {'x openssl':>9}")
for group in sorted(os.listdir(root)):
    gdir = os.path.join(root, group)
    if not os.path.isdir(gdir) or not group.startswith(("xts_", "ceiling")):
        continue
    for dirpath, dirs, files in sorted(os.walk(gdir)):
        if os.path.basename(dirpath) != "new" or "estimates.json" not in files:
            continue
        bench = os.path.relpath(os.path.dirname(dirpath), root)
        size = bench.rsplit("/", 1)[-1].rsplit("_", 1)[-1]
        if not size.isdigit():
            continue
        med = json.load(open(os.path.join(dirpath, "estimates.json")))["median"]["point_estimate"]
        gbs = int(size) / med  # bytes per ns = GB/s
        print(f"{bench:45} {med/1000:10.1f}us {gbs:7.2f} {gbs * 1e9 / ossl:9.2f}")
PY

# The same comparison, interleaved: OpenSSL and udm take turns (1 s of
# `openssl speed`, then `udm benchmark` at 512 and 4096 for 0.5 s per
# direction), so a VM's slow drift in clock speed hits both sides of each
# pair alike; the ratio is taken per pair and the median printed.
pairs="${PAIRS:-7}"
if [ "$pairs" -gt 0 ]; then
    cargo build --release --quiet
    echo
    echo "interleaved, $pairs pairs (openssl 1 s, then udm benchmark --time-ms 500 at 512 and 4096):"
    for i in $(seq "$pairs"); do
        o=$(OPENSSL_SECONDS=1 ossl)
        u5=$(target/release/udm benchmark -c aes-xts-plain64 -s 512 --sector-size 512 --time-ms 500 --json | tr -d "\n")
        u4=$(target/release/udm benchmark -c aes-xts-plain64 -s 512 --sector-size 4096 --time-ms 500 --json | tr -d "\n")
        echo "$o $u5 $u4"
    done | python3 -c '
import json, statistics, sys
rows = []
for line in sys.stdin:
    o, rest = line.split(" ", 1)
    dec = json.JSONDecoder()
    a, end = dec.raw_decode(rest.strip())
    b, _ = dec.raw_decode(rest.strip()[end:].strip())
    o = int(o)
    mib = 1 << 20
    x = [a["ciphers"][0]["encryption_mib_s"] * mib, a["ciphers"][0]["decryption_mib_s"] * mib,
         b["ciphers"][0]["encryption_mib_s"] * mib, b["ciphers"][0]["decryption_mib_s"] * mib]
    rows.append((o, x))
    print(f"  openssl {o / 1e9:5.2f} GB/s | ss512 enc {x[0] / 1e9:5.2f} dec {x[1] / 1e9:5.2f} | ss4096 enc {x[2] / 1e9:5.2f} dec {x[3] / 1e9:5.2f} | x openssl "
          + " ".join(f"{v / o:.2f}" for v in x))
names = ["ss512 enc", "ss512 dec", "ss4096 enc", "ss4096 dec"]
print("median x openssl (per-pair ratios): " + ", ".join(
    f"{n} {statistics.median(r[1][k] / r[0] for r in rows):.2f} (min {min(r[1][k] / r[0] for r in rows):.2f})"
    for k, n in enumerate(names)))
'
fi
fi

[ "${CRYPT_TARGET:-1}" = 0 ] && exit 0
echo
echo "crypt target over MemStore (load before: $(cut -d' ' -f1-3 /proc/loadavg))"
rm -rf target/criterion/crypt_target target/criterion/crypt_streams
cargo bench --bench crypto_target >/tmp/udm-crypto-bench.$$ 2>&1 || {
    cat /tmp/udm-crypto-bench.$$
    exit 1
}
rm -f /tmp/udm-crypto-bench.$$
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - <<'PY'
import json, os
root = "target/criterion/crypt_target"
def gbs(name):
    p = os.path.join(root, name, "new", "estimates.json")
    med = json.load(open(p))["median"]["point_estimate"]
    return (1 << 20) / med
names = sorted(d for d in os.listdir(root) if d != "report" and os.path.isdir(os.path.join(root, d)))
for n in names:
    print(f"{n:45} {gbs(n):7.2f} GB/s")
print()
def r(a, b):
    return f"{gbs(a) / gbs(b):.2f}"
for ss in (512, 4096):
    sfx = f"ss{ss}_1048576"
    enc, dec = "cipher_alone_enc_" + sfx, "cipher_alone_dec_" + sfx
    print(f"ss {ss}: target(1 thread) / cipher, direct access: "
          f"write owned {r('direct_t1_write_owned_' + sfx, enc)}, "
          f"write borrowed {r('direct_t1_write_borrowed_' + sfx, enc)}, "
          f"read {r('direct_t1_read_' + sfx, dec)}")
    print(f"ss {ss}: target(1 thread) / cipher out of place into memory, direct access: "
          f"write owned {r('direct_t1_write_owned_' + sfx, 'cipher_to_memory_enc_' + sfx)}, "
          f"read {r('direct_t1_read_' + sfx, 'cipher_to_memory_dec_' + sfx)}")
    print(f"ss {ss}: target(1 thread) / cipher, copying store (ablation): "
          f"write owned {r('copy_t1_write_owned_' + sfx, enc)}, "
          f"write borrowed {r('copy_t1_write_borrowed_' + sfx, enc)}, "
          f"read {r('copy_t1_read_' + sfx, dec)}")
    print(f"ss {ss}: 2 threads / 1 thread, QD1 1 MiB writes: "
          f"direct owned {r('direct_t2_write_owned_' + sfx, 'direct_t1_write_owned_' + sfx)}, "
          f"direct borrowed {r('direct_t2_write_borrowed_' + sfx, 'direct_t1_write_borrowed_' + sfx)}, "
          f"copying {r('copy_t2_write_owned_' + sfx, 'copy_t1_write_owned_' + sfx)}, "
          f"null device {r('null_t2_write_' + sfx, 'null_t1_write_' + sfx)}; "
          f"reads direct {r('direct_t2_read_' + sfx, 'direct_t1_read_' + sfx)}")
for ss in (512, 4096):
    p = os.path.join(root, f"gapped_ss{ss}.json")
    if os.path.exists(p):
        j = json.load(open(p))
        print(f"ss {ss}: 2 threads / 1 thread, QD1 1 MiB owned writes with ~65 us gaps (workers asleep; {j['rounds']} each, medians): "
              f"{j['t1_ns'] / j['t2_ns']:.2f}")
sroot = "target/criterion/crypt_streams"
def sgbs(name):
    p = os.path.join(sroot, name, "new", "estimates.json")
    return (4 << 20) / json.load(open(p))["median"]["point_estimate"]
if os.path.isdir(sroot):
    t1, t2 = sgbs("direct_t1_write_4streams_ss512_4194304"), sgbs("direct_t2_write_4streams_ss512_4194304")
    print(f"4 QD1 streams of 1 MiB writes, ss 512, direct: 1 thread {t1:.2f} GB/s, 2 threads {t2:.2f} GB/s, ratio {t2 / t1:.2f}")
PY
