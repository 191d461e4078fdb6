#!/usr/bin/env bash
# Copying a sparse image out of udm with and without BLOCK_STATUS.
# A 1 GiB image holds 16 MiB of data (16 scattered 1 MiB pieces); udm
# serves it as a file and through linear-over-striped; nbdcopy copies it
# to a file on /dev/shm with extents (the default) and with --no-extents
# (every byte read), and qemu-img convert copies it too. Prints the median
# of N rounds per case and the ratio.
# Usage: bench/sparse_copy.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
cargo build --release --quiet
UDM=$PWD/target/release/udm
D=$(mktemp -d -p /dev/shm udm-sparse.XXXXXX)
trap 'kill $PID 2>/dev/null || true; rm -rf "$D"' EXIT
truncate -s 1G "$D/img"
for i in $(seq 0 15); do
    dd if=/dev/urandom of="$D/img" bs=1M count=1 seek=$((i * 61 + 7)) conv=notrunc status=none
done
truncate -s 512M "$D/leg0" "$D/leg1"
# Legs laid out so that the striped device holds the same bytes as img.
S=$((1 << 30 >> 9))
echo "0 $S striped 2 128 $D/leg0 0 $D/leg1 0" > "$D/striped.table"
echo "0 $S linear @striped 0" > "$D/lin.table"
"$UDM" serve --socket "$D/s.sock" --file img="$D/img" --table striped="$D/striped.table" \
    --table lin="$D/lin.table" 2>"$D/log" &
PID=$!
while ! [ -S "$D/s.sock" ]; do sleep 0.05; done
nbdcopy "$D/img" "nbd+unix:///lin?socket=$D/s.sock"
cmp "$D/img" <(nbdcopy "nbd+unix:///lin?socket=$D/s.sock" - ) >/dev/null

t() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
run() { # name command...
    local name=$1; shift
    local m
    m=$(for _ in $(seq "$ROUNDS"); do rm -f "$D/out"; t "$@"; done | median)
    printf '%-44s %8.3f s\n' "$name" "$m"
    echo "$m" > "$D/$name.t"
}
for exp in img lin; do
    U="nbd+unix:///$exp?socket=$D/s.sock"
    run "nbdcopy-$exp" nbdcopy "$U" "$D/out"
    run "nbdcopy-$exp-no-extents" nbdcopy --no-extents "$U" "$D/out"
    run "qemu-img-convert-$exp" qemu-img convert -f raw -O raw "$U" "$D/out"
done
for exp in img lin; do
    printf 'nbdcopy %s: --no-extents / extents = %.1fx\n' "$exp" \
        "$(echo "$(cat "$D/nbdcopy-$exp-no-extents.t") / $(cat "$D/nbdcopy-$exp.t")" | bc -l)"
done
