#!/usr/bin/env bash
# What a stack and the statistics cost per request, in one run:
#   single   one striped table over two tmpfs files (2 legs, 64 KiB chunks)
#   stack3   linear over striped over two linear devices over the same
#            files (depth 3), compiled flat — the default
#   nested   the same stack with --no-flatten (each layer one more call),
#            to show what flattening saves
#   hist-off the single table with latency histograms off
#   hist-on  the single table with histograms on while `udm dmsetup status
#            --json` polls it every second (the default: histograms are on)
# Workloads: 4 KiB random reads at QD32, 1 MiB sequential writes at QD8,
# fio's nbd engine over a Unix socket, runtime $secs per run. Rounds
# alternate the configurations (A B C A B C ...) so a load change on a
# shared machine hits all of them; medians and same-run ratios printed.
# Usage: bench/dmsetup_stack.sh [rounds] [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
rounds="${1:-3}" secs="${2:-8}"
udm="$(pwd)/target/release/udm"
d=/dev/shm/udm-stack-bench
rm -rf "$d"; mkdir -p "$d"
leg=$((512 << 20)); sectors=$((2 * leg / 512)); half=$((leg / 512))
truncate -s "$leg" "$d/a" "$d/b"
# Fill the legs so reads are of real pages, not holes.
dd if=/dev/urandom of="$d/a" bs=1M count=512 conv=notrunc status=none
dd if=/dev/urandom of="$d/b" bs=1M count=512 conv=notrunc status=none
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
start() { # name extra-args...
    local n=$1; shift
    UDM_LOG=warn "$udm" serve --socket "$d/$n.sock" --control "$d/$n.ctl" "$@" & pids+=($!)
    for _ in $(seq 100); do [ -S "$d/$n.sock" ] && [ -S "$d/$n.ctl" ] && return; sleep 0.1; done
    echo "server $n did not start" >&2; exit 1
}
dm() { local n=$1; shift; "$udm" dmsetup --control "$d/$n.ctl" "$@"; }
stack() { # server
    dm "$1" create l1 --table "0 $half linear $d/a 0"
    dm "$1" create l2 --table "0 $half linear $d/b 0"
    dm "$1" create s --table "0 $sectors striped 2 128 @l1 0 @l2 0"
    dm "$1" create top --table "0 $sectors linear @s 0"
}
start flat; start nested --no-flatten
dm flat create single --table "0 $sectors striped 2 128 $d/a 0 $d/b 0"
stack flat; stack nested
echo "== tables (flat server)"; dm flat table
uri() { echo "nbd+unix:///$2?socket=$d/$1.sock"; }
run_fio() { # uri workload -> one number (read IOPS or write MB/s)
    local out
    if [ "$2" = randread ]; then
        out=$(fio --name=j --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth=32 \
            --time_based=1 --runtime="$secs" --size=1G --output-format=json)
        /usr/bin/python3 -c 'import json,sys; s=sys.stdin.read(); print(round(json.loads(s[s.index("{"):])["jobs"][0]["read"]["iops"]))' <<<"$out"
    else
        out=$(fio --name=j --ioengine=nbd --uri="$1" --rw=write --bs=1M --iodepth=8 \
            --time_based=1 --runtime="$secs" --size=1G --output-format=json)
        /usr/bin/python3 -c 'import json,sys; s=sys.stdin.read(); print(round(json.loads(s[s.index("{"):])["jobs"][0]["write"]["bw_bytes"]/1e6))' <<<"$out"
    fi
}
declare -A res
for r in $(seq "$rounds"); do
    for w in randread write; do
        res[single,$w]+="$(run_fio "$(uri flat single)" $w) "
        res[stack3,$w]+="$(run_fio "$(uri flat top)" $w) "
        res[nested,$w]+="$(run_fio "$(uri nested top)" $w) "
        dm flat message single 0 @stats_histograms off
        res[hist-off,$w]+="$(run_fio "$(uri flat single)" $w) "
        dm flat message single 0 @stats_histograms on
        ( while :; do dm flat status --json single >/dev/null; sleep 1; done ) & poll=$!
        res[hist-on,$w]+="$(run_fio "$(uri flat single)" $w) "
        kill "$poll"; wait "$poll" 2>/dev/null || true
    done
    echo "== round $r done"
done
echo "== latency seen by the device (single, last run):"
dm flat stats print single
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-9s %-9s %10s   %s\n' config workload median "runs"
for w in randread write; do
    unit=$([ $w = randread ] && echo "IOPS" || echo "MB/s")
    for c in single stack3 nested hist-off hist-on; do
        m=$(echo "${res[$c,$w]}" | median)
        printf '%-9s %-9s %10s   %s(%s)\n' "$c" "$w" "$m" "${res[$c,$w]}" "$unit"
        declare "med_${c//-/_}_$w=$m"
    done
    s="med_single_$w" t="med_stack3_$w" n="med_nested_$w" off="med_hist_off_$w" on="med_hist_on_$w"
    /usr/bin/python3 -c "print(f'$w: stack3/single {${!t}/${!s}:.3f}  nested/single {${!n}/${!s}:.3f}  hist-on+status/hist-off {${!on}/${!off}:.3f}')"
done
