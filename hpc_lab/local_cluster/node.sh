#!/usr/bin/env bash
# One compute node of the local cluster of `up.sh --nodes N` (N >= 2: each node is a network namespace).
#
#   sudo hpc_lab/local_cluster/node.sh crash node2   # as a power cut would: SIGKILL at once to its slurmd and
#       to every process in its namespace (slurmstepd, the job's tasks); no handler runs, nothing is flushed
#       or said. slurmctld finds the node silent, calls it DOWN after SlurmdTimeout (10 s; about 30 s in all,
#       with the pings) and ends its jobs NODE_FAIL; a job with --requeue goes back to the queue.
#   sudo hpc_lab/local_cluster/node.sh boot node2    # start its slurmd (if not running): the node registers
#       and, with ReturnToService=2, takes jobs again. up.sh boots every node this way.
set -euo pipefail

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"  # RUN, LOG, RELEASE_ROOT
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# = 2 ] || { usage >&2; exit 2; }
action=$1 node=$2
case "$node" in node[1-9]|node[1-9][0-9]) ;; *) echo "node.sh: '$node' is not a node name (node1, node2, ...)" >&2; exit 2 ;; esac
ns=/run/netns/tg$node
[ -e "$ns" ] || { echo "node.sh: no network namespace $ns: is the cluster up with --nodes 2 or more?" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "node.sh: run as root" >&2; exit 2; }

slurmd_alive() {
  local pid
  pid=$(cat "$RUN/$node/slurmd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] || return 1
  # (a slurmd just killed by `crash` can linger as a zombie until it is reaped, its name still slurmd: a boot
  # right after the crash must not take it for a live one)
  [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

case "$action" in
  crash)
    kill_namespace "$(basename "$ns")" || { echo "node.sh: $node did not crash whole" >&2; exit 1; }
    echo "node.sh: $node crashed (every process in its namespace killed)"
    exit 0 ;;
  boot)
    slurmd_alive && exit 0
    export PATH=$PATH:/usr/sbin:/sbin
    mkdir -p "$RUN/$node" /run/tinygpt-slurmd
    # Its own hostname (UTS namespace) and its own /run/tinygpt-slurmd (mount namespace), where slurm.conf's
    # SlurmdPidFile is: every node's slurmd believes it is alone on its host. In the same mount namespace, the
    # cluster's Slurm release as /usr where it is not this machine's own (lib.sh's overlay_usr).
    release=${RELEASE_ROOT:+"$(overlay_usr) && "}
    # With a login node (up.sh --login), the cluster's file system at /cluster, as on the login node.
    cluster=""
    [ -d "$CLUSTER_FS" ] && cluster="mount --bind '$CLUSTER_FS' '$CLUSTER_MOUNT' && "
    nsenter --net="$ns" unshare --uts --mount --propagation private sh -c \
      "hostname $node && mount --bind '$RUN/$node' /run/tinygpt-slurmd && $cluster$release exec /usr/sbin/slurmd" \
      >>"$LOG/slurmd.$node.out" 2>&1 || {
        echo "node.sh: slurmd ($node) did not start; last lines of $LOG/slurmd.$node.log:" >&2
        tail -n 25 "$LOG/slurmd.$node.log" >&2 2>/dev/null; exit 1; } ;;
  *) usage >&2; exit 2 ;;
esac
