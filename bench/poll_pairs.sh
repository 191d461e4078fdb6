#!/usr/bin/env bash
# Busy polling in the event loops, paired: the same udm binary started with
# --poll-us 0 and --poll-us 50 in turn, fio (ioengine=nbd) on one file
# export in /dev/shm: 4 KiB random reads at QD1 and QD32, 1 MiB writes at
# QD16. Prints each pair and the median of the per-pair ratios.
# Usage: bench/poll_pairs.sh [PAIRS] [pinned]
#   pinned: server on vCPU 1, fio on vCPU 0 (a client that never shares
#   the server's core, as a remote one).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
pairs=${1:-8}
srv_pin=() fio_pin=()
if [ "${2:-}" = pinned ]; then srv_pin=(taskset -c 1) fio_pin=(taskset -c 0); fi
udm=$PWD/target/release/udm
dir=$(mktemp -d /dev/shm/udm-poll.XXXXXX)
trap 'rm -rf "$dir"' EXIT
dd if=/dev/urandom of="$dir/img" bs=1M count=1024 status=none
out="$dir/pairs.txt"
for i in $(seq "$pairs"); do
  for p in 0 50; do
    rm -f "$dir/s.sock"
    "${srv_pin[@]}" "$udm" serve --socket "$dir/s.sock" --file "bench=$dir/img" --poll-us "$p" 2>/dev/null &
    pid=$!
    for _ in $(seq 50); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
    for w in "randread 4k 1" "randread 4k 32" "write 1M 16"; do
      set -- $w
      iops=$("${fio_pin[@]}" fio --output-format=terse --terse-version=3 --name=j --ioengine=nbd \
        --uri="nbd+unix:///bench?socket=$dir/s.sock" --rw="$1" --bs="$2" --iodepth="$3" \
        --direct=1 --time_based=1 --runtime=2 --size=512M |
        awk -F';' '$1=="3"{print ($7>0?$8:$49)}')
      echo "$i poll$p $1-$2-qd$3 $iops" | tee -a "$out"
    done
    kill "$pid"; wait "$pid" 2>/dev/null || true
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    i, p, w, v = line.split()
    d[(w, i)][p] = float(v)
for w in sorted({w for w, _ in d}):
    rs = [(v["poll0"], v["poll50"]) for (ww, _), v in d.items() if ww == w and len(v) == 2]
    print(f"{w}: --poll-us 0 median {statistics.median(a for a, _ in rs):.0f} IOPS, "
          f"--poll-us 50 median {statistics.median(b for _, b in rs):.0f} IOPS, "
          f"per-pair ratio median {statistics.median(b / a for a, b in rs):.3f} "
          f"({', '.join(f'{b / a:.2f}' for a, b in rs)})")
PY
