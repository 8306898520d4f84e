#!/usr/bin/env bash
# Stop the daemons that hpc_lab/local_cluster/up.sh started, by their pid files, and nothing else:
# slurmd (every node), slurmctld, slurmdbd, and munged / MariaDB only if up.sh was the one to start them.
# Configuration, state, logs and the nodes' network namespaces stay, so up.sh brings it all back.
#
#   sudo hpc_lab/local_cluster/down.sh               # everything up.sh started
#   sudo hpc_lab/local_cluster/down.sh --slurm-only  # slurmctld and slurmd only
set -uo pipefail

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
RUN=$HOME_DIR/run
SLURM_ONLY=0
case "${1:-}" in
  --slurm-only) SLURM_ONLY=1 ;;
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "down.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "down.sh: run as root" >&2; exit 2; }

stop() {  # stop PIDFILE NAME: TERM the process the pid file names, if it is NAME; KILL after 20 s
  local pid i
  [ -f "$1" ] || return 0
  pid=$(cat "$1" 2>/dev/null)
  if [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]; then
    echo "down.sh: stopping $2 (pid $pid)"
    kill "$pid" 2>/dev/null
    for i in $(seq 1 40); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
    [ -d "/proc/$pid" ] && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1"
}

for pidfile in "$RUN"/slurmd.pid "$RUN"/node*/slurmd.pid; do stop "$pidfile" slurmd; done
stop "$RUN/slurmctld.pid" slurmctld
[ "$SLURM_ONLY" = 1 ] && exit 0
stop "$RUN/slurmdbd.pid" slurmdbd
if grep -qxF mariadb "$RUN/started-by-up" 2>/dev/null; then
  stop /run/mysqld/mysqld.pid mariadbd
  # mysqld_safe would restart it; it ends by itself once mariadbd stops cleanly.
fi
if grep -qxF munged "$RUN/started-by-up" 2>/dev/null; then
  stop /run/munge/munged.pid munged
fi
rm -f "$RUN/started-by-up"
echo "down.sh: done"
