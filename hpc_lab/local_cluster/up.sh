#!/usr/bin/env bash
# Bring up a real Slurm 22.05 cluster on this machine: munge, MariaDB, slurmdbd (accounting, so sacct
# works), slurmctld and one slurmd per compute node.
#
#   sudo hpc_lab/local_cluster/up.sh             # one node: this host
#   sudo hpc_lab/local_cluster/up.sh --nodes 2   # two nodes, each a network namespace (node1, node2)
#   sudo hpc_lab/local_cluster/down.sh           # stop what this script started
#
# Options: --nodes N (default 1), --cpus N (CPUs per node; default nproc: nodes may oversubscribe the
# real cores), --reset (cancel every job left in the queue, e.g. by an earlier life of this machine; job
# ids keep counting up, so accounting never sees an id twice), --no-accounting (no MariaDB and slurmdbd;
# sacct will not answer).
#
# Everything lives under one folder, $TINYGPT_SLURM_HOME (default /var/lib/tinygpt-slurm):
#   etc/ (slurm.conf, slurmdbd.conf; /etc/slurm/*.conf link here), log/, run/ (pid files), state/, spool/
# Run it again at any time: it checks what is really running and starts only what is missing; when it
# is all up it returns at once. Debian/Ubuntu, as root. See ../../../shared/notes/local-slurm.md for
# what was verified on these machines.
set -euo pipefail

NODES=1
CPUS=$(nproc)
RESET=0
ACCOUNTING=1
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --cpus) CPUS=${2:?--cpus needs a number}; shift 2 ;;
    --cpus=*) CPUS=${1#*=}; shift ;;
    --reset) RESET=1; shift ;;
    --no-accounting) ACCOUNTING=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "up.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$NODES" in ''|*[!0-9]*|0) echo "up.sh: --nodes must be a whole number >= 1, got '$NODES'" >&2; exit 2 ;; esac
case "$CPUS" in ''|*[!0-9]*|0) echo "up.sh: --cpus must be a whole number >= 1, got '$CPUS'" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "up.sh: run as root (sudo $0 $*)" >&2; exit 2; }

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
CLUSTER=${TINYGPT_SLURM_CLUSTER:-local}
DB_PASS=tinygpt-local-only
SUBNET=10.77.0
BRIDGE=tgslurm0
HOST=$(hostname -s)
ETC=$HOME_DIR/etc LOG=$HOME_DIR/log RUN=$HOME_DIR/run
T0=$(date +%s.%N)

say() { printf 'up.sh: %s\n' "$*"; }
die() {  # die DAEMON LOGFILE MESSAGE
  printf 'up.sh: %s: %s\n' "$1" "$3" >&2
  if [ -n "$2" ] && [ -f "$2" ]; then printf -- '--- last lines of %s:\n' "$2" >&2; tail -n 25 "$2" >&2; fi
  exit 1
}
alive() {  # alive PIDFILE NAME: the pid file names a live process called NAME
  local pid
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]
}
wait_for() {  # wait_for SECONDS COMMAND...: retry until the command succeeds
  local deadline=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}
mark_started() { grep -qxF "$1" "$RUN/started-by-up" 2>/dev/null || echo "$1" >>"$RUN/started-by-up"; }
node_names() {
  if [ "$NODES" = 1 ]; then echo "$HOST"; else seq -f 'node%g' 1 "$NODES"; fi
}

# --- 1. packages ------------------------------------------------------------------------------------
need=(munged slurmctld slurmd sbatch)
[ "$ACCOUNTING" = 1 ] && need+=(slurmdbd mariadbd)
[ "$NODES" -gt 1 ] && need+=(ip nsenter unshare)
missing=0
for cmd in "${need[@]}"; do command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing=1; done
if [ "$missing" = 1 ]; then
  say "installing munge, Slurm and MariaDB (Debian packages)"
  pkgs=(munge slurmctld slurmd slurm-client iproute2 util-linux)
  [ "$ACCOUNTING" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >"/tmp/tinygpt-slurm-apt.log" 2>&1 || die apt /tmp/tinygpt-slurm-apt.log "apt-get update failed"
  apt-get install -y -q "${pkgs[@]}" >>"/tmp/tinygpt-slurm-apt.log" 2>&1 \
    || die apt /tmp/tinygpt-slurm-apt.log "apt-get install failed"
fi
export PATH=$PATH:/usr/sbin:/sbin

# --- 2. configuration ---------------------------------------------------------------------------------
mkdir -p "$ETC" "$LOG" "$RUN" "$HOME_DIR/state" "$HOME_DIR/spool" /etc/slurm

free_mb=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
node_mem=$(( free_mb * 6 / 10 / NODES ))
[ "$node_mem" -ge 256 ] || die memory "" "only ${free_mb} MB of memory; Slurm nodes need at least 256 MB each"

if [ "$NODES" = 1 ]; then
  ctld_host="$HOST" dbd_addr=localhost
  node_lines="NodeName=$HOST CPUs=$CPUS RealMemory=$node_mem State=UNKNOWN"
  slurmd_pid="$RUN/slurmd.pid"
else
  ctld_host="$HOST($SUBNET.1)" dbd_addr="$SUBNET.1"  # reachable from the nodes too (sacct in a job)
  node_lines=""
  for n in $(seq 1 "$NODES"); do
    node_lines+="NodeName=node$n NodeAddr=$SUBNET.$((10 + n)) CPUs=$CPUS RealMemory=$node_mem State=UNKNOWN"$'\n'
  done
  slurmd_pid="/run/tinygpt-slurmd/slurmd.pid"  # each node's mount namespace sees its own folder here
fi
if [ "$ACCOUNTING" = 1 ]; then
  accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$dbd_addr
JobAcctGatherType=jobacct_gather/linux"
else
  accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

new_conf=$(mktemp)
cat >"$new_conf" <<EOF
# Written by hpc_lab/local_cluster/up.sh --nodes $NODES; rerun it rather than editing this file.
ClusterName=$CLUSTER
SlurmctldHost=$ctld_host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$HOME_DIR/state
SlurmdSpoolDir=$HOME_DIR/spool/slurmd.%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.%n.log
SlurmdParameters=config_overrides
# No cgroup plugins: the sandbox offers no cgroup hierarchy that Slurm can use.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( node_mem / CPUS ))
KillWait=15
MinJobAge=600
JobCompType=jobcomp/none
$accounting
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
conf_changed=0
if ! cmp -s "$new_conf" "$ETC/slurm.conf"; then
  conf_changed=1
  mv "$new_conf" "$ETC/slurm.conf"
  chmod 644 "$ETC/slurm.conf"
else
  rm -f "$new_conf"
fi
ln -sfn "$ETC/slurm.conf" /etc/slurm/slurm.conf

if [ "$ACCOUNTING" = 1 ]; then
  cat >"$ETC/slurmdbd.conf.new" <<EOF
# Written by hpc_lab/local_cluster/up.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ETC/slurmdbd.conf.new"
  mv "$ETC/slurmdbd.conf.new" "$ETC/slurmdbd.conf"
  ln -sfn "$ETC/slurmdbd.conf" /etc/slurm/slurmdbd.conf
fi

# --- 3. munge -------------------------------------------------------------------------------------------
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  say "starting munged"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -f /etc/munge/munge.key ] || runuser -u munge -- /usr/sbin/mungekey --create >/dev/null 2>&1 || true
  runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || die munged /var/log/munge/munged.log "did not start"
  wait_for 10 sh -c 'munge -n | unmunge' || die munged /var/log/munge/munged.log "does not answer"
  mark_started munged
fi

# --- 4. accounting: MariaDB and slurmdbd ------------------------------------------------------------------
if [ "$ACCOUNTING" = 1 ]; then
  if ! mysqladmin ping >/dev/null 2>&1; then
    say "starting MariaDB"
    mkdir -p /run/mysqld "$LOG/mariadb" && chown mysql:mysql /run/mysqld "$LOG/mariadb"
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >"$LOG/mariadb-install.log" 2>&1 \
      || die mariadb "$LOG/mariadb-install.log" "could not create its data folder"
    setsid mysqld_safe --user=mysql --log-error="$LOG/mariadb/mariadb.log" >/dev/null 2>&1 < /dev/null &
    wait_for 60 mysqladmin ping || die mariadb "$LOG/mariadb/mariadb.log" "does not answer mysqladmin ping"
    mark_started mariadb
  fi
  mysql -u root <<EOF || die mariadb "$LOG/mariadb/mariadb.log" "could not create the accounting database"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
  if ! alive "$RUN/slurmdbd.pid" slurmdbd; then
    say "starting slurmdbd"
    /usr/sbin/slurmdbd >>"$LOG/slurmdbd.out" 2>&1 || die slurmdbd "$LOG/slurmdbd.log" "did not start"
  fi
  wait_for 60 sacctmgr -n show cluster || die slurmdbd "$LOG/slurmdbd.log" "does not answer sacctmgr"
  if [ -z "$(sacctmgr -n -P show cluster "$CLUSTER" format=cluster 2>/dev/null)" ]; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || die slurmdbd "$LOG/slurmdbd.log" "could not register cluster $CLUSTER"
  fi
fi

# --- 5. nodes as network namespaces (multi-node only) --------------------------------------------------------
if [ "$NODES" -gt 1 ]; then
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || die network "" "cannot create bridge $BRIDGE"
  fi
  ip addr show dev "$BRIDGE" | grep -q "inet $SUBNET.1/" || ip addr add "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in $(seq 1 "$NODES"); do
    ns=tgnode$n
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    if ! nsenter --net="/run/netns/$ns" ip link show "tgn${n}p" >/dev/null 2>&1; then
      ip link del "tgn${n}h" >/dev/null 2>&1 || true
      ip link add "tgn${n}h" type veth peer name "tgn${n}p"
      ip link set "tgn${n}p" netns "$ns"
    fi
    ip link set "tgn${n}h" master "$BRIDGE"
    ip link set "tgn${n}h" up
    nsenter --net="/run/netns/$ns" sh -c "
      ip addr show dev tgn${n}p | grep -q 'inet $SUBNET.$((10 + n))/' || ip addr add $SUBNET.$((10 + n))/24 dev tgn${n}p
      ip link set tgn${n}p up; ip link set lo up"
    # Every name must resolve to its bridge address in every namespace (/etc/hosts is shared).
    line="$SUBNET.$((10 + n)) node$n"
    grep -qxF "$line" /etc/hosts || { sed -i "/[[:space:]]node$n\$/d" /etc/hosts; echo "$line" >>/etc/hosts; }
  done
fi

# --- 6. slurmctld ------------------------------------------------------------------------------------------
if [ "$conf_changed" = 1 ] && alive "$RUN/slurmctld.pid" slurmctld; then
  say "configuration changed: restarting slurmctld and slurmd"
  "$(dirname "$0")/down.sh" --slurm-only >/dev/null 2>&1 || true
fi
if ! alive "$RUN/slurmctld.pid" slurmctld; then
  say "starting slurmctld"
  /usr/sbin/slurmctld >>"$LOG/slurmctld.out" 2>&1 || die slurmctld "$LOG/slurmctld.log" "did not start"
fi
wait_for 60 scontrol ping || die slurmctld "$LOG/slurmctld.log" "does not answer scontrol ping"

# --- 7. slurmd, one per node -----------------------------------------------------------------------------
if [ "$NODES" = 1 ]; then
  if ! alive "$RUN/slurmd.pid" slurmd; then
    say "starting slurmd ($HOST)"
    /usr/sbin/slurmd >>"$LOG/slurmd.out" 2>&1 || die slurmd "$LOG/slurmd.$HOST.log" "did not start"
  fi
else
  for n in $(seq 1 "$NODES"); do
    mkdir -p "$RUN/node$n"
    if ! alive "$RUN/node$n/slurmd.pid" slurmd; then
      say "starting slurmd (node$n, $SUBNET.$((10 + n)))"
      mkdir -p /run/tinygpt-slurmd
      nsenter --net="/run/netns/tgnode$n" unshare --uts --mount --propagation private sh -c \
        "hostname node$n && mount --bind '$RUN/node$n' /run/tinygpt-slurmd && exec /usr/sbin/slurmd" \
        >>"$LOG/slurmd.node$n.out" 2>&1 || die "slurmd (node$n)" "$LOG/slurmd.node$n.log" "did not start"
    fi
  done
fi

# --- 8. wait until every node is idle and accounting answers ------------------------------------------------
names=$(node_names | paste -sd, -)
nodes_ready() {
  local states
  states=$(sinfo -h -N -n "$names" -o '%t' 2>/dev/null) || return 1
  [ "$(echo "$states" | grep -cE '^(idle|mix|alloc)')" = "$NODES" ]
}
if ! wait_for 30 nodes_ready; then
  # A node remembered as down from an earlier life: bring it back.
  scontrol update nodename="$names" state=resume >/dev/null 2>&1 || true
  wait_for 60 nodes_ready || die slurmd "$LOG/slurmctld.log" \
    "nodes are not idle: $(sinfo -h -N -o '%N=%t' 2>/dev/null | paste -sd' ' -)"
fi
if [ "$ACCOUNTING" = 1 ]; then
  wait_for 30 sacct -n -X -S now-1hours || die slurmdbd "$LOG/slurmdbd.log" "sacct does not answer"
fi
if [ "$RESET" = 1 ]; then
  left=$(squeue -h -o %i 2>/dev/null | paste -sd' ' -)
  if [ -n "$left" ]; then
    say "--reset: cancelling jobs left in the queue: $left"
    # shellcheck disable=SC2086
    scancel $left >/dev/null 2>&1 || true
    wait_for 60 sh -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || say "warning: some jobs are still ending"
  fi
fi
say "cluster '$CLUSTER' is up: $NODES node(s) ($names), $CPUS CPUs each, partition debug" \
    "($(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}') s)"
