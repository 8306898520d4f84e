#!/usr/bin/env bash
# Stop or start one daemon of the local cluster as a site's restart does (an upgrade, a failover, maintenance:
# SIGTERM and wait for it to end; start it and wait until it answers), for the fault tests and to try by hand.
#
#   sudo hpc_lab/local_cluster/daemon.sh stop slurmctld     # the controller: jobs and their steps run on,
#       every command that asks it gets no answer (sbatch, squeue, scontrol, srun starting a step)
#   sudo hpc_lab/local_cluster/daemon.sh start slurmctld    # back from its saved state; the jobs carry on
#   sudo hpc_lab/local_cluster/daemon.sh restart slurmctld
#   ... slurmdbd (accounting: sacct, sacctmgr) and mariadb (accounting's database) the same way.
#
# `start` returns once the daemon answers (scontrol ping, sacctmgr, mysqladmin ping), or fails after 60 s with
# the last lines of its log. The cluster must have been brought up by up.sh (with accounting, for the last two).
set -euo pipefail

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# = 2 ] || { usage >&2; exit 2; }
action=$1 daemon=$2
case "$action" in stop|start|restart) ;; *) usage >&2; exit 2 ;; esac
case "$daemon" in
  slurmctld) pidfile=$RUN/slurmctld.pid comm=slurmctld log=$LOG/slurmctld.log answers=(scontrol ping) ;;
  slurmdbd) pidfile=$RUN/slurmdbd.pid comm=slurmdbd log=$LOG/slurmdbd.log answers=(sacctmgr -n show cluster) ;;
  mariadb) pidfile=/run/mysqld/mysqld.pid comm=mariadbd log=$LOG/mariadb/mariadb.log answers=(mysqladmin ping) ;;
  *) echo "daemon.sh: '$daemon' is not one of slurmctld, slurmdbd, mariadb" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "daemon.sh: run as root" >&2; exit 2; }
[ -f "$HOME_DIR/etc/slurm.conf" ] || { echo "daemon.sh: no cluster in $HOME_DIR: run up.sh first" >&2; exit 2; }
export PATH=$PATH:/usr/sbin:/sbin

if [ "$action" != start ]; then
  # (mysqld_safe, MariaDB's keeper, ends by itself once mariadbd has stopped cleanly)
  stop_daemon "$pidfile" "$comm"
fi
if [ "$action" != stop ]; then
  alive "$pidfile" "$comm" || { echo "daemon.sh: starting $daemon"; "start_$daemon"; }
  wait_for 60 "${answers[@]}" || {
    echo "daemon.sh: $daemon does not answer ${answers[*]} after 60 s; last lines of $log:" >&2
    tail -n 25 "$log" >&2 2>/dev/null; exit 1; }
fi
