#!/usr/bin/env bash
# Runs every fuzz target under cargo-fuzz (nightly Rust, libFuzzer), one
# after the other, and prints for each the inputs run and the seconds
# libFuzzer reports on its final "Done N runs in S second(s)" line.
#
#   fuzz/run.sh runs N       each target for N inputs
#   fuzz/run.sh seconds S    each target for about S seconds
#
# FUZZ_TARGETS picks targets (default: every fuzz/fuzz_targets/*.rs);
# FUZZ_SANITIZER is cargo-fuzz's -s (default none: core has no unsafe code,
# and debug assertions and overflow checks stay on). New inputs go to
# fuzz/target/corpus/<target> (the seeds in fuzz/corpus/ are only read),
# crashes to fuzz/artifacts/<target>/, logs to fuzz/target/logs/.
set -uo pipefail
cd "$(dirname "$0")/.."

case "${1:-} ${2:-}" in
    "runs "[0-9]*) limit="-runs=$2" ;;
    "seconds "[0-9]*) limit="-max_total_time=$2" ;;
    *)
        echo "usage: $0 runs N | seconds S" >&2
        exit 2
        ;;
esac
targets=${FUZZ_TARGETS:-$(for f in fuzz/fuzz_targets/*.rs; do basename "$f" .rs; done)}
sanitizer=${FUZZ_SANITIZER:-none}
fuzz=(cargo +nightly fuzz)
opts=(-s "$sanitizer" --features libfuzzer)
logs=fuzz/target/logs
mkdir -p "$logs"

echo "=== building the fuzz targets (cargo-fuzz, nightly, sanitizer $sanitizer)"
"${fuzz[@]}" build "${opts[@]}" || exit 1

echo "=== fuzzing, $limit per target ($(date -u +%Y-%m-%d), $(nproc) cores)"
printf '%-16s %12s %9s  %s\n' target inputs seconds result
failed=0
for t in $targets; do
    mkdir -p "fuzz/target/corpus/$t"
    log="$logs/$t.log"
    if "${fuzz[@]}" run "${opts[@]}" "$t" "fuzz/target/corpus/$t" "fuzz/corpus/$t" -- \
        "$limit" -print_final_stats=1 >"$log" 2>&1; then
        result=ok
    else
        result="FAILED: see $log and fuzz/artifacts/$t/"
        failed=1
    fi
    done_line=$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1)
    if [ -n "$done_line" ]; then
        inputs=$(awk '{print $2}' <<<"$done_line")
        seconds=$(awk '{print $5}' <<<"$done_line")
    else
        inputs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        seconds="?"
    fi
    printf '%-16s %12s %9s  %s\n' "$t" "${inputs:-?}" "$seconds" "$result"
done
exit $failed
