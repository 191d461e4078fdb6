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
# interleave the configurations and rotate their order (A B C, B C A, ...)
# so a load change on a shared machine, or a warm-up effect, hits all of
# them; medians and same-run ratios printed. Besides throughput, each run
# records the server's CPU time per request (utime+stime from
# /proc/PID/stat over the run, divided by fio's completed I/Os): on a
# noisy two-core machine that is the steadier measure of what a layer or
# the statistics cost.
# Usage: bench/dmsetup_stack.sh [rounds] [seconds] [workloads]
#   workloads: a quoted list from "randread write" (default both)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
rounds="${1:-3}" secs="${2:-8}" workloads="${3:-randread write}"
udm="$(pwd)/target/release/udm"
d=/dev/shm/udm-stack-bench
rm -rf "$d"; mkdir -p "$d"
leg=$((512 << 20)); sectors=$((2 * leg / 512)); half=$((leg / 512))
truncate -s "$leg" "$d/a" "$d/b"
# Fill the legs so reads are of real pages, not holes.
dd if=/dev/urandom of="$d/a" bs=1M count=512 conv=notrunc status=none
dd if=/dev/urandom of="$d/b" bs=1M count=512 conv=notrunc status=none
pids=()
declare -A spid
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
start() { # name extra-args...
    local n=$1; shift
    UDM_LOG=warn "$udm" serve --socket "$d/$n.sock" --control "$d/$n.ctl" "$@" & pids+=($!)
    spid[$n]=$!
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
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# run_fio server uri workload -> "throughput cpu_us_per_request"
# (throughput: read IOPS or write MB/s)
run_fio() {
    local out t0 t1 args
    if [ "$3" = randread ]; then
        args=(--rw=randread --bs=4k --iodepth=32)
    else
        args=(--rw=write --bs=1M --iodepth=8)
    fi
    t0=$(cpu_ticks "${spid[$1]}")
    out=$(fio --name=j --ioengine=nbd --uri="$2" "${args[@]}" \
        --time_based=1 --runtime="$secs" --size=1G --output-format=json)
    t1=$(cpu_ticks "${spid[$1]}")
    /usr/bin/python3 -c '
import json, os, sys
s = sys.stdin.read(); j = json.loads(s[s.index("{"):])["jobs"][0]
w, dt = sys.argv[1], (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf("SC_CLK_TCK")
side = j["read"] if w == "randread" else j["write"]
tp = round(side["iops"]) if w == "randread" else round(side["bw_bytes"] / 1e6)
print(tp, round(dt * 1e6 / max(side["total_ios"], 1), 2))' "$3" "$t0" "$t1" <<<"$out"
}
declare -A res cpu
measure() { # config workload
    local srv=flat dev=single r
    case $1 in stack3) dev=top ;; nested) srv=nested dev=top ;; esac
    [ "$1" = hist-off ] && dm flat message single 0 @stats_histograms off
    if [ "$1" = hist-on ]; then
        ( while :; do dm flat status --json single >/dev/null; sleep 1; done ) & poll=$!
    fi
    r=$(run_fio "$srv" "$(uri "$srv" "$dev")" "$2")
    [ "$1" = hist-on ] && { kill "$poll"; wait "$poll" 2>/dev/null || true; }
    [ "$1" = hist-off ] && dm flat message single 0 @stats_histograms on
    res[$1,$2]+="${r% *} "
    cpu[$1,$2]+="${r#* } "
}
configs=(single stack3 nested hist-off hist-on)
for r in $(seq "$rounds"); do
    for w in $workloads; do
        n=${#configs[@]}
        for i in $(seq 0 $((n - 1))); do
            measure "${configs[$(((i + r - 1) % n))]}" "$w"
        done
    done
    echo "== round $r done"
done
echo "== latency seen by the device (single, last run):"
dm flat stats print single
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-9s %-9s %10s %12s   %s\n' config workload median "cpu us/req" "runs"
for w in $workloads; do
    unit=$([ $w = randread ] && echo "IOPS" || echo "MB/s")
    for c in "${configs[@]}"; do
        m=$(echo "${res[$c,$w]}" | median)
        u=$(echo "${cpu[$c,$w]}" | median)
        printf '%-9s %-9s %10s %12s   %s(%s) cpu %s\n' "$c" "$w" "$m" "$u" "${res[$c,$w]}" "$unit" "${cpu[$c,$w]}"
        declare "med_${c//-/_}_$w=$m" "cpu_${c//-/_}_$w=$u"
    done
    s="med_single_$w" t="med_stack3_$w" n="med_nested_$w" off="med_hist_off_$w" on="med_hist_on_$w"
    cs="cpu_single_$w" ct="cpu_stack3_$w" cn="cpu_nested_$w" coff="cpu_hist_off_$w" con="cpu_hist_on_$w"
    /usr/bin/python3 -c "print(f'$w throughput, ratio of medians: stack3/single {${!t}/${!s}:.3f}  nested/single {${!n}/${!s}:.3f}  hist-on+status/hist-off {${!on}/${!off}:.3f}')"
    /usr/bin/python3 -c "print(f'$w cpu/req, ratio of medians:    stack3/single {${!ct}/${!cs}:.3f}  nested/single {${!cn}/${!cs}:.3f}  hist-on+status/hist-off {${!con}/${!coff}:.3f}')"
    # The same ratios taken round by round (both runs of a pair share that
    # round's load), then the median of those: steadier when rounds differ.
    /usr/bin/python3 - "$w" "${res[single,$w]}" "${res[stack3,$w]}" "${res[nested,$w]}" \
        "${res[hist-off,$w]}" "${res[hist-on,$w]}" "${cpu[single,$w]}" "${cpu[stack3,$w]}" \
        "${cpu[nested,$w]}" "${cpu[hist-off,$w]}" "${cpu[hist-on,$w]}" <<'PY'
import statistics, sys
w, *cols = sys.argv[1:]
v = [[float(x) for x in c.split()] for c in cols]
def paired(a, b):
    return statistics.median(y / x for x, y in zip(v[a], v[b]))
for label, off in (("throughput", 0), ("cpu/req", 5)):
    print(f"{w} {label}, median of per-round ratios: stack3/single {paired(off, off + 1):.3f}"
          f"  nested/single {paired(off, off + 2):.3f}  hist-on+status/hist-off {paired(off + 3, off + 4):.3f}")
PY
done
