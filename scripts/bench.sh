#!/usr/bin/env bash
# The benchmark suite of issue #6: builds the release binaries, starts real clusters
# (nats-server, scheduler, agents) on this machine and measures submit rate, submit -> start
# latency, drain rate and `mgpu queue` latency. One JSON object per scenario goes to stdout
# and to bench/results/<UTC timestamp>.jsonl (git-ignored); progress goes to stderr.
#
#   scripts/bench.sh [--quick] [--only GROUP]...
#
#   --quick        reduced sizes (a few minutes on a 2-core machine)
#   --only GROUP   one group of scenarios (cli, queue, scale, output, recovery, history, top, durability, estimates, web)
#
# Benchmarks are not tests: nothing here fails on a missed target (see "pass" in each line).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--quick) ;;
    --only) [ $# -ge 2 ] || { echo "bench.sh: --only needs a group" >&2; exit 2; }
            args+=(--only "$2"); shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

# nats-server and the release binaries (mgpu, mgpu-scheduler, mgpu-node) in target/release.
scripts/setup.sh --release
export MGPU_NATS_SERVER="${MGPU_NATS_SERVER:-$root/.tools/bin/nats-server}"
# A developer's `source .mgpu/env` must not point the benchmark's CLI elsewhere.
unset MGPU_SERVER MGPU_CREDS MGPU_CA

mkdir -p bench/results
out="bench/results/$(date -u +%Y%m%dT%H%M%SZ).jsonl"
# The bench target runs from target/release/deps, so the harness finds the release binaries
# in target/release.
cargo bench --quiet -p mgpu-tests --bench mgpu-bench -- "${args[@]}" | tee "$out"
echo "[bench] results in $out" >&2
