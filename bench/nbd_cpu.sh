#!/usr/bin/env bash
# udm's own CPU per GB moved over NBD, mapped tmpfs file (default) against
# --no-mmap (pread/pwrite), alternating: 1 MiB QD16 fio runs of 5 s against
# a table in /dev/shm/udm-bench (made by bench/nbd.sh), CPU time read from
# /proc/PID/stat before and after each run. On two cores the throughput of
# plain writes is set by fio's side, so CPU per GB is where the store's cost
# shows.
# Usage: bench/nbd_cpu.sh [rounds] [table: linear|crypt] [rw: write|read]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
rounds="${1:-3}" table="${2:-linear}" rw="${3:-write}"
d=/dev/shm/udm-bench
[ -f "$d/$table.table" ] || { echo "no $d/$table.table: run bench/nbd.sh once first" >&2; exit 1; }
udm="$(pwd)/target/release/udm"
hz=$(getconf CLK_TCK)
for _ in $(seq "$rounds"); do
    for mode in --no-mmap default; do
        rm -f "$d/cpu.sock"
        args=(serve --socket "$d/cpu.sock" --table "bench=$d/$table.table")
        [ "$mode" = default ] || args+=("$mode")
        UDM_LOG=warn "$udm" "${args[@]}" & pid=$!
        for _ in $(seq 50); do [ -S "$d/cpu.sock" ] && break; sleep 0.1; done
        c0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        out=$(fio --name=j --ioengine=nbd --uri="nbd+unix:///bench?socket=$d/cpu.sock" --rw="$rw" \
            --bs=1M --iodepth=16 --direct=1 --time_based=1 --runtime=5 --size=512M --output-format=json)
        c1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
        kill "$pid"; wait "$pid" 2>/dev/null || true
        /usr/bin/python3 - "$mode" "$c0" "$c1" "$hz" "$rw" <<PY
import json, sys
mode, c0, c1, hz, rw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
s = """$out"""
j = json.loads(s[s.index("{"):])["jobs"][0][rw]
gb = j["io_bytes"] / 1e9
print(f"$table {rw} {mode:9} {j['bw_bytes'] / 1e6:6.0f} MB/s  udm CPU {(c1 - c0) / hz / gb:.3f} s/GB")
PY
    done
done
