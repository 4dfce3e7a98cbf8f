#!/usr/bin/env bash
# Runs the fuzz targets (property tests named `fuzz_*`: every inbound message type, the
# heartbeat through the scheduler's node table, the agent's inbox and job input) for a
# bounded time with many more cases than `cargo test` uses, round after round with fresh
# random seeds, and reports. A failure prints proptest's minimal failing input and stops.
#
#   scripts/fuzz.sh [--seconds N] [--cases N]    (defaults: 300 seconds, 20000 cases a round)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds=300
cases=20000
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --cases) cases="$2"; shift 2 ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done

packages=(-p mgpu-protocol -p mgpu-scheduler -p mgpu-node)
echo "==> building the fuzz targets"
cargo test "${packages[@]}" --no-run --quiet

deadline=$((SECONDS + seconds))
rounds=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
while ((SECONDS < deadline)); do
    rounds=$((rounds + 1))
    # Seeds are random each round; a failure is shrunk and reported right here, not saved.
    # The round is cut off at the deadline (exit status 124), which ends the run.
    status=0
    PROPTEST_CASES="$cases" PROPTEST_DISABLE_FAILURE_PERSISTENCE=1 \
        timeout "$((deadline - SECONDS))" \
        cargo test "${packages[@]}" --quiet fuzz_ >"$log" 2>&1 || status=$?
    if ((status == 124)); then
        rounds=$((rounds - 1))
        break
    elif ((status != 0)); then
        cat "$log"
        echo "==> FAILED in round $rounds after ${SECONDS}s (the minimal failing input is above)" >&2
        exit 1
    fi
    echo "round $rounds: $cases cases on every fuzz target passed (${SECONDS}s of ${seconds}s)"
done
echo "==> $rounds full round(s) of $cases cases per target in ${SECONDS}s: no panic; every input was refused cleanly or is valid"
