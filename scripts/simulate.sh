#!/usr/bin/env bash
# The scheduler's deterministic cluster simulation (services/scheduler/src/simulation):
#
#   scripts/simulate.sh [--seeds N] [--first-seed F] [--minutes M] [--active-secs S]
#   scripts/simulate.sh --seed S [--trace-logs]      # replay one seed exactly
#   scripts/simulate.sh --seed S --skip-faults 3,7 --no-shrink   # replay a shrunk failure
#
# Builds mgpu-simulate (release) and runs it. The last line printed is one JSON object:
# {"seeds": …, "jobs": …, "faults": …, "steps": …, "steps_per_second": …, "violations": 0}.
# A failing seed is printed with the broken invariant, shrunk to the fewest fault kinds and
# then single faults that still break it, with that run's trace and the command replaying it;
# the exit status is 1 then.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
case "${1:-}" in -h|--help) sed -n '2,12p' "$0"; exit 0 ;; esac
cargo build --quiet --release -p mgpu-scheduler --bin mgpu-simulate
exec target/release/mgpu-simulate "$@"
