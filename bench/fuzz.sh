#!/usr/bin/env bash
# Run every cargo-fuzz target (fuzz/fuzz_targets/) for the given number of
# minutes each, one after the other, from a corpus seeded with
# fuzz/seeds/<target>/, and print one table row per target:
#   | target | minutes | executions | crashes | final coverage |
# A crash, leak or timeout leaves its input in fuzz/artifacts/<target>/ and
# counts as a crash; an input slower than 10 s (slow-unit-*) is said apart. Needs a nightly toolchain and `cargo install
# cargo-fuzz`. The machine may be shared: the fuzzer runs at nice 19.
#
# Usage: bench/fuzz.sh [MINUTES] [TARGET...]     (default 10, every target)
# FUZZ_JOBS=2 runs two targets at once (never more than 2 on a shared
# 2-core machine); the rows then come in the order the runs end.
# Each row also gives libFuzzer's last coverage line (cov, ft, corpus).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH"
minutes=${1:-10}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//' | sort)
fi
secs=$((minutes * 60))
max_jobs=${FUZZ_JOBS:-1}
cargo +nightly fuzz build -O >/dev/null
log_dir=$(mktemp -d /tmp/udm-fuzz.XXXXXX)
echo "toolchain: $(rustc +nightly --version); cargo-fuzz $(cargo +nightly fuzz --version | awk '{print $2}'); $(nproc) cores; logs in $log_dir"
echo "| target | minutes | executions | crashes | final coverage |"
echo "|---|---|---|---|---|"
run_one() {
    local t=$1
    mkdir -p "corpus/$t" "artifacts/$t"
    cp -n "seeds/$t"/* "corpus/$t/" 2>/dev/null || true
    local before after rc runs crashes cov
    before=$(ls "artifacts/$t" | grep -vc '^slow-unit-' || true)
    local slow_before
    slow_before=$(ls "artifacts/$t" | grep -c '^slow-unit-' || true)
    set +e
    nice -n 19 cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=30 \
        >"$log_dir/$t.log" 2>&1
    rc=$?
    set -e
    # A run that crashed prints no "Done" line: no match must not end the
    # script (set -e, pipefail).
    runs=$(grep -Eo 'Done [0-9]+ runs' "$log_dir/$t.log" | awk '{print $2}' | tail -1 || true)
    if [[ -z "$runs" ]]; then
        runs=$(grep -Eo '^#[0-9]+' "$log_dir/$t.log" | tail -1 | tr -d '#' || true)
    fi
    cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log_dir/$t.log" | tail -1 || true)
    after=$(ls "artifacts/$t" | grep -vc '^slow-unit-' || true)
    crashes=$((after - before))
    # libFuzzer keeps inputs slower than 10 s as slow-unit-*: not a crash,
    # but said in the row.
    local slow
    slow=$(($(ls "artifacts/$t" | grep -c '^slow-unit-' || true) - slow_before))
    if ((slow > 0)); then crashes="$crashes ($slow slow units)"; fi
    if ((rc != 0 && crashes == 0)); then crashes="1 (exit $rc, see $log_dir/$t.log)"; fi
    echo "| $t | $minutes | ${runs:-?} | $crashes | ${cov:-?} |"
}
for t in "${targets[@]}"; do
    while (($(jobs -rp | wc -l) >= max_jobs)); do
        wait -n || true
    done
    run_one "$t" &
done
wait
