#!/usr/bin/env bash
# The reopen and crash matrix, longer than CI runs it: every persistent
# target closed, reopened and killed at each boundary its model reaches,
# ROUNDS times with other random writes (the test suite runs each once).
#   bench/reopen.sh [ROUNDS]        (default 50)
# Prints each test's result line and the wall time; a failure stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
tests=(reopen_thin)
for t in tests/reopen_*.rs; do
    n=$(basename "$t" .rs)
    [[ " ${tests[*]} " == *" $n "* ]] || tests+=("$n")
done
start=$(date +%s)
for t in "${tests[@]}"; do
    echo "== $t x $rounds"
    UDM_REOPEN_ROUNDS=$rounds cargo test --all-features --release --test "$t" 2>&1 |
        grep -E '^test |test result'
done
echo "done in $(($(date +%s) - start)) s"
