#!/usr/bin/env bash
# Load test: N clients x QD requests in flight, 4 KiB mixed reads/writes
# (70 % reads) with every read verified, for S seconds, against an
# encrypted export: udm serving a LUKS1 volume, and in the same run
# nbdkit's file plugin (plain, the ceiling) and nbdkit's luks filter on the
# same image. For each server and client count prints requests, failures,
# p50/p99/p999 latency per op (microseconds), the server's peak RSS and
# its peak thread count.
# Usage: bench/load.sh [SECONDS] [QD] [CLIENT COUNTS...]   (default: 5 4 1 16 256)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
QD=${2:-4}
shift 2 2>/dev/null || shift $#
COUNTS=${*:-1 16 256}
cargo build --release --quiet
cargo build --release --quiet --example nbd_load
UDM=$PWD/target/release/udm
LOAD=$PWD/target/release/examples/nbd_load
D=$(mktemp -d -p /dev/shm udm-load.XXXXXX)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
ulimit -n "$(ulimit -Hn)"
truncate -s 1G "$D/luks.img"
printf 'load-test-passphrase' > "$D/key"
cryptsetup luksFormat -q --type luks1 --pbkdf-force-iterations 1000 --hash sha256 \
    --cipher aes-xts-plain64 --key-size 512 --key-file "$D/key" "$D/luks.img"
truncate -s 1G "$D/plain.img"

start() { # name sock command...
    local sock=$2; shift 2
    rm -f "$sock"
    "$@" 2>"$D/server.log" &
    PID=$!
    for _ in $(seq 300); do [ -S "$sock" ] && return; sleep 0.05; done
    echo "server did not start: $*" >&2; cat "$D/server.log" >&2; exit 1
}
# Peak RSS (VmHWM) and peak thread count of $PID while the load runs.
sample() {
    local peak=0 t
    while kill -0 "$PID" 2>/dev/null && [ ! -e "$D/done" ]; do
        t=$(awk '/^Threads:/ {print $2}' /proc/$PID/status 2>/dev/null || echo 0)
        [ "${t:-0}" -gt "$peak" ] && peak=$t
        sleep 0.1
    done
    echo "$peak"
}
printf '%-13s %7s %9s %9s %8s %8s %8s %8s %8s %8s %8s %9s %8s\n' \
    server clients requests IOPS failures r-p50 r-p99 r-p999 w-p50 w-p99 w-p999 "RSS(MiB)" threads
for name in udm-luks nbdkit-luks nbdkit-file; do
    sock=$D/$name.sock
    case $name in
        udm-luks) start "$name" "$sock" "$UDM" serve --socket "$sock" --luks vol="$D/luks.img" \
                      --key-file "$D/key" ;;
        nbdkit-luks) start "$name" "$sock" nbdkit -f -U "$sock" --filter=luks file "$D/luks.img" \
                      passphrase=+"$D/key" ;;
        nbdkit-file) start "$name" "$sock" nbdkit -f -U "$sock" file "$D/plain.img" ;;
    esac
    for n in $COUNTS; do
        rm -f "$D/done"
        sample > "$D/threads" &
        SP=$!
        out=$("$LOAD" "$sock" "$n" "$QD" "$SECS")
        touch "$D/done"
        wait "$SP"
        rss=$(awk '/^VmHWM:/ {printf "%.0f", $2/1024}' /proc/$PID/status)
        echo "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
name, rss, thr = sys.argv[1], sys.argv[2], sys.argv[3]
print("%-13s %7d %9d %9d %8d %8d %8d %8d %8d %8d %8d %9s %8s" % (name, r["clients"], r["requests"], r["iops"],
      r["failures"], r["read"]["p50"], r["read"]["p99"], r["read"]["p999"],
      r["write"]["p50"], r["write"]["p99"], r["write"]["p999"], rss, thr))' "$name" "$rss" "$(cat "$D/threads")"
    done
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
done
