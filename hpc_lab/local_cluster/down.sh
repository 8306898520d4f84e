#!/usr/bin/env bash
# Stop the daemons that hpc_lab/local_cluster/up.sh started, by their pid files, and nothing else:
# slurmd (every node), slurmctld, slurmdbd, the login node's sshd, and munged / MariaDB only if up.sh was the
# one to start them.
# Configuration, state, logs and the nodes' network namespaces stay, so up.sh brings it all back.
#
#   sudo hpc_lab/local_cluster/down.sh               # everything up.sh started
#   sudo hpc_lab/local_cluster/down.sh --slurm-only  # slurmctld and slurmd only
#   sudo hpc_lab/local_cluster/down.sh --purge       # stop it all and remove everything up.sh made but
#       the packages: bridge, veths, namespaces, our /etc/hosts lines, $TINYGPT_SLURM_HOME (the cluster's
#       file system and the login node's keys with it), the login node's user and /cluster, the
#       /etc/slurm links, the Slurm commands of up.sh --slurm in /usr/local/bin, the accounting database
#       and its user, and MariaDB's data folder and the munge key where up.sh (or the packages it
#       installed) made them. The next up.sh starts from nothing. The root filesystems of up.sh --slurm
#       stay cached in /var/cache/tinygpt-slurm (rm -rf it to download them again).
set -uo pipefail

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"  # stop_daemon, SLURM_COMMANDS, WRAPPER_MARK
MODE=stop
case "${1:-}" in
  --slurm-only) MODE=slurm-only ;;
  --purge) MODE=purge ;;
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "down.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "down.sh: run as root" >&2; exit 2; }
export PATH=$PATH:/usr/sbin:/sbin

made() { grep -qxF "$1" "$HOME_DIR/made-by-up" 2>/dev/null; }

for pidfile in "$RUN"/slurmd.pid "$RUN"/node*/slurmd.pid; do stop_daemon "$pidfile" slurmd; done
stop_daemon "$RUN/slurmctld.pid" slurmctld
[ "$MODE" = slurm-only ] && exit 0
stop_daemon "$RUN/login/sshd.pid" sshd  # (the login node's, up.sh --login)
stop_daemon "$RUN/slurmdbd.pid" slurmdbd

if [ "$MODE" = purge ]; then
  # Daemons whose pid files an earlier, killed life of this machine lost: ours are the only Slurm here.
  for name in slurmd slurmctld slurmdbd; do
    pkill -x "$name" 2>/dev/null && echo "down.sh: stopped a $name that no pid file named"
  done
  if mysqladmin ping >/dev/null 2>&1; then
    mysql -u root -e "DROP DATABASE IF EXISTS slurm_acct_db; DROP USER IF EXISTS 'slurm'@'localhost';" \
      || echo "down.sh: warning: could not drop the accounting database" >&2
  elif made accounting-db && ! made mariadb-data; then
    echo "down.sh: warning: MariaDB is not running, so the accounting database slurm_acct_db stays" >&2
  fi
fi

if grep -qxF mariadb "$RUN/started-by-up" 2>/dev/null || { [ "$MODE" = purge ] && made mariadb-data; }; then
  stop_daemon /run/mysqld/mysqld.pid mariadbd
  # mysqld_safe would restart it; it ends by itself once mariadbd stops cleanly.
fi
if grep -qxF munged "$RUN/started-by-up" 2>/dev/null || { [ "$MODE" = purge ] && made munge-key; }; then
  stop_daemon /run/munge/munged.pid munged
fi
rm -f "$RUN/started-by-up"

if [ "$MODE" = purge ]; then
  for ns in /run/netns/tgnode* "/run/netns/$LOGIN_NS"; do  # with what is left in them (a login's sessions)
    [ -e "$ns" ] || continue
    kill_namespace "$(basename "$ns")" || true
    ip netns del "$(basename "$ns")"
  done
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' \
                | grep -E '^(tgn[0-9]+|tglogin)[hp]$'); do
    ip link del "$link" 2>/dev/null
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  # Our lines, and the unmarked ones earlier versions of up.sh wrote.
  sed -i -e "/$HOSTS_MARK\$/d" -e "/^${SUBNET//./\\.}\.[0-9]* node[0-9]*\$/d" /etc/hosts
  rm -rf /run/tinygpt-slurmd
  made mariadb-data && rm -rf /var/lib/mysql && echo "down.sh: removed MariaDB's data folder"
  made munge-key && rm -f /etc/munge/munge.key && echo "down.sh: removed the munge key"
  made login-user && userdel "$LOGIN_USER" 2>/dev/null && echo "down.sh: removed the login node's user $LOGIN_USER"
  for entry in $LOGIN_USERS; do  # (`login-user`, alone: tgstudent, as an earlier up.sh marked it)
    made "login-user ${entry%%:*}" && userdel "${entry%%:*}" 2>/dev/null \
      && echo "down.sh: removed the login node's user ${entry%%:*}"
  done
  made cluster-mount && rmdir "$CLUSTER_MOUNT" 2>/dev/null
  for cmd in $SLURM_COMMANDS; do  # up.sh --slurm's commands of another release (its root stays cached)
    grep -qF "$WRAPPER_MARK" "/usr/local/bin/$cmd" 2>/dev/null && rm -f "/usr/local/bin/$cmd"
  done
  for link in /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf /etc/slurm/gres.conf; do
    [ -L "$link" ] && rm -f "$link"
  done
  rm -rf "$HOME_DIR"
  echo "down.sh: purged (packages stay installed)"
  exit 0
fi
echo "down.sh: done"
