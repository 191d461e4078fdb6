#!/bin/sh
# `udm serve --luks` against the equivalent crypt table, in one server (same
# run): both exports map the same image with the same key, so any difference
# is the cost of the LUKS path. Alternates nbdcopy reads and writes of the
# whole device and prints medians and the luks/table ratio.
# Usage: tests/luks/bench_serve_luks.sh   (env: UDM, SIZE_MB=512, RUNS=7)
set -eu
U=${UDM:-target/release/udm}
SIZE_MB=${SIZE_MB:-512}
RUNS=${RUNS:-7}
for t in nbdcopy python3; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 1; }; done
D=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT
printf 'bench' > "$D/pw"
"$U" luks format -q --size $((16 + SIZE_MB))M --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
    --key-file "$D/pw" "$D/v.img"
KEY=$("$U" luks dump --dump-volume-key --key-file "$D/pw" "$D/v.img" |
    sed -n '/MK dump/,$p' | sed 's/MK dump://' | tr -d ' \t\n')
echo "0 $((SIZE_MB * 2048)) crypt aes-xts-plain64 $KEY 0 $D/v.img 32768 1 sector_size:4096" > "$D/t.table"
head -c $((SIZE_MB * 1048576)) /dev/urandom > "$D/src.raw"
"$U" serve --socket "$D/s" --luks "luks=$D/v.img" --key-file "$D/pw" --table "table=$D/t.table" 2>/dev/null &
PID=$!
i=0
while [ ! -S "$D/s" ]; do sleep 0.1; i=$((i + 1)); [ $i -lt 300 ] || { echo "no socket" >&2; exit 1; }; done
now() { date +%s.%N; }
for r in $(seq "$RUNS"); do
    for n in luks table; do
        t0=$(now); nbdcopy "nbd+unix:///$n?socket=$D/s" null:; t1=$(now)
        echo "read $n $t0 $t1"
        t0=$(now); nbdcopy "$D/src.raw" "nbd+unix:///$n?socket=$D/s"; t1=$(now)
        echo "write $n $t0 $t1"
    done
done > "$D/times"
python3 - "$D/times" "$SIZE_MB" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
mb = int(sys.argv[2])
med = {}
for op in ("read", "write"):
    for n in ("luks", "table"):
        xs = [float(b) - float(a) for o, m, a, b in rows if o == op and m == n]
        med[op, n] = statistics.median(xs)
        print(f"{op:5} {n:5}: median {med[op, n]:.3f} s ({mb / med[op, n]:.0f} MiB/s) over {len(xs)} runs")
    print(f"{op:5} luks/table time ratio: {med[op, 'luks'] / med[op, 'table']:.3f}")
PY
