#!/usr/bin/env bash
# Stops everything scripts/dev-up.sh started: agents first, then the schedulers, then every
# nats-server (nats-server, nats-server-2, …). Each gets SIGTERM and 15 s to finish before SIGKILL. Data in .mgpu/ stays.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
run="$root/.mgpu/run"
[ -d "$run" ] || { echo "[dev-down] nothing to stop"; exit 0; }

stop() {
  local pidfile="$1" name pid
  name="$(basename "$pidfile" .pid)"
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; echo "[dev-down] $name killed"; else echo "[dev-down] $name stopped"; fi
  fi
  rm -f "$pidfile"
}

shopt -s nullglob
for f in "$run"/node*.pid; do stop "$f"; done
for f in "$run"/scheduler*.pid; do stop "$f"; done
for f in "$run"/*.pid; do stop "$f"; done
