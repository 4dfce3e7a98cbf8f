#!/usr/bin/env bash
# The fault campaign: a real cluster of this tree's binaries (three nats-servers in one
# JetStream cluster with replicas 3 and every write flushed, an active and a standby
# scheduler, four agents) runs a mixed workload as two users while faults drawn from one seed
# kill and pause its processes; then the faults stop, the cluster settles, and a checker says
# whether any promise broke. See docs/reliability.md.
#
#   scripts/chaos.sh [--minutes M | --seconds N] [--seed S|fresh] [--release]
#
#   --minutes M   how long faults are injected (default: 1)
#   --seconds N   the same, in seconds
#   --seed S      the seed of the workload and the faults (default 1); `fresh` draws one from
#                 the clock and prints it. The same seed replays the same draws.
#   --release     build and run optimised binaries
#
# The last line is one JSON object (seed, jobs, attempts, faults by kind, violations, settle
# time); the exit status is 1 when there is a violation, and the line before it says the
# command that reproduces it. Everything the campaign starts lives under a temporary
# directory, removed at the end; Ctrl+C stops it and takes the cluster down. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
seed=1
release=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) [ $# -ge 2 ] || { echo "chaos.sh: --minutes needs a number" >&2; exit 2; }
               seconds=$(( $2 * 60 )); shift ;;
    --seconds) [ $# -ge 2 ] || { echo "chaos.sh: --seconds needs a number" >&2; exit 2; }
               seconds=$2; shift ;;
    --seed)    [ $# -ge 2 ] || { echo "chaos.sh: --seed needs a number or fresh" >&2; exit 2; }
               seed=$2; shift ;;
    --release) release=(--release) ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$seconds" in ''|*[!0-9]*) echo "chaos.sh: --seconds/--minutes: not a number" >&2; exit 2 ;; esac
if [ "$seed" = fresh ]; then
  seed=$(( $(date +%s%N) % 1000000000 ))
  echo "[chaos] fresh seed: $seed" >&2
fi
case "$seed" in ''|*[!0-9]*) echo "chaos.sh: --seed $seed: not a number" >&2; exit 2 ;; esac

scripts/setup.sh "${release[@]}" >&2
exec cargo test -q "${release[@]}" -p mgpu-tests --test chaos -- --seed "$seed" --seconds "$seconds"
