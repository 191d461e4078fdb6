#!/usr/bin/env bash
# Memory under pressure (issue 5): 4 clients x QD64 of 1 MiB writes for
# RUNTIME seconds (default 60) against a crypt table over a /dev/shm file,
# with --memory-budget BUDGET (default 64M). Samples udm's RSS every 0.2 s
# and prints the peak against budget + 64 MiB.
# Usage: bench/rss.sh [RUNTIME] [BUDGET]
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=${1:-60}
budget=${2:-64M}
cargo build --release --quiet
d=/dev/shm/udm-rss
mkdir -p "$d"
truncate -s 1G "$d/disk.img"
key=$(head -c 64 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "0 2097152 crypt aes-xts-plain64 $key 0 $d/disk.img 0" > "$d/crypt.table"
rm -f "$d/s.sock"
UDM_LOG=warn ./target/release/udm serve --socket "$d/s.sock" --memory-budget "$budget" \
    --table "bench=$d/crypt.table" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -f "$d/crypt.table"' EXIT
for _ in $(seq 100); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
peak=0
(
    while kill -0 $pid 2>/dev/null; do
        rss=$(awk '/VmRSS/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)
        echo "$rss"
        sleep 0.2
    done
) > "$d/rss.samples" &
sampler=$!
fio --name=rss --ioengine=nbd --uri="nbd+unix:///bench?socket=$d/s.sock" --rw=write --bs=1M \
    --iodepth=64 --numjobs=4 --size=256M --offset_increment=256M --time_based=1 \
    --runtime="$runtime" --group_reporting=1 --output-format=terse >/dev/null
kill $pid; wait $pid || true
kill $sampler 2>/dev/null || true
peak=$(sort -n "$d/rss.samples" | tail -1)
budget_kib=$(( $(numfmt --from=iec "${budget}") / 1024 ))
limit_kib=$(( budget_kib + 65536 ))
echo "peak RSS ${peak} KiB; budget ${budget} = ${budget_kib} KiB; limit budget+64MiB = ${limit_kib} KiB"
if [ "$peak" -le "$limit_kib" ]; then echo "PASS: RSS stayed under budget + 64 MiB"; else echo "FAIL: RSS exceeded budget + 64 MiB"; exit 1; fi
