#!/usr/bin/env bash
# The one test command (the README's and CI's): formatting, lints, no import
# cycles between the files of a crate, then every test.
# On a fresh machine with only Rust it installs what it needs first (scripts/setup.sh).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
step() { printf '\n==> %s\n' "$*"; }

step "setup (nats-server, build)"
scripts/setup.sh
step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path services/job-guard/Cargo.toml -- --check
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
  cargo clippy --manifest-path services/job-guard/Cargo.toml --target-dir target --quiet -- -D warnings
fi
step "no import cycles between files"
cargo run -q -p mgpu-tests --bin import-cycles
# The debug build setup.sh made (scripts/simulate.sh builds release, for long runs), every
# fault kind drawn.
step "scheduler simulation: 60 seeds (as scripts/simulate.sh)"
target/debug/mgpu-simulate --seeds 60 --minutes 3
step "the web page's own tests (node --test: signing, the output buffer, the store, the usage sums)"
(cd services/web && npm test --silent)
step "cargo test (unit, property, end-to-end against a real nats-server, the fault campaign's kept seeds)"
export MGPU_NATS_SERVER="$root/.tools/bin/nats-server"
cargo test --workspace -- "$@"
# Only for a whole run: arguments filter the tests above.
if [ $# -eq 0 ] && [ "${MGPU_CHAOS:-1}" != 0 ]; then
  step "fault campaign: 45 s, a fresh seed (docs/reliability.md)"
  scripts/chaos.sh --seconds 45 --seed fresh
fi
