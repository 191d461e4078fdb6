#!/usr/bin/env bash
# The memory machinery, before vs after in the same run:
#   bulk mempool allocation: 256 bounce pages one at a time vs one bulk call   (benches/mem_bulk.rs)
#   per-core counter: exact vs approximate budget check, 1/2/2xCPU thr. (benches/mem_budget.rs)
#   block pool: system allocator vs block pool, dmapool_test shape (benches/mem_blockpool.rs)
#   crypt     1 MiB borrowed writes through the crypt target, bounce pages
#             one at a time vs bulk (benches/mem_crypt.rs, when present)
# Prints criterion medians as before / after / gain tables.
# Usage: bench/mem.sh [--skip-run] [--callgrind]
#   --skip-run   only print tables from the last run's target/criterion data
#   --callgrind  also count instructions per budget check (valgrind callgrind)
set -euo pipefail
cd "$(dirname "$0")/.."

run=1
callgrind=0
for a in "$@"; do
    case "$a" in
        --skip-run) run=0 ;;
        --callgrind) callgrind=1 ;;
        *) echo "usage: bench/mem.sh [--skip-run] [--callgrind]" >&2; exit 2 ;;
    esac
done

benches=(mem_bulk mem_budget mem_blockpool)
[ -f benches/mem_crypt.rs ] && benches+=(mem_crypt)

if [ "$run" = 1 ]; then
    log=$(mktemp)
    for b in "${benches[@]}"; do
        cargo bench --quiet --bench "$b" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; exit 1; }
    done
    rm -f "$log"
fi

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
/usr/bin/python3 - <<'PY'
import json, os
base = "target/criterion"

def med(path):
    f = os.path.join(base, path, "new", "estimates.json")
    try:
        with open(f) as fh:
            return json.load(fh)["median"]["point_estimate"]
    except OSError:
        return None

def fmt(ns):
    if ns is None:
        return "-"
    if ns >= 1e6:
        return f"{ns/1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns/1e3:.2f} us"
    return f"{ns:.1f} ns"

def gain(before, after):
    if before is None or after is None or after == 0:
        return "-"
    r = before / after
    return f"{r:.2f}x" if r < 2 else f"{r:.1f}x"

print("\n## bulk mempool allocation: allocate the 256 bounce pages of a 1 MiB write (median)")
b, a = med("mempool_alloc_256_pages/one_at_a_time"), med("mempool_alloc_256_pages/bulk")
print(f"| before: one at a time | after: bulk | gain |\n|---|---|---|\n| {fmt(b)} | {fmt(a)} | {gain(b, a)} |")

print("\n## approximate per-core counter: budget check per allocate/free pair, CPU ns per op (median)")
print("| threads | before: exact | after: approximate | gain |\n|---|---|---|---|")
d = os.path.join(base, "budget_check_alloc_free", "exact")
threads = sorted(int(t) for t in os.listdir(d) if t.isdigit()) if os.path.isdir(d) else []
for t in threads:
    b, a = med(f"budget_check_alloc_free/exact/{t}"), med(f"budget_check_alloc_free/approx/{t}")
    print(f"| {t} | {fmt(b)} | {fmt(a)} | {gain(b, a)} |")

print("\n## approximate per-core counter: the same, 1 thread, shard count standing in for CPU count (median)")
print("| shards (CPUs) | before: exact | after: approximate | gain |\n|---|---|---|---|")
for t in [2, 16, 64, 256]:
    b, a = med(f"budget_check_vs_cpus/exact/{t}"), med(f"budget_check_vs_cpus/approx/{t}")
    print(f"| {t} | {fmt(b)} | {fmt(a)} | {gain(b, a)} |")

print("\n## fixed-size block pool: dmapool_test shape, one round = allocate all blocks then free all (median)")
print("| size | blocks | before: system allocator | after: block pool (lock per op) | gain | after: block pool, per-thread cache | gain |")
print("|---|---|---|---|---|---|---|")
for size, blocks in [(16, 8192), (64, 8192), (256, 8192), (1024, 2048), (4096, 1024)]:
    id = f"{size}x{blocks}"
    s = med(f"dmapool_test/system/{id}")
    p = med(f"dmapool_test/blockpool/{id}")
    l = med(f"dmapool_test/blockpool_local/{id}")
    print(f"| {size} | {blocks} | {fmt(s)} | {fmt(p)} | {gain(s, p)} | {fmt(l)} | {gain(s, l)} |")

if os.path.isdir(os.path.join(base, "crypt_write_1mib_borrowed")):
    print("\n## bulk mempool allocation in the crypt target: 1 MiB borrowed writes (median per write)")
    b, a = med("crypt_write_1mib_borrowed/one_at_a_time"), med("crypt_write_1mib_borrowed/bulk")
    mib = lambda ns: "-" if ns is None else f"{1e9/ns:.0f} MiB/s"
    print("| before: pages one at a time | after: bulk | gain |\n|---|---|---|")
    print(f"| {fmt(b)} ({mib(b)}) | {fmt(a)} ({mib(a)}) | {gain(b, a)} |")
    try:
        with open(os.path.join(base, "crypt_write_1mib_borrowed", "interleaved.json")) as fh:
            j = json.load(fh)
        b, a = j["one_at_a_time_ns"], j["bulk_ns"]
        print(f"\ninterleaved (ABBA, {j['rounds']} writes each, per-write median):\n")
        print("| before: pages one at a time | after: bulk | gain |\n|---|---|---|")
        print(f"| {fmt(b)} ({mib(b)}) | {fmt(a)} ({mib(a)}) | {gain(b, a)} |")
    except OSError:
        pass
    for w in (4, 64):
        try:
            with open(os.path.join(base, "crypt_write_1mib_borrowed", f"concurrent_{w}.json")) as fh:
                j = json.load(fh)
        except OSError:
            continue
        b, a = j["one_at_a_time_mbs"], j["bulk_mbs"]
        print(f"\n{w} concurrent writers (ABBA rounds, {j['rounds']} each, median round throughput):\n")
        print("| before: pages one at a time | after: bulk | gain |\n|---|---|---|")
        print(f"| {b:.0f} MB/s | {a:.0f} MB/s | {a / b:.2f}x |")
PY

if [ "$callgrind" = 1 ]; then
    command -v valgrind >/dev/null || { echo "valgrind is required for --callgrind" >&2; exit 1; }
    exe=$(cargo bench --no-run --bench mem_budget 2>&1 | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
    [ -x "$exe" ] || { echo "cannot find the mem_budget bench executable" >&2; exit 1; }
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo -e "\n## approximate per-core counter: instructions per allocate/free pair (callgrind, 1 thread, 200000 ops minus 0-op baseline)"
    echo "| check | instructions/op |"
    echo "|---|---|"
    count() {
        UDM_BUDGET_OPS=$2 UDM_BUDGET_MODE=$1 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1.$2" "$exe" >/dev/null 2>&1
        callgrind_annotate "$tmp/cg.$1.$2" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
    }
    for mode in exact approx; do
        base=$(count "$mode" 0)
        n=$(count "$mode" 200000)
        echo "| $mode | $(( (n - base) / 200000 )) |"
    done
fi
