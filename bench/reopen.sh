#!/usr/bin/env bash
# The reopen and crash matrix, longer than CI runs it: every persistent
# target closed, reopened and killed at each boundary its model reaches,
# ROUNDS times with other random writes (the test suite runs each once or
# a few times):
#   thin       tests/reopen_thin.rs            UDM_REOPEN_ROUNDS
#   snapshot   snapshot::tests (P and PO)      UDM_SNAPSHOT_MODEL_ROUNDS
#              tests/snapshot.rs SIGKILLs       UDM_SNAPSHOT_KILLS
#   integrity  integrity::tests (J, D, B)      (one walk; repeated ROUNDS/10 times)
# Log-writes (tests/crash_logwrites.rs) and LUKS2 reencryption
# (tests/cryptsetup_reencrypt.rs) are checked at every flush / interruption
# by the suite itself.
#   bench/reopen.sh [ROUNDS]        (default 50)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-50}
start=$(date +%s)
run() { echo "== $*"; "$@" 2>&1 | grep -E '^test .*(ok|FAILED)|test result'; }
run env UDM_REOPEN_ROUNDS="$rounds" cargo test --all-features --test reopen_thin
run env UDM_SNAPSHOT_MODEL_ROUNDS="$rounds" cargo test --all-features --lib -- \
    snapshot::tests::reopening_at_every_area_boundary
run env UDM_SNAPSHOT_KILLS="$rounds" cargo test --all-features --test snapshot -- sigkill
for _ in $(seq 1 $(((rounds + 9) / 10))); do
    run cargo test --all-features --lib -- integrity::tests::reopening_at_every_journal_boundary
done
echo "done in $(($(date +%s) - start)) s"
