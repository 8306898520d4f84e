# Sourced by up.sh, down.sh, daemon.sh, node.sh and login.sh: where the local cluster lives, how its daemons are
# found, stopped and started, and in which Slurm release they run. Needs HOME_DIR (the cluster's folder).
ETC=$HOME_DIR/etc
RUN=$HOME_DIR/run
LOG=$HOME_DIR/log
SUBNET=10.77.0  # the bridge's (.1), the login node's (.2) and the compute nodes' (.11, .12, ...)
BRIDGE=tgslurm0
HOSTS_MARK='# tinygpt-slurm'  # marks our /etc/hosts lines, for down.sh --purge
# The login node (up.sh --login, login.sh): its network namespace, name, address and user.
LOGIN_NS=tglogin
LOGIN_NAME=login
LOGIN_ADDR=$SUBNET.2
LOGIN_USER=tgstudent
# Its other users, USER:SHELL, each logging in with LOGIN_USER's key: a second student (what one user can see of
# another's work), and one for each login shell a site may give (the laptop's commands under each).
LOGIN_OTHERS="tgpeer:/bin/bash tgsh:/bin/sh tgbash:/bin/bash tgzsh:/usr/bin/zsh tgfish:/usr/bin/fish
 tgtcsh:/usr/bin/tcsh tgcsh:/usr/bin/bsd-csh"
LOGIN_USERS="$LOGIN_USER:/bin/bash $LOGIN_OTHERS"
LOGIN_SHELL_PACKAGES="zsh fish tcsh csh"  # (Debian's; csh is BSD's csh, /usr/bin/bsd-csh)
# The cluster's shared file system: this folder, mounted at CLUSTER_MOUNT on the login and compute nodes only.
CLUSTER_FS=$HOME_DIR/cluster
CLUSTER_MOUNT=/cluster
# The root filesystem whose /usr holds the cluster's Slurm, where it is not this machine's own (up.sh --slurm):
# written by up.sh, empty or absent for the machine's own Slurm.
RELEASE_ROOT=$(cat "$HOME_DIR/etc/release-root" 2>/dev/null || true)

# The Slurm commands up.sh puts in /usr/local/bin for a release that is not this machine's own, and the mark
# that tells its wrappers from anybody else's files.
SLURM_COMMANDS="sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sh5util sinfo sprio
 squeue sreport srun sshare sstat strigger sview"
WRAPPER_MARK='# tinygpt-slurm: a Slurm command of the local cluster'

OVERLAY_SOURCE=tinygpt-slurm  # the name of that mount (the Slurm commands' wrappers look for it)
overlay_usr() {  # the mount that gives a mount namespace the release's /usr (RELEASE_ROOT has no spaces)
  # An overlay, the root's /usr over this machine's: Slurm and the libraries it was built against come from the
  # root, and what the root lacks (the libraries the project's own Python links to, say) from this machine.
  echo "mount -t overlay $OVERLAY_SOURCE -o lowerdir=$RELEASE_ROOT/usr:/usr /usr"
}

in_release() {  # in_release COMMAND...: run COMMAND with the cluster's Slurm release as /usr
  # In a private mount namespace, so nothing else on this machine sees it; the processes the command starts
  # (slurmd's job steps and the jobs' own commands) stay in that namespace. /etc, /run, /tmp, /home, the
  # project and its Python stay this machine's.
  if [ -z "$RELEASE_ROOT" ]; then "$@"; return; fi
  unshare --mount --propagation private -- sh -c "$(overlay_usr)"' && exec "$@"' sh "$@"
}

mark_made() {  # mark_made WHAT: up.sh (or a script it runs) made WHAT, which down.sh --purge removes
  grep -qxF "$1" "$HOME_DIR/made-by-up" 2>/dev/null || echo "$1" >>"$HOME_DIR/made-by-up"
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

stop_daemon() {  # stop_daemon PIDFILE NAME: TERM the process the pid file names, if it is NAME; KILL after 20 s
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1" 2>/dev/null)
  if [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ]; then
    echo "$(basename "$0"): stopping $2 (pid $pid)"
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 40); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
    [ -d "/proc/$pid" ] && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$1"
}

# Each start_* starts its daemon in the background and returns; the caller waits until it answers.
start_mariadb() {
  mkdir -p /run/mysqld "$LOG/mariadb" && chown mysql:mysql /run/mysqld "$LOG/mariadb"
  setsid mysqld_safe --user=mysql --log-error="$LOG/mariadb/mariadb.log" >/dev/null 2>&1 </dev/null &
}
start_slurmdbd() { in_release /usr/sbin/slurmdbd >>"$LOG/slurmdbd.out" 2>&1; }
start_slurmctld() { in_release /usr/sbin/slurmctld >>"$LOG/slurmctld.out" 2>&1; }

# Kill every process in the network namespace /run/netns/$1, round after round until none is left (a slurmstepd
# or a login shell may fork between a listing and its kill); fails, naming them, if some outlive 20 rounds.
kill_namespace() {
  local want p pids
  want="net:[$(stat -L -c %i "/run/netns/$1")]"
  for _ in $(seq 1 20); do
    pids=()
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$want" ] && pids+=("${p#/proc/}")
    done
    [ "${#pids[@]}" = 0 ] && return 0
    kill -9 "${pids[@]}" 2>/dev/null || true
    sleep 0.2
  done
  echo "processes of $1 still alive after 20 rounds of SIGKILL: ${pids[*]}" >&2
  return 1
}
