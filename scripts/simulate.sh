#!/usr/bin/env bash
# The scheduler's deterministic cluster simulation (services/scheduler/src/simulation):
#
#   scripts/simulate.sh [--seeds N] [--first-seed F] [--minutes M] [--active-secs S]
#   scripts/simulate.sh --seed S [--trace-logs]      # replay one seed exactly
#
# Builds mgpu-simulate (release) and runs it. The last line printed is one JSON object:
# {"seeds": …, "jobs": …, "faults": …, "steps": …, "steps_per_second": …, "violations": 0}.
# A failing seed is printed with the broken invariant, the fault kinds it still fails with
# and its trace; the exit status is 1 then.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case "${1:-}" in -h|--help) sed -n '2,10p' "$0"; exit 0 ;; esac
cargo build --quiet --release -p mgpu-scheduler --bin mgpu-simulate
exec target/release/mgpu-simulate "$@"
