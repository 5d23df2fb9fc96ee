#!/usr/bin/env bash
# Install and start a single-node Slurm cluster on loopback, partition "gh", for tests and CI
# (Debian 12, as root, no systemd: the daemons are started by hand). Safe to run again: when
# our daemons already run it only checks that the partition is up. Stop it with slurm-down.sh.
# Env: SFTPROF_SLURM_CPU_FACTOR (default 4) = how many Slurm CPUs each real core counts as.
set -euo pipefail

STATE=/var/lib/sftprof-slurm       # our own spool, state, pid and log files
CONF=/etc/slurm/slurm.conf         # must be here: job steps (slurmstepd) ignore SLURM_CONF
MARK='# written by sftprof scripts/slurm-up.sh'
NODE=$(hostname -s)

log_tail() { tail -n 20 "$STATE"/slurmctld.log "$STATE"/slurmd.log 2>/dev/null || true; }
# Is the daemon named in this pid file running? (compare the name: pids get reused)
alive() { [ -s "$STATE/$1.pid" ] && [ "$(cat "/proc/$(cat "$STATE/$1.pid")/comm" 2>/dev/null)" = "$1" ]; }

# Never clobber a real cluster's config.
if [ -e "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
  echo "slurm-up: $CONF exists and was not written by this script; refusing to touch it" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
   || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    munge slurm-wlm >/dev/null
fi

# Munge: the key must exist and everything must belong to the munge user, or munged won't
# start; /run/munge is on tmpfs (systemd would create it). munged daemonizes itself.
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge /var/lib/munge
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || runuser -u munge -- mungekey -c -k /etc/munge/munge.key
chown -R munge: /etc/munge /run/munge /var/log/munge /var/lib/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null
fi

if ! alive slurmctld && ! alive slurmd; then
  # Fresh start: pick two free non-default ports (defaults are 6817/6818).
  ports=()
  for p in $(seq 16817 16899); do
    # Free = nothing accepts a connection there (bash's /dev/tcp: no iproute2 needed).
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || ports+=("$p")
    [ "${#ports[@]}" -ge 2 ] && break
  done
  [ "${#ports[@]}" -ge 2 ] || { echo "slurm-up: no free ports in 16817-16899" >&2; exit 1; }
  # The node advertises CPU_FACTOR x the real cores and config_overrides keeps slurmd from
  # draining it for "low CPU count": a 2-core machine can then run a 2-rank job next to
  # other jobs (and a job with more tasks than cores). Fine for tests, no binding (task/none).
  cpus=$(( $(nproc) * ${SFTPROF_SLURM_CPU_FACTOR:-4} ))
  mem=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 95 / 100 ))
  install -d -m 0755 /etc/slurm "$STATE" "$STATE/state" "$STATE/spool"
  cat >"$CONF" <<EOF
$MARK
ClusterName=sftprof
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=${ports[0]}
SlurmdPort=${ports[1]}
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=gh Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
fi

# Both daemons fork into the background themselves.
alive slurmctld || slurmctld || { log_tail; exit 1; }
alive slurmd || slurmd || { log_tail; exit 1; }

# Ready when the node has registered: idle, or mix/alloc if jobs already run on it.
for _ in $(seq 60); do
  case "$(sinfo -h -p gh -o %t 2>/dev/null)" in idle|mix|alloc) exit 0 ;; esac
  sleep 1
done
echo "slurm-up: partition gh not up after 60 s: sinfo says '$(sinfo -h -p gh -o %t 2>&1)'" >&2
log_tail >&2
exit 1
