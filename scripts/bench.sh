#!/usr/bin/env bash
# The benchmark suite of issue #6: builds the release binaries, starts real clusters
# (nats-server, scheduler, agents) on this machine and measures submit rate, submit -> start
# latency, drain rate and `mgpu queue` latency. One JSON object per scenario goes to stdout
# and to bench/results/<UTC timestamp>.jsonl (git-ignored); progress goes to stderr.
#
#   scripts/bench.sh [--quick]
#
#   --quick   reduced sizes (a few minutes on a 2-core machine)
#
# Benchmarks are not tests: nothing here fails on a missed target (see "pass" in each line).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
args=()
for arg in "$@"; do
  case "$arg" in
    --quick) args+=(--quick) ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown option $arg" >&2; exit 2 ;;
  esac
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
