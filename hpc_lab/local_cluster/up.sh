#!/usr/bin/env bash
# Bring up a real Slurm cluster on this machine: munge, MariaDB, slurmdbd (accounting, so sacct works),
# slurmctld and one slurmd per compute node; Slurm 22.05 or 24.11 (--slurm).
#
#   sudo hpc_lab/local_cluster/up.sh             # one node: this host
#   sudo hpc_lab/local_cluster/up.sh --nodes 2   # two nodes, each a network namespace (node1, node2)
#   sudo hpc_lab/local_cluster/down.sh           # stop what this script started
#   sudo hpc_lab/local_cluster/down.sh --purge   # remove all it made (not the packages): the next up.sh starts from nothing
#
# Options: --nodes N (default 1), --cpus N (CPUs per node; default nproc: nodes may oversubscribe the
# real cores), --reset (cancel every job left in the queue, e.g. by an earlier life of this machine; job
# ids keep counting up, so accounting never sees an id twice), --no-accounting (no MariaDB and slurmdbd;
# sacct will not answer), --preemption (three more partitions over the same nodes, for jobs that are
# preempted the two ways clusters do it: `low` (PreemptMode=REQUEUE: Slurm requeues the job itself),
# `low-cancel` (PreemptMode=CANCEL: the job ends PREEMPTED) and `high`, whose jobs take their nodes;
# `debug`, the default, is never preempted), --gpus N[:TYPE][,N[:TYPE]...] (GPUs on each node, as
# stand-ins: Slurm schedules, accounts for and hands them out, no device exists and the trainers run on CPU;
# one N[:TYPE] for every node, or one per node, e.g. `--nodes 2 --gpus 2:a100,2:h100`), --accounts
# (accounts and limits enforced as on a university cluster: account `tinygpt`, the user's default, with QOS
# `normal`, `capped` (a job of at most 10 minutes, refused at submission above it) and `waves` (no limit until a
# test sets one on it: the queue limits' tests), account `waves` (the user's too, for the tests of association
# limits), and account `elsewhere`, which the user is not in; AccountingStorageEnforce=associations,limits,qos). Always there besides `debug`:
# `short`, the same nodes with a time limit of 30 minutes, and `last`, the last node alone. --login (with --nodes 2 or more): a login node, the
# host `login` that the user tgstudent reaches over SSH with a key made here, and the cluster's file system
# /cluster, there and on the compute nodes and not on this machine itself (login.sh says how).
#
# --slurm RELEASE: 22.05 (Debian 12's) or 24.11 (Debian 13's); default: the release of this machine's Debian
# packages. A release that is not this machine's own runs from a root filesystem of the Debian that ships it,
# made once with mmdebstrap from Debian's registry and cached in /var/cache/tinygpt-slurm/SUITE (down.sh
# --purge leaves it): its daemons, their job steps and the Slurm commands up.sh puts in /usr/local/bin (ahead
# of /usr/bin on PATH) run with that root's /usr as /usr, and with everything else of this machine's (/etc,
# /run, /tmp, /home, the project). So a job's Python must not live under /usr (a venv of pyenv's, conda's or
# uv's Python is fine; one of /usr/bin/python3 is not). One release at a time: to change it, down.sh --purge.
#
# The cluster's timers are those of a test cluster, where tests wait on every transition: see the
# "Timers" comment in the slurm.conf below (a node that stops answering is DOWN after 10 s, not 300).
#
# Everything lives under one folder, $TINYGPT_SLURM_HOME (default /var/lib/tinygpt-slurm):
#   etc/ (slurm.conf, slurmdbd.conf; /etc/slurm/*.conf link here), log/, run/ (pid files), state/, spool/
# Run it again at any time: it checks what is really running and starts only what is missing; when it
# is all up it returns at once. Order matters on a machine that never ran it: the network every config
# names (bridge, namespaces, /etc/hosts) comes first, then a check that each host and address in the
# configs is held by an interface of this machine, then the daemons. No daemon or client is ever asked
# to reach an address that is not here. Debian/Ubuntu, as root. See ../../../shared/notes/local-slurm.md
# for what was verified on these machines.
set -euo pipefail

NODES=1
CPUS=$(nproc)
RESET=0
ACCOUNTING=1
PREEMPTION=0
GPUS=""
ACCOUNTS=0
RELEASE=""
LOGIN=0
usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=${2:?--nodes needs a number}; shift 2 ;;
    --nodes=*) NODES=${1#*=}; shift ;;
    --cpus) CPUS=${2:?--cpus needs a number}; shift 2 ;;
    --cpus=*) CPUS=${1#*=}; shift ;;
    --reset) RESET=1; shift ;;
    --no-accounting) ACCOUNTING=0; shift ;;
    --preemption) PREEMPTION=1; shift ;;
    --gpus) GPUS=${2:?--gpus needs N[:TYPE]}; shift 2 ;;
    --gpus=*) GPUS=${1#*=}; shift ;;
    --accounts) ACCOUNTS=1; shift ;;
    --login) LOGIN=1; shift ;;
    --slurm) RELEASE=${2:?--slurm needs a release (22.05 or 24.11)}; shift 2 ;;
    --slurm=*) RELEASE=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "up.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
  esac
done
case "$NODES" in ''|*[!0-9]*|0) echo "up.sh: --nodes must be a whole number >= 1, got '$NODES'" >&2; exit 2 ;; esac
case "$CPUS" in ''|*[!0-9]*|0) echo "up.sh: --cpus must be a whole number >= 1, got '$CPUS'" >&2; exit 2 ;; esac
IFS=, read -r -a GPU_SPECS <<<"$GPUS"
for spec in "${GPU_SPECS[@]}"; do
  [[ "$spec" =~ ^[0-9]+(:[A-Za-z][A-Za-z0-9_-]*)?$ ]] \
    || { echo "up.sh: --gpus: '$spec' is not N[:TYPE] (e.g. 4 or 4:a100)" >&2; exit 2; }
done
case "${#GPU_SPECS[@]}" in 0|1|"$NODES") ;;
  *) echo "up.sh: --gpus: ${#GPU_SPECS[@]} node specs for $NODES node(s); give one for all, or one per node" >&2; exit 2 ;;
esac
suite_of() {  # suite_of RELEASE: the Debian release whose packages are that Slurm
  case "$1" in 22.05) echo bookworm ;; 24.11) echo trixie ;; *) return 1 ;; esac
}
[ -z "$RELEASE" ] || suite_of "$RELEASE" >/dev/null \
  || { echo "up.sh: --slurm: '$RELEASE' is not a release this script brings up; give 22.05 or 24.11" >&2; exit 2; }
[ "$ACCOUNTS" = 1 ] && [ "$ACCOUNTING" = 0 ] \
  && { echo "up.sh: --accounts needs accounting; drop --no-accounting" >&2; exit 2; }
[ "$LOGIN" = 1 ] && [ "$NODES" -lt 2 ] \
  && { echo "up.sh: --login needs --nodes 2 or more (the login node is a network namespace, as the nodes are)" >&2
       exit 2; }
[ "$(id -u)" = 0 ] || { echo "up.sh: run as root (sudo $0 $*)" >&2; exit 2; }

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
CLUSTER=${TINYGPT_SLURM_CLUSTER:-local}
DB_PASS=tinygpt-local-only
HOST=$(hostname -s)
CACHE=/var/cache/tinygpt-slurm  # root filesystems of other Slurm releases (--slurm); down.sh --purge leaves it
T0=$(date +%s.%N)

say() { printf 'up.sh: %s\n' "$*"; }
die() {  # die DAEMON LOGFILE MESSAGE
  printf 'up.sh: %s: %s\n' "$1" "$3" >&2
  if [ -n "$2" ] && [ -f "$2" ]; then printf -- '--- last lines of %s:\n' "$2" >&2; tail -n 25 "$2" >&2; fi
  exit 1
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"  # alive, wait_for, start_* (daemon.sh starts them the same way)
# What up.sh started (down.sh stops only these) and what it made (down.sh --purge removes only these).
mark_started() { grep -qxF "$1" "$RUN/started-by-up" 2>/dev/null || echo "$1" >>"$RUN/started-by-up"; }
has_line() {  # has_line TEXT LINE...: TEXT holds a line matching the extended regex LINE
  # A here-string, not a pipe: under pipefail `cmd | grep -q` fails when grep stops at its match and cmd
  # dies of SIGPIPE, so a check on something that exists would say it does not, now and then.
  grep -qE "$2" <<<"$1"
}
node_names() {
  if [ "$NODES" = 1 ]; then echo "$HOST"; else seq -f 'node%g' 1 "$NODES"; fi
}

# --- 1. packages ------------------------------------------------------------------------------------
need=(munged mungekey slurmctld slurmd sbatch)
[ "$ACCOUNTING" = 1 ] && need+=(slurmdbd mariadbd)
[ "$NODES" -gt 1 ] && need+=(ip nsenter unshare)
missing=0
for cmd in "${need[@]}"; do command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing=1; done
mkdir -p "$HOME_DIR"
if [ "$missing" = 1 ]; then
  say "installing munge, Slurm and MariaDB (Debian packages)"
  pkgs=(munge slurmctld slurmd slurm-client iproute2 util-linux)
  [ "$ACCOUNTING" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  had_key=0 had_db=0
  [ -f /etc/munge/munge.key ] && had_key=1
  [ -d /var/lib/mysql/mysql ] && had_db=1
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >"/tmp/tinygpt-slurm-apt.log" 2>&1 || die apt /tmp/tinygpt-slurm-apt.log "apt-get update failed"
  apt-get install -y -q "${pkgs[@]}" >>"/tmp/tinygpt-slurm-apt.log" 2>&1 \
    || die apt /tmp/tinygpt-slurm-apt.log "apt-get install failed"
  # The packages' own scripts create the munge key and MariaDB's data folder: made on up.sh's behalf.
  [ "$had_key" = 0 ] && [ -f /etc/munge/munge.key ] && mark_made munge-key
  [ "$had_db" = 0 ] && [ -d /var/lib/mysql/mysql ] && mark_made mariadb-data
fi
# (/usr/local/bin first: the Slurm commands of a release that is not this machine's own are there)
export PATH=/usr/local/bin:$PATH:/usr/sbin:/sbin
mkdir -p "$ETC" "$LOG" "$RUN" "$HOME_DIR/state" "$HOME_DIR/spool" /etc/slurm

# --- 1b. the Slurm release: this machine's own, or a root filesystem of the Debian that ships it ---------
own=$(dpkg-query -W -f '${Version}' slurmctld 2>/dev/null | cut -d. -f1,2)
RELEASE=${RELEASE:-$own}
was=$(cat "$ETC/release" 2>/dev/null || true)
[ -z "$was" ] && [ -f "$ETC/slurm.conf" ] && was=$own  # (a cluster of an up.sh before --slurm)
[ -z "$was" ] || [ "$was" = "$RELEASE" ] || die release "" "the local cluster here runs Slurm $was (its state,\
 accounting and logs are under $HOME_DIR); to bring up $RELEASE instead, first: $(dirname "$0")/down.sh --purge"
RELEASE_ROOT=""
if [ "$RELEASE" != "$own" ]; then
  suite=$(suite_of "$RELEASE")
  RELEASE_ROOT=$CACHE/$suite
  has_release() {  # the root's Slurm is RELEASE (its own dpkg database says so), and it has sshd (--login's)
    local version
    version=$(dpkg-query --admindir="$RELEASE_ROOT/var/lib/dpkg" -W -f '${Version}' slurmctld 2>/dev/null)
    [[ "$version" == "$RELEASE".* ]] && [ -x "$RELEASE_ROOT/usr/sbin/sshd" ]
  }
  if ! has_release; then
    say "making a Debian $suite root filesystem for Slurm $RELEASE in $RELEASE_ROOT (once: it stays cached)"
    command -v mmdebstrap >/dev/null 2>&1 || apt-get install -y -q mmdebstrap >>"/tmp/tinygpt-slurm-apt.log" 2>&1 \
      || die apt /tmp/tinygpt-slurm-apt.log "apt-get install mmdebstrap failed"
    rm -rf "$RELEASE_ROOT.new" && mkdir -p "$CACHE"
    # (with OpenSSH's server: the login node's sshd runs with the release's /usr, its libraries with it)
    mmdebstrap --variant=apt --include=slurmctld,slurmd,slurmdbd,slurm-client,openssh-server "$suite" \
      "$RELEASE_ROOT.new" >"$LOG/mmdebstrap.log" 2>&1 \
      || die mmdebstrap "$LOG/mmdebstrap.log" "could not make the $suite root"
    rm -rf "$RELEASE_ROOT" && mv "$RELEASE_ROOT.new" "$RELEASE_ROOT"
    has_release || die mmdebstrap "" "the $suite root's Slurm is not $RELEASE, or it has no sshd"
  fi
fi
echo "$RELEASE" >"$ETC/release"
echo "$RELEASE_ROOT" >"$ETC/release-root"

# --- 2. network: bridge, one namespace per node, /etc/hosts (multi-node only) -----------------------
# Before any configuration names these addresses and before any daemon or client is asked to reach them.
has_addr() {  # has_addr DEVICE ADDRESS [NAMESPACE]: the device holds ADDRESS/24
  local addrs in_ns=()
  [ -n "${3:-}" ] && in_ns=(nsenter --net="/run/netns/$3")
  addrs=$("${in_ns[@]}" ip -o -4 addr show dev "$1" 2>/dev/null) || return 1
  has_line "$addrs" "inet ${2//./\\.}/24 "
}
node_addr() { echo "$SUBNET.$((10 + $1))"; }
if [ "$NODES" -gt 1 ]; then
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || die network "" "cannot create bridge $BRIDGE"
  fi
  has_addr "$BRIDGE" "$SUBNET.1" || ip addr add "$SUBNET.1/24" dev "$BRIDGE" \
    || die network "" "cannot give $SUBNET.1/24 to bridge $BRIDGE"
  ip link set "$BRIDGE" up
  namespace() {  # namespace NS HOST_END NS_END ADDRESS NAME: a namespace on the bridge, ADDRESS/24 and NAME in it
    local ns=$1 host_end=$2 node_end=$3 addr=$4 name=$5 line
    [ -e "/run/netns/$ns" ] || ip netns add "$ns" || die network "" "cannot create network namespace $ns"
    if ! nsenter --net="/run/netns/$ns" ip link show "$node_end" >/dev/null 2>&1; then
      # Half-made pairs from an interrupted run: remove either end left in this namespace.
      ip link del "$host_end" >/dev/null 2>&1 || true
      ip link del "$node_end" >/dev/null 2>&1 || true
      ip link add "$host_end" type veth peer name "$node_end" || die network "" "cannot create veth $host_end"
      ip link set "$node_end" netns "$ns"
    fi
    ip link set "$host_end" master "$BRIDGE"
    ip link set "$host_end" up
    has_addr "$node_end" "$addr" "$ns" || nsenter --net="/run/netns/$ns" ip addr add "$addr/24" dev "$node_end" \
      || die network "" "cannot give $addr/24 to $node_end in $ns"
    nsenter --net="/run/netns/$ns" ip link set "$node_end" up
    nsenter --net="/run/netns/$ns" ip link set lo up
    # Every name must resolve to its bridge address in every namespace (/etc/hosts is shared).
    line="$addr $name $HOSTS_MARK"
    if ! grep -qxF "$line" /etc/hosts; then
      sed -i "/[[:space:]]$name\([[:space:]].*\)\{0,1\}\$/d" /etc/hosts
      echo "$line" >>/etc/hosts
    fi
  }
  for n in $(seq 1 "$NODES"); do
    namespace "tgnode$n" "tgn${n}h" "tgn${n}p" "$(node_addr "$n")" "node$n"
  done
  if [ "$LOGIN" = 1 ]; then namespace "$LOGIN_NS" tgloginh tgloginp "$LOGIN_ADDR" "$LOGIN_NAME"; fi
fi

# --- 3. configuration ---------------------------------------------------------------------------------
options="--nodes $NODES --cpus $CPUS"
[ "$ACCOUNTING" = 1 ] || options+=" --no-accounting"
[ "$PREEMPTION" = 1 ] && options+=" --preemption"
[ -n "$GPUS" ] && options+=" --gpus $GPUS"
[ "$ACCOUNTS" = 1 ] && options+=" --accounts"
[ "$LOGIN" = 1 ] && options+=" --login"
node_gpus() {  # node_gpus N: node N's --gpus spec (COUNT or COUNT:TYPE), empty for none
  [ "${#GPU_SPECS[@]}" = 0 ] || echo "${GPU_SPECS[$(( ${#GPU_SPECS[@]} == 1 ? 0 : $1 - 1 ))]}"
}
free_mb=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
node_mem=$(( free_mb * 6 / 10 / NODES ))
[ "$node_mem" -ge 256 ] || die memory "" "only ${free_mb} MB of memory; Slurm nodes need at least 256 MB each"

if [ "$NODES" = 1 ]; then
  ctld_host="$HOST" dbd_addr=localhost
  slurmd_pid="$RUN/slurmd.pid"
else
  ctld_host="$HOST($SUBNET.1)" dbd_addr="$SUBNET.1"  # reachable from the nodes too (sacct in a job)
  slurmd_pid="/run/tinygpt-slurmd/slurmd.pid"  # each node's mount namespace sees its own folder here
fi
# GPUs that Slurm schedules, accounts for and hands out (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES), and that
# are not there: each is a character device under $HOME_DIR/dev with /dev/null's numbers (1, 3), which slurmd
# only stats. Slurm 22.05 drops a gpu GRES that has no File (a Count alone gives the nodes no GPU), and gives
# no CUDA_VISIBLE_DEVICES for a File that is not a device. No CUDA exists: the trainers run on CPU.
stand_in_gpu() {  # stand_in_gpu PATH
  mknod -m 666 "$1" c 1 3 2>/dev/null && return 0
  : >"$1"
  say "warning: cannot make device $1 (mknod); jobs get SLURM_GPUS_ON_NODE but no CUDA_VISIBLE_DEVICES"
}
node_lines="" gres_lines=""
for n in $(seq 1 "$NODES"); do
  if [ "$NODES" = 1 ]; then name=$HOST addr=""; else name=node$n addr=" NodeAddr=$(node_addr "$n")"; fi
  spec=$(node_gpus "$n")
  count=${spec%%:*} type=""
  [ "$spec" = "$count" ] || type=${spec#*:}
  gres=""
  [ "${count:-0}" -gt 0 ] && gres="gpu${type:+:$type}:$count"  # (slurm.conf's Gres: gpu:a100:2, gpu:2)
  node_lines+="NodeName=$name$addr CPUs=$CPUS RealMemory=$node_mem${gres:+ Gres=$gres} State=UNKNOWN"$'\n'
  if [ -n "$gres" ]; then
    mkdir -p "$HOME_DIR/dev/$name"
    for i in $(seq 0 $(( count - 1 ))); do
      [ -e "$HOME_DIR/dev/$name/gpu$i" ] || stand_in_gpu "$HOME_DIR/dev/$name/gpu$i"
    done
    files=$HOME_DIR/dev/$name/gpu$( [ "$count" = 1 ] && echo 0 || echo "[0-$(( count - 1 ))]")
    gres_lines+="NodeName=$name Name=gpu${type:+ Type=$type} File=$files"$'\n'
  fi
done
if [ "$ACCOUNTING" = 1 ]; then
  # OverMemoryKill: with no cgroups, slurmstepd enforces a job's --mem by polling (every JobAcctGatherFrequency,
  # 30 s, or the job's --acctg-freq) and kills the step that is over it: the job ends FAILED (or OUT_OF_MEMORY).
  accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$dbd_addr
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherParams=OverMemoryKill"
  # GPUs are accounted for (sacct's AllocTRES: gres/gpu=N) once they are named here.
  [ -n "$gres_lines" ] && accounting+=$'\n'"AccountingStorageTRES=gres/gpu"
  # With --accounts a job needs an association (user, account) and keeps to its QOS's limits.
  [ "$ACCOUNTS" = 1 ] && accounting+=$'\n'"AccountingStorageEnforce=associations,limits,qos"
else
  accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

partition_lines="PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
if [ "$PREEMPTION" = 1 ]; then
  # partition_prio: a pending job of a higher PriorityTier takes the nodes of running jobs of a lower one,
  # each preempted the way its own partition's PreemptMode says. No GraceTime: the job's processes get
  # SIGTERM at once and SIGKILL KillWait (15 s) later, the time a trainer has to save.
  partition_lines="PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$partition_lines PriorityTier=1 PreemptMode=OFF
PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE
PartitionName=low-cancel Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF"
fi
# `short`: the same nodes with a time limit, as clusters have (`launch.py check` refuses a job over it); never
# preempted.
short="PartitionName=short Nodes=ALL MaxTime=00:30:00 State=UP"
# `last`: the last node alone, which one job can fill while the other partitions still have room (the choice of
# `placement: soonest` is tested on it).
last="PartitionName=last Nodes=$(node_names | tail -n 1) MaxTime=INFINITE State=UP"
if [ "$PREEMPTION" = 1 ]; then
  short="$short PriorityTier=1 PreemptMode=OFF"
  last="$last PriorityTier=1 PreemptMode=OFF"
fi
partition_lines="$partition_lines
$short
$last"

# Slurm's mail program: records what slurmctld gives it (its words, the job's variables) in a file of its own.
mkdir -p "$HOME_DIR/mail"
cat >"$HOME_DIR/mail-record.sh" <<EOF
#!/bin/sh
# Written by up.sh: the local cluster's MailProg. Keeps each mail in $HOME_DIR/mail/; sends nothing.
file=$HOME_DIR/mail/\$(date +%s%N)-\$\$.txt
{ echo "argv: \$*"; env | grep '^SLURM_' | sort; } >"\$file.part" && mv "\$file.part" "\$file"
EOF
chmod 755 "$HOME_DIR/mail-record.sh"

new_conf=$(mktemp)
cat >"$new_conf" <<EOF
# Written by hpc_lab/local_cluster/up.sh $options; rerun it rather than editing this file.
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
# Timers for a cluster of a few nodes where tests wait on every transition: schedule at once on each event
# (defaults: batch jobs may wait 3 s, the main loop every 60 s, backfill every 30 s), hold a requeued job
# for 6 s instead of 121 (a requeued job may start again cred_expire + 1 s after it left its nodes), and
# call a node that stops answering DOWN after 10 s instead of 300 (slurmctld pings every third of it), so
# that a lost node ends its jobs NODE_FAIL in seconds.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
AuthInfo=cred_expire=5
SlurmdTimeout=10
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$(( node_mem / CPUS ))
KillWait=15
MinJobAge=600
# Every array task counts against MaxJobCount (default 10,000), and so does each ended one for MinJobAge after
# its end: a 10,000-run sweep held whole (bench/launcher.py), cancelled, and held again within MinJobAge fits.
MaxJobCount=100000
JobCompType=jobcomp/none
# No mail is sent: mail-record.sh keeps each in $HOME_DIR/mail/, for tests to read (24.11 checks at its start that
# MailProg exists).
MailProg=$HOME_DIR/mail-record.sh
${gres_lines:+GresTypes=gpu
}$accounting
$node_lines
$partition_lines
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
if [ -n "$gres_lines" ]; then
  printf '# Written by hpc_lab/local_cluster/up.sh %s: GPUs that are stand-ins (no device)\n%s' \
    "$options" "$gres_lines" >"$ETC/gres.conf.new"
  cmp -s "$ETC/gres.conf.new" "$ETC/gres.conf" || conf_changed=1
  mv "$ETC/gres.conf.new" "$ETC/gres.conf"
  ln -sfn "$ETC/gres.conf" /etc/slurm/gres.conf
else
  [ -e "$ETC/gres.conf" ] && conf_changed=1
  rm -f "$ETC/gres.conf" /etc/slurm/gres.conf
fi

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
else
  rm -f "$ETC/slurmdbd.conf" /etc/slurm/slurmdbd.conf
fi

# --- 4. every host and address the configs name is held by an interface of this machine ----------------
# A name or address that is not here would send a daemon or client out through the default route.
local_addrs=$(ip -o -4 addr show | awk '{print $4}')
for n in $(seq 1 "$NODES"); do
  [ -e "/run/netns/tgnode$n" ] && local_addrs+=$'\n'$(nsenter --net="/run/netns/tgnode$n" ip -o -4 addr show | awk '{print $4}')
done
is_local() {  # is_local ADDRESS: loopback, or held by an interface here or in a node's namespace
  case "$1" in 127.*) return 0 ;; esac
  has_line "$local_addrs" "^${1//./\\.}/"
}
named_hosts() {  # the hosts and addresses slurm.conf and slurmdbd.conf name, one per line
  sed -nE 's/^(SlurmctldHost|AccountingStorageHost|DbdHost|StorageHost)=([^(]*)(\((.*)\))?$/\2\n\4/p' \
    "$ETC/slurm.conf" "$ETC/slurmdbd.conf" 2>/dev/null
  awk '/^NodeName=/ { for (i = 1; i <= NF; i++) if (sub(/^(NodeName|NodeAddr)=/, "", $i)) print $i }' "$ETC/slurm.conf"
}
for host in $(named_hosts | sort -u); do
  addrs=$(getent ahostsv4 "$host" | awk '{print $1}' | sort -u) \
    || die network "" "'$host' (named in $ETC/slurm.conf or slurmdbd.conf) does not resolve; check /etc/hosts"
  for addr in $addrs; do
    is_local "$addr" || die network "" "'$host' is $addr, which no interface of this machine holds;\
 refusing to start daemons that would reach it (check /etc/hosts and 'ip addr')"
  done
done

# --- 4b. the release's Slurm commands, ahead of this machine's on PATH (/usr/local/bin) -----------------
# Only now that every check has passed: an up.sh that stops before would leave the commands as they were. Ours
# are removed where the release is this machine's own.
for cmd in $SLURM_COMMANDS; do
  wrapper=/usr/local/bin/$cmd
  ours=0
  [ -f "$wrapper" ] && grep -qF "$WRAPPER_MARK" "$wrapper" && ours=1
  if [ -n "$RELEASE_ROOT" ] && [ -x "$RELEASE_ROOT/usr/bin/$cmd" ]; then
    [ -e "$wrapper" ] && [ "$ours" = 0 ] && die release "" "$wrapper is not up.sh's; move it away to use Slurm $RELEASE"
    {
      echo '#!/bin/sh'
      echo "$WRAPPER_MARK (up.sh --slurm $RELEASE): Slurm $RELEASE's $cmd, as lib.sh's in_release runs it"
      echo "# (where /usr is the release's already, as on the login node, whose users may not unshare: itself)"
      echo "grep -q '^$OVERLAY_SOURCE /usr overlay ' /proc/self/mounts && exec /usr/bin/$cmd \"\$@\""
      printf 'exec unshare --mount --propagation private -- sh -c %s sh /usr/bin/%s "$@"\n' \
        "'$(overlay_usr) && exec \"\$@\"'" "$cmd"
    } >"$wrapper"
    chmod 755 "$wrapper"
  elif [ "$ours" = 1 ]; then
    rm -f "$wrapper"
  fi
done

# --- 5. munge -------------------------------------------------------------------------------------------
if ! (munge -n | unmunge) >/dev/null 2>&1; then
  say "starting munged"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if [ ! -f /etc/munge/munge.key ]; then
    runuser -u munge -- /usr/sbin/mungekey --create >/dev/null 2>&1 || die munged "" "cannot create /etc/munge/munge.key"
    mark_made munge-key
  fi
  runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 || die munged /var/log/munge/munged.log "did not start"
  wait_for 10 sh -c 'munge -n | unmunge' || die munged /var/log/munge/munged.log "does not answer"
  mark_started munged
fi

# --- 6. accounting: MariaDB and slurmdbd ------------------------------------------------------------------
if [ "$ACCOUNTING" = 1 ]; then
  if ! mysqladmin ping >/dev/null 2>&1; then
    say "starting MariaDB"
    if [ ! -d /var/lib/mysql/mysql ]; then
      mariadb-install-db --user=mysql >"$LOG/mariadb-install.log" 2>&1 \
        || die mariadb "$LOG/mariadb-install.log" "could not create its data folder"
      mark_made mariadb-data
    fi
    start_mariadb
    wait_for 60 mysqladmin ping || die mariadb "$LOG/mariadb/mariadb.log" "does not answer mysqladmin ping"
    mark_started mariadb
  fi
  mysql -u root <<EOF || die mariadb "$LOG/mariadb/mariadb.log" "could not create the accounting database"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
EOF
  mark_made accounting-db
  if ! alive "$RUN/slurmdbd.pid" slurmdbd; then
    say "starting slurmdbd"
    start_slurmdbd || die slurmdbd "$LOG/slurmdbd.log" "did not start"
  fi
  wait_for 60 sacctmgr -n show cluster || die slurmdbd "$LOG/slurmdbd.log" "does not answer sacctmgr"
  if [ -z "$(sacctmgr -n -P show cluster "$CLUSTER" format=cluster 2>/dev/null)" ]; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null || die slurmdbd "$LOG/slurmdbd.log" "could not register cluster $CLUSTER"
  fi
fi

# --- 6a. the login node's user and the cluster's file system (--login) ----------------------------------------
# Before the accounts (slurmctld resolves an association's user once, when it loads it) and the nodes (node.sh
# mounts the file system on each, login.sh on the login node).
if [ "$LOGIN" = 1 ]; then
  for entry in $LOGIN_USERS; do
    user=${entry%%:*} shell=${entry#*:}
    if ! id -u "$user" >/dev/null 2>&1; then
      useradd --no-create-home --home-dir "$CLUSTER_MOUNT/home/$user" --shell "$shell" --user-group "$user" \
        || die login "" "could not add the user $user"
      mark_made "login-user $user"
      usermod -p '*' "$user"  # no password to log in with, and not locked (sshd refuses a locked account's key)
    fi
    mkdir -p "$CLUSTER_FS/home/$user"
    chown "$user:$user" "$CLUSTER_FS/home/$user"
  done
  if [ ! -d "$CLUSTER_MOUNT" ]; then
    mkdir "$CLUSTER_MOUNT"  # (the mount point; on this machine it stays empty)
    mark_made cluster-mount
  fi
fi

# --- 6b. accounts (--accounts): what the user may charge and how much, enforced ----------------------------
ACCOUNT_USERS=root
[ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && ACCOUNT_USERS+=" $SUDO_USER"
[ "$LOGIN" = 1 ] && for entry in $LOGIN_USERS; do ACCOUNT_USERS+=" ${entry%%:*}"; done
has_assoc() {  # has_assoc USER ACCOUNT: accounting holds the association
  [ -n "$(sacctmgr -n -P show assoc cluster="$CLUSTER" user="$1" account="$2" format=account 2>/dev/null)" ]
}
if [ "$ACCOUNTS" = 1 ]; then
  dbd() { sacctmgr -i "$@" >>"$LOG/sacctmgr.out" 2>&1 || die slurmdbd "$LOG/sacctmgr.out" "sacctmgr $* failed"; }
  # Refused at submission (DenyOnLimit), not left pending, when a job asks for more than 10 minutes.
  [ -n "$(sacctmgr -n -P show qos capped format=name 2>/dev/null)" ] \
    || dbd add qos capped MaxWall=00:10:00 Flags=DenyOnLimit Description="at most 10 minutes a job"
  [ -n "$(sacctmgr -n -P show qos waves format=name 2>/dev/null)" ] \
    || dbd add qos waves Description="the queue limits' tests set theirs here"
  for account in tinygpt waves elsewhere; do
    [ -n "$(sacctmgr -n -P show account "$account" format=account 2>/dev/null)" ] \
      || dbd add account "$account" Cluster="$CLUSTER" Description="$account" Organization=tinygpt-local
  done
  for user in $ACCOUNT_USERS; do
    has_assoc "$user" tinygpt || dbd add user "$user" Account=tinygpt Cluster="$CLUSTER"
    has_assoc "$user" waves || dbd add user "$user" Account=waves Cluster="$CLUSTER"
    dbd modify user "$user" where cluster="$CLUSTER" account=tinygpt set QOS=normal,capped,waves DefaultQOS=normal
    dbd modify user "$user" where cluster="$CLUSTER" account=waves set QOS=normal,waves DefaultQOS=normal
    dbd modify user "$user" set DefaultAccount=tinygpt
  done
fi

# --- 7. slurmctld ------------------------------------------------------------------------------------------
if [ "$conf_changed" = 1 ] && alive "$RUN/slurmctld.pid" slurmctld; then
  say "configuration changed: restarting slurmctld and slurmd"
  "$(dirname "$0")/down.sh" --slurm-only >/dev/null 2>&1 || true
fi
if ! alive "$RUN/slurmctld.pid" slurmctld; then
  say "starting slurmctld"
  start_slurmctld || die slurmctld "$LOG/slurmctld.log" "did not start"
fi
wait_for 60 scontrol ping || die slurmctld "$LOG/slurmctld.log" "does not answer scontrol ping"

# --- 8. slurmd, one per node -----------------------------------------------------------------------------
if [ "$NODES" = 1 ]; then
  if ! alive "$RUN/slurmd.pid" slurmd; then
    say "starting slurmd ($HOST)"
    in_release /usr/sbin/slurmd >>"$LOG/slurmd.out" 2>&1 || die slurmd "$LOG/slurmd.$HOST.log" "did not start"
  fi
else
  for n in $(seq 1 "$NODES"); do
    if ! alive "$RUN/node$n/slurmd.pid" slurmd; then
      say "starting slurmd (node$n, $(node_addr "$n"))"
      "$(dirname "$0")/node.sh" boot "node$n" || exit 1
    fi
  done
fi

# --- 8b. the login node (--login): sshd in its namespace, the user tgstudent, the cluster's file system -------
# (after the nodes, which mount that file system when login.sh has made it: node.sh)
if [ "$LOGIN" = 1 ]; then
  "$(dirname "$0")/login.sh" boot || exit 1
fi

# --- 9. wait until every node is idle and accounting answers ------------------------------------------------
names=$(node_names | paste -sd, -)
nodes_ready() {
  local states
  # (one line per node and partition: a node in several partitions counts once)
  states=$(sinfo -h -N -n "$names" -o '%N %t' 2>/dev/null) || return 1
  [ "$(sort -u <<<"$states" | grep -cE ' (idle|mix|alloc)')" = "$NODES" ]
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
ctld_knows() {  # ctld_knows USER: slurmctld holds the user's association with account tinygpt
  has_line "$(scontrol show assoc_mgr users="$1" accounts=tinygpt flags=assoc 2>/dev/null)" "Account=tinygpt "
}
if [ "$ACCOUNTS" = 1 ]; then
  for user in $ACCOUNT_USERS; do
    wait_for 30 ctld_knows "$user" || die slurmctld "$LOG/slurmctld.log" "does not know $user's account tinygpt"
  done
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
partitions=$(sinfo -h -o '%P' 2>/dev/null | paste -sd, -)
extras=${GPUS:+, GPUs $GPUS}
[ "$ACCOUNTS" = 1 ] && extras+=", accounts tinygpt (yours, QOS normal, capped and waves), waves (yours) and elsewhere"
[ "$LOGIN" = 1 ] && extras+=", login node $LOGIN_NAME ($LOGIN_ADDR: ssh -i $HOME_DIR/login/id_ed25519 -o UserKnownHostsFile=$HOME_DIR/login/known_hosts $LOGIN_USER@$LOGIN_NAME)"
# A shell that ran a Slurm command before remembers where it found it (bash's hash), not PATH's order.
[ -n "$RELEASE_ROOT" ] && say "Slurm $RELEASE's commands are in /usr/local/bin; in a shell that ran one of"\
  "this machine's before, run 'hash -r' first"
say "cluster '$CLUSTER' is up: $NODES node(s) ($names), $CPUS CPUs each$extras, partitions ${partitions:-debug}" \
    "($(awk -v t0="$T0" -v t1="$(date +%s.%N)" 'BEGIN {printf "%.1f", t1 - t0}') s)"
