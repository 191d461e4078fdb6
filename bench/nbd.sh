#!/usr/bin/env bash
# fio over NBD: udm (file, linear, striped, and crypt/LUKS when present)
# against nbdkit and qemu-nbd on the same /dev/shm images, same run.
# Usage: bench/nbd.sh [--runtime S] [--rounds N] [--only a,b] [--json FILE] [--compare OLD_UDM]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
exec /usr/bin/python3 bench/nbd_bench.py "$@"
