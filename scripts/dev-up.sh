#!/usr/bin/env bash
# Starts a local mgpu cluster: one nats-server (or a NATS cluster of several), the scheduler
# (or several replicas) and N node agents.
#
#   scripts/dev-up.sh [--nodes N] [--servers N] [--schedulers N] [--gpus SPEC] [--port PORT] [--web-port PORT] [--tls] [--release]
#
#   --nodes N        agents to start, named node001, node002, … (default 1)
#   --schedulers N   scheduler replicas, named scheduler, scheduler-2, … (default 1): one is
#                    active, the others stand by and take over within seconds if it dies
#                    (try `kill -9 $(cat .mgpu/run/scheduler.pid)`)
#   --gpus SPEC      declare each agent's GPUs, e.g. 2x24GiB or 4x80GiB,1x16GiB. Without it,
#                    agents read the GPUs through NVML, and where no NVIDIA driver exists they
#                    declare 2 GPUs of 24 GiB and say so in `mgpu nodes`.
#   --port PORT      NATS client port (default 4222); with --servers N, ports PORT..PORT+N-1
#   --servers N      nats-servers forming one NATS cluster (default 1), named mgpu-1, mgpu-2, …,
#                    routes on ports 6222.., JetStream data in .mgpu/jetstream/mgpu-<i>, pid
#                    files nats-server.pid, nats-server-2.pid, …; every component and
#                    .mgpu/env get all the URLs, and streams get min(3, N) replicas
#   --web-port PORT  where `mgpu web` serves the dashboard, on 127.0.0.1 (default 8080; 0: not
#                    started); sign in there with .mgpu/auth/keys/user-<you>.nk
#   --tls            TLS between every component and the server(s), and between servers:
#                    `mgpu admin init --tls` makes a CA and a server certificate in .mgpu/auth
#                    (kept on later runs), every component and .mgpu/env get
#                    MGPU_CA=.mgpu/auth/ca.pem. Run scripts/dev-down.sh first to switch a
#                    running cluster to TLS or back.
#
# Everything lives in .mgpu/ (git-ignored): credentials and server config in .mgpu/auth,
# JetStream data in .mgpu/jetstream, logs in .mgpu/logs/<name>.log, pid files in
# .mgpu/run/<name>.pid, the agents' state files (the jobs they run) in .mgpu/state.
# Running it again starts only what is not running. Stop it all with scripts/dev-down.sh.
# Afterwards: `source .mgpu/env` puts mgpu on PATH and sets MGPU_SERVER and MGPU_CREDS.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
nodes=1 servers=1 schedulers=1 gpus="" port=4222 web_port=8080 profile=debug setup_args=() init_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
    --servers) servers="${2:?--servers needs a number}"; shift 2 ;;
    --schedulers) schedulers="${2:?--schedulers needs a number}"; shift 2 ;;
    --gpus) gpus="${2:?--gpus needs a spec like 2x24GiB}"; shift 2 ;;
    --port) port="${2:?--port needs a number}"; shift 2 ;;
    --web-port) web_port="${2:?--web-port needs a number}"; shift 2 ;;
    --tls) init_args+=(--tls); shift ;;
    --release) profile=release; setup_args+=(--release); shift ;;
    # The comment block at the top of this file, without its `# `.
    -h|--help) awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; exit 0 ;;
    *) echo "dev-up.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 999 ] || { echo "dev-up.sh: --nodes must be 1..999" >&2; exit 2; }
[[ "$servers" =~ ^[0-9]+$ ]] && [ "$servers" -ge 1 ] && [ "$servers" -le 9 ] || { echo "dev-up.sh: --servers must be 1..9" >&2; exit 2; }
[[ "$web_port" =~ ^[0-9]+$ ]] && [ "$web_port" -le 65535 ] || { echo "dev-up.sh: --web-port must be 0..65535" >&2; exit 2; }
[[ "$schedulers" =~ ^[0-9]+$ ]] && [ "$schedulers" -ge 1 ] && [ "$schedulers" -le 9 ] || { echo "dev-up.sh: --schedulers must be 1..9" >&2; exit 2; }

say() { printf '[dev-up] %s\n' "$*"; }
scripts/setup.sh "${setup_args[@]}"

bin="$root/target/$profile"
state="$root/.mgpu"
auth="$state/auth"
mkdir -p "$state/logs" "$state/run" "$state/jetstream" "$state/state"

user_name="$(id -un 2>/dev/null || echo "${USER:-user}")"
principal="$(printf '%s' "$user_name" | tr -c 'A-Za-z0-9_-' '_')"

# Credentials and server configuration (existing keys are kept). Like every nats-server
# configuration mgpu writes, it sets JetStream's `sync_interval: always`: each message is on
# disk before it is acknowledged (see "Durability" in docs/operations.md).
"$bin/mgpu" admin init --dir "$auth" --port "$port" --store-dir "$state/jetstream" --servers "$servers" "${init_args[@]}" >/dev/null
# Every component started below inherits MGPU_CA, which makes it connect with TLS only; an
# MGPU_CA left in this shell by an earlier TLS run must not reach a plaintext cluster.
if [ "${#init_args[@]}" -gt 0 ]; then export MGPU_CA="$auth/ca.pem"; else unset MGPU_CA; fi
for i in $(seq 1 "$nodes"); do
  "$bin/mgpu" admin add-node "$(printf 'node%03d' "$i")" --dir "$auth" >/dev/null
done
"$bin/mgpu" admin add-user "$principal" --dir "$auth" >/dev/null

running() { [ -f "$state/run/$1.pid" ] && kill -0 "$(cat "$state/run/$1.pid")" 2>/dev/null; }
# start NAME COMMAND...: runs COMMAND in the background unless NAME already runs.
start() {
  local name="$1"; shift
  if running "$name"; then say "$name already running (pid $(cat "$state/run/$name.pid"))"; return 1; fi
  nohup "$@" >>"$state/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$state/run/$name.pid"
  say "$name started (pid $!, log .mgpu/logs/$name.log)"
}

# Server i (1-based) is nats-server / server.conf for the first, nats-server-i / server-i.conf
# after it: the names `mgpu admin init --servers N` writes.
urls=()
for i in $(seq 1 "$servers"); do
  if [ "$i" -eq 1 ]; then name=nats-server conf=server.conf; else name="nats-server-$i" conf="server-$i.conf"; fi
  if ! start "$name" "$root/.tools/bin/nats-server" -c "$auth/$conf"; then
    # Already running: make it pick up principals added just now.
    "$root/.tools/bin/nats-server" --signal "reload=$(cat "$state/run/$name.pid")" >/dev/null 2>&1 || true
  fi
  urls+=("nats://127.0.0.1:$((port + i - 1))")
done
for i in $(seq 1 "$servers"); do
  p=$((port + i - 1))
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break
    sleep 0.1
  done
  (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "dev-up.sh: nats-server on port $p did not start; see .mgpu/logs/" >&2; exit 1; }
done

server="$(IFS=,; echo "${urls[*]}")"
# One person's cluster: jobs run as you. Started as root, the agents would refuse to run
# your jobs as root unless told they may.
run_as_args=()
[ "$(id -u)" -eq 0 ] && run_as_args=(--allow-root-jobs)
# A NATS cluster first connects its routes and elects a JetStream leader; streams are created
# (with their replicas) once it answers, so the scheduler starts on a ready cluster.
if [ "$servers" -gt 1 ]; then
  for attempt in $(seq 1 60); do
    timeout 10 env MGPU_SERVER="$server" MGPU_CREDS="$auth/keys/admin-admin.nk" \
      "$bin/mgpu" admin setup --dir "$auth" >/dev/null 2>&1 && break
    [ $((attempt % 5)) -eq 0 ] && say "waiting for the NATS cluster to elect its JetStream leader"
    [ "$attempt" -eq 60 ] && { echo "dev-up.sh: the NATS cluster did not form; see .mgpu/logs/nats-server*.log" >&2; exit 1; }
    sleep 0.5
  done
  say "NATS cluster formed; streams created with $(( servers < 3 ? servers : 3 )) replicas"
fi
# Replicas share the scheduler's key: whichever holds the lease acts, the others stand by.
for i in $(seq 1 "$schedulers"); do
  if [ "$i" -eq 1 ]; then name=scheduler; else name="scheduler-$i"; fi
  MGPU_SERVER="$server" MGPU_CREDS="$auth/keys/scheduler-scheduler.nk" MGPU_PRINCIPALS="$auth/principals.json" \
    start "$name" "$bin/mgpu-scheduler" || true
done
# Notifications (`mgpu submit --notify`, `mgpu notify`): e-mail needs `smtp` in [notify] of
# .mgpu/notify.toml (see docs/notifications.md); webhooks work without it.
[ -f "$state/notify.toml" ] || printf '[notify]\n# smtp = "smtp://127.0.0.1:25"\n' >"$state/notify.toml"
MGPU_SERVER="$server" MGPU_CREDS="$auth/keys/notify-notify.nk" MGPU_NOTIFY_CONFIG="$state/notify.toml" \
  start notify "$bin/mgpu-notify" || true
for i in $(seq 1 "$nodes"); do
  node="$(printf 'node%03d' "$i")"
  if [ -n "$gpus" ]; then gpu_args=(--gpus "$gpus"); else gpu_args=(--fallback-gpus 2x24GiB); fi
  # The state file lets a restarted agent stop the jobs its crashed predecessor left running.
  MGPU_SERVER="$server" MGPU_CREDS="$auth/keys/node-$node.nk" \
    start "$node" "$bin/mgpu-node" --node "$node" "${gpu_args[@]}" --state-dir "$state/state" "${run_as_args[@]}" || true
done

cat >"$state/env" <<ENV
# Written by scripts/dev-up.sh: \`source .mgpu/env\` to use the local cluster.
export MGPU_SERVER="$server"
export MGPU_CREDS="$auth/keys/user-$principal.nk"
export MGPU_AUTH_DIR="$auth"
export PATH="$bin:\$PATH"
ENV
if [ -n "${MGPU_CA:-}" ]; then
  echo "export MGPU_CA=\"$MGPU_CA\"" >>"$state/env"
else
  echo "unset MGPU_CA" >>"$state/env"
fi

# Wait until every agent has reported in, showing progress (a new NATS cluster first elects
# its JetStream leader, which takes a few seconds).
online=0
for attempt in $(seq 1 150); do
  online=$(MGPU_SERVER="$server" MGPU_CREDS="$auth/keys/admin-admin.nk" "$bin/mgpu" nodes --json 2>/dev/null \
    | grep -o '"state": *"online"' | wc -l || true)
  [ "${online:-0}" -ge "$nodes" ] && break
  [ $((attempt % 10)) -eq 0 ] && say "waiting for agents: ${online:-0}/$nodes online"
  sleep 0.2
done
for name in scheduler $(seq -f 'scheduler-%g' 2 "$schedulers"); do
  running "$name" || { echo "dev-up.sh: $name is not running; see .mgpu/logs/$name.log" >&2; exit 1; }
done
if [ "${online:-0}" -lt "$nodes" ]; then
  echo "dev-up.sh: only ${online:-0} of $nodes agent(s) online; see .mgpu/logs/" >&2
  exit 1
fi
say "cluster up at $server ($servers nats-server(s)${MGPU_CA:+, TLS}) with $nodes node(s) and $schedulers scheduler(s)"
ws_scheme=ws; [ -n "${MGPU_CA:-}" ] && ws_scheme=wss
websocket="$ws_scheme://127.0.0.1:$((port + 58))"
say "browsers (WebSocket, the same keys): $websocket"
if [ "$web_port" -gt 0 ]; then
  start web "$bin/mgpu" web --listen "127.0.0.1:$web_port" --websocket "$websocket" || true
  for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$web_port") 2>/dev/null && break; sleep 0.1; done
  if (exec 3<>"/dev/tcp/127.0.0.1/$web_port") 2>/dev/null; then
    say "dashboard: http://127.0.0.1:$web_port/ (sign in with .mgpu/auth/keys/user-$principal.nk)"
  else
    say "the dashboard did not start (see .mgpu/logs/web.log; --web-port picks another port)"
  fi
fi
say "next: source .mgpu/env && mgpu submit -- nvidia-smi && mgpu queue"
