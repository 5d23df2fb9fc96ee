#!/usr/bin/env bash
# Stop the loopback Slurm cluster started by slurm-up.sh and delete its state, spool, logs and
# slurm.conf, so that the next slurm-up.sh starts clean (job ids from 1, no stale node state).
# munged is left running: it is cheap, other tools may use it, and slurm-up.sh reuses it.
# Only touches daemons named in our own pid files, never a real cluster's.
set -euo pipefail

STATE=/var/lib/sftprof-slurm
CONF=/etc/slurm/slurm.conf
MARK='# written by sftprof scripts/slurm-up.sh'

if [ -e "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
  echo "slurm-down: $CONF was not written by slurm-up.sh; leaving it and its daemons alone" >&2
  exit 1
fi

# Cancel jobs first, so that no slurmstepd outlives its slurmd (only with a live controller:
# scancel would otherwise sit out its connect retries).
ctld=$(cat "$STATE/slurmctld.pid" 2>/dev/null || true)
if [ "$(cat "/proc/$ctld/comm" 2>/dev/null)" = slurmctld ] && scancel -p gh 2>/dev/null; then
  for _ in $(seq 20); do [ -z "$(squeue -h -p gh 2>/dev/null)" ] && break; sleep 0.5; done
fi

for d in slurmd slurmctld; do
  pidfile="$STATE/$d.pid"
  [ -s "$pidfile" ] || continue
  pid=$(cat "$pidfile")
  # A stale pid file may name a reused pid: only signal it if it is still that daemon.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$d" ] || continue
  kill "$pid"
  for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
  if [ -e "/proc/$pid" ]; then kill -KILL "$pid"; fi   # still there after 10 s
done

rm -rf "$STATE" "$CONF"
