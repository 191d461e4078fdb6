#!/usr/bin/env bash
# udm over Ceph RBD against qemu-nbd's rbd driver on the same images, raw
# and LUKS2, on a throwaway cluster from scripts/ceph-dev.sh (same run).
# Usage: bench/rbd.sh [--runtime S] [--rounds N] [--warmup N] [--only a,b]
#                     [--json FILE] [--qemu-dir DIR]   (see bench/rbd_bench.py)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --features rbd
exec /usr/bin/python3 bench/rbd_bench.py "$@"
