#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying and testing --launcher=slurm:
# munged, slurmctld and slurmd on localhost, one partition ("debug") holding this host.
#
#   sudo scripts/slurm_localhost.sh install   # Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client munge
#   sudo scripts/slurm_localhost.sh start     # write /etc/slurm/slurm.conf, start the daemons, wait for the node
#   scripts/slurm_localhost.sh status         # the daemons' pids, sinfo and squeue
#   sudo scripts/slurm_localhost.sh stop      # stop the daemons this script started
#
# Then: python -m pytest -m slurm tests/research/test_sweep_slurm.py -n 0
#
# Needs root (the daemons run as root; munged as the munge user). Logs, state and pid files live in
# $TFJAX_SLURM_DIR (default /var/tmp/tfjax-slurm). /etc/slurm/slurm.conf is written only when it
# is absent or was written by this script: a real cluster's configuration is never touched.
# Requeued jobs wait AuthInfo cred_expire (10 s here, 120 s by default) before they start again, and
# the scheduler looks at pending jobs every 2 s (60 s by default).
# Plain process tracking (proctrack/linuxproc, task/none): no cgroups needed. No accounting
# database, so `sacct` has nothing; squeue and scontrol work.
set -euo pipefail

STATE="${TFJAX_SLURM_DIR:-/var/tmp/tfjax-slurm}"
CONF=/etc/slurm/slurm.conf
MARK="# written by tfjax scripts/slurm_localhost.sh"
MUNGE_SOCKET_DIR=/run/munge

die() { echo "slurm_localhost: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (the SLURM daemons run as root): sudo $0 $1"; }

need_binaries() {
  local missing=()
  for b in munged slurmctld slurmd sbatch srun scontrol sinfo squeue; do
    command -v "$b" >/dev/null || missing+=("$b")
  done
  [ ${#missing[@]} = 0 ] || die "missing ${missing[*]}: run 'sudo $0 install' (Debian: apt-get install slurmctld slurmd slurm-client munge)"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

write_conf() {
  if [ -f "$CONF" ] && ! head -n1 "$CONF" | grep -qF "$MARK"; then
    die "$CONF exists and was not written by this script; not touching a real cluster's configuration"
  fi
  local host cpus mem
  host="$(hostname -s)"
  cpus="$(nproc)"
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  cat > "$CONF" <<EOF
$MARK
ClusterName=tfjax-localhost
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CryptoType=crypto/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi  # already running
  [ -f /etc/munge/munge.key ] || { mkdir -p /etc/munge; (command -v mungekey >/dev/null && mungekey -c -f) || \
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null; }
  chown munge:munge /etc/munge /etc/munge/munge.key && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
  mkdir -p "$MUNGE_SOCKET_DIR" /var/lib/munge /var/log/munge
  chown munge:munge "$MUNGE_SOCKET_DIR" /var/lib/munge /var/log/munge
  chmod 755 "$MUNGE_SOCKET_DIR"
  runuser -u munge -- munged --pid-file="$MUNGE_SOCKET_DIR/munged.pid" \
    || die "munged did not start (see /var/log/munge/munged.log)"
  cp "$MUNGE_SOCKET_DIR/munged.pid" "$STATE/munged.pid"
  for _ in $(seq 20); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.5
  done
  die "munged runs but credentials do not round-trip (see /var/log/munge/munged.log)"
}

cmd_install() {
  need_root install
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurmctld slurmd slurm-client munge
}

cmd_start() {
  need_root start
  need_binaries
  mkdir -p "$STATE"
  write_conf
  start_munge
  if ! pid_alive "$STATE/slurmctld.pid"; then
    slurmctld -c || die "slurmctld did not start: $(tail -n 5 "$STATE/slurmctld.log" 2>/dev/null)"
  fi
  if ! pid_alive "$STATE/slurmd.pid"; then
    slurmd || die "slurmd did not start: $(tail -n 5 "$STATE/slurmd.log" 2>/dev/null)"
  fi
  local state=""
  for _ in $(seq 60); do
    state="$(sinfo -h -o %T 2>/dev/null | head -n1 || true)"
    case "$state" in idle*|mixed*|allocated*) echo "slurm_localhost: node $(hostname -s) is $state"; return;; esac
    sleep 0.5
  done
  die "the node did not become idle (state '$state'); see $STATE/slurmctld.log and $STATE/slurmd.log"
}

cmd_stop() {
  need_root stop
  for d in slurmd slurmctld munged; do
    local f="$STATE/$d.pid"
    if pid_alive "$f"; then
      kill "$(cat "$f")"
      for _ in $(seq 20); do pid_alive "$f" || break; sleep 0.5; done
      echo "slurm_localhost: stopped $d"
    fi
    rm -f "$f"
  done
}

cmd_status() {
  local rc=0
  for d in munged slurmctld slurmd; do
    if pid_alive "$STATE/$d.pid"; then echo "$d: running (pid $(cat "$STATE/$d.pid"))"
    else echo "$d: not running"; rc=1; fi
  done
  if [ $rc = 0 ]; then sinfo; squeue; fi
  return $rc
}

case "${1:-}" in
  install) cmd_install ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
