# mgpu tasks; `just` is optional, each recipe wraps a script.

# Start a local cluster (nats-server, scheduler, agents).
up *ARGS:
    scripts/dev-up.sh {{ARGS}}

# Stop the local cluster.
down:
    scripts/dev-down.sh

# Formatting, lints and every test.
test *ARGS:
    scripts/test.sh {{ARGS}}

# Formatting and lints only.
lint:
    cargo fmt --all -- --check
    cargo fmt --manifest-path services/job-guard/Cargo.toml -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then cargo clippy --manifest-path services/job-guard/Cargo.toml --target-dir target -- -D warnings; fi

# The scheduler's deterministic simulation: `just simulate --seeds 1000`, `--seed S` to replay.
simulate *ARGS:
    scripts/simulate.sh {{ARGS}}

# Benchmarks (release build): one JSON line per scenario, also in bench/results/.
bench *ARGS:
    scripts/bench.sh {{ARGS}}

# Debian packages (mgpu, mgpu-scheduler, mgpu-node) in target/debian/.
package *ARGS:
    scripts/package.sh {{ARGS}}
