#!/bin/sh
# Cipher-alone benchmark beside OpenSSL, in the same run.
#
# Runs `openssl speed -evp aes-256-xts -bytes 8192` (single thread), then the
# criterion bench benches/crypto_xts.rs, then openssl again, and prints udm's
# AES-256-XTS throughput (criterion median) for 512- and 4096-byte sectors
# and its ratio to the mean of the two OpenSSL figures.
#
# Usage: bench/crypto.sh [criterion filter]   (default: the 1 MiB requests
# plus 4 KiB and 64 KiB at both sector sizes)
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
o1=$(ossl)
echo "openssl speed -evp aes-256-xts -bytes 8192 (before): $o1 B/s"
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
