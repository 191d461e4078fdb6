#!/usr/bin/env bash
# Memory budget under load (issue 5): 4 NBD clients x QD64 of 1 MiB writes
# against a crypt device served with --memory-budget; samples udm's RSS and
# checks it stays under budget + 64 MiB. Exits 1 if it does not.
# Usage: bench/mem_rss.sh [--runtime S] [--budget SIZE]   (defaults: 60, 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=60
budget=64M
while [ $# -gt 0 ]; do
    case "$1" in
        --runtime) runtime=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        *) echo "usage: bench/mem_rss.sh [--runtime S] [--budget SIZE]" >&2; exit 2 ;;
    esac
done
for t in fio; do
    command -v "$t" >/dev/null || { echo "$t is required (apt install $t)" >&2; exit 1; }
done
cargo build --release --quiet
udm=target/release/udm

dir=$(mktemp -d /dev/shm/udm-rss.XXXXXX)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT

img_size=$((1 << 30))
truncate -s "$img_size" "$dir/img"
key=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "0 $((img_size / 512)) crypt aes-xts-plain64 $key 0 $dir/img 0" >"$dir/table"
sock="$dir/nbd.sock"
"$udm" serve --socket "$sock" --table "dev=$dir/table" --memory-budget "$budget" 2>"$dir/udm.log" &
pid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$dir/udm.log" >&2; echo "udm did not start" >&2; exit 1; }

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$pid/status"; }
base=$(rss_kib)
(
    max=0
    while kill -0 "$pid" 2>/dev/null && [ ! -e "$dir/stop" ]; do
        r=$(rss_kib 2>/dev/null || echo 0)
        [ "${r:-0}" -gt "$max" ] && max=$r
        echo "$max" >"$dir/max"
        sleep 0.2
    done
) &
sampler=$!

fio --output-format=json --name=w --ioengine=nbd --uri="nbd+unix:///dev?socket=$sock" \
    --rw=write --bs=1M --iodepth=64 --numjobs=4 --size=$((img_size / 4)) --offset_increment=$((img_size / 4)) \
    --time_based --runtime="$runtime" --group_reporting >"$dir/fio.json"
touch "$dir/stop"
wait "$sampler"

max=$(cat "$dir/max")
budget_bytes=$(/usr/bin/python3 -c "
import re,sys
m=re.fullmatch(r'(\d+)([KMGT]?)', sys.argv[1].upper())
print(int(m.group(1)) << {'':0,'K':10,'M':20,'G':30,'T':40}[m.group(2)])" "$budget")
limit_kib=$(( budget_bytes / 1024 + 64 * 1024 ))
bw=$(/usr/bin/python3 -c "import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index('{'):]); print(round(j['jobs'][0]['write']['bw']/1024))" "$dir/fio.json")
echo "4 clients x QD64 x 1 MiB writes, ${runtime}s, crypt aes-xts-plain64 over tmpfs, --memory-budget $budget"
echo "write throughput:   ${bw} MiB/s"
echo "RSS at start:       $((base / 1024)) MiB"
echo "RSS max (0.2 s):    $((max / 1024)) MiB"
echo "limit budget+64MiB: $((limit_kib / 1024)) MiB"
if [ "$max" -le "$limit_kib" ]; then
    echo "PASS"
else
    echo "FAIL: RSS exceeded budget + 64 MiB"
    exit 1
fi
