#!/usr/bin/env bash
# The login node of the local cluster (up.sh --login), as a university's is: a host of its own that users reach
# over SSH to run Slurm's commands, on the cluster's shared file system, which their laptop does not have.
#
#   sudo hpc_lab/local_cluster/login.sh boot   # make what is missing and start its sshd (up.sh --login does)
#   sudo hpc_lab/local_cluster/login.sh stop   # stop its sshd (down.sh does)
#   sudo hpc_lab/local_cluster/login.sh python VENV   # the jobs' Python on the cluster: VENV at /cluster/sw/python
#
# The host `login` (10.77.0.2) is a network namespace with its own hostname, running OpenSSH's sshd from Debian's
# openssh-server, which is installed and never started on this machine itself (nothing listens here). Its first
# user is tgstudent, an ordinary one (the account `tinygpt` with up.sh --accounts), who logs in with the key
# made here and nothing else (no password; root may not log in). Its other users (lib.sh's LOGIN_OTHERS: a second
# student, and one for each login shell a site may give) log in with the same key:
#
#   ssh -i /var/lib/tinygpt-slurm/login/id_ed25519 -o UserKnownHostsFile=/var/lib/tinygpt-slurm/login/known_hosts \
#       tgstudent@login
#
# The cluster's file system, /cluster (tgstudent's home is /cluster/home/tgstudent), is a folder of
# $TINYGPT_SLURM_HOME mounted at /cluster on the login node and on every compute node (node.sh), each in its
# own mount namespace: on this machine, the laptop, /cluster is an empty folder, so that a path of the laptop's
# is never a file of the cluster's by accident.
set -euo pipefail

HOME_DIR=${TINYGPT_SLURM_HOME:-/var/lib/tinygpt-slurm}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"  # RUN, LOG, ETC, RELEASE_ROOT, LOGIN_*, CLUSTER_FS, alive, wait_for, ...
usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
[ $# = 1 ] || { [ "${1:-}" = python ] && [ $# = 2 ]; } || { usage >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "login.sh: run as root" >&2; exit 2; }
KEYS=$HOME_DIR/login
PIDFILE=$RUN/login/sshd.pid

case "$1" in
  stop) stop_daemon "$PIDFILE" sshd; exit 0 ;;
  python)
    # As a site's Python module is: installed once where every node and the login node see it, readable by
    # all: VENV's packages as hard links (no second gigabyte), without its editable install of the checkout (the
    # jobs import the code the launcher sent them), on an interpreter the cluster's users can run: Debian's
    # python3 when it is VENV's version, else VENV's own (often in root's home, which they cannot read), copied
    # too, its libpython found through LD_LIBRARY_PATH (bin/python sets it).
    [ -x "$2/bin/python" ] || { echo "login.sh: $2 is not a venv (no bin/python)" >&2; exit 2; }
    [ -d "$CLUSTER_FS" ] || { echo "login.sh: no $CLUSTER_FS: bring the cluster up with up.sh --login" >&2; exit 2; }
    minor='import sys; print("%d.%d" % sys.version_info[:2])'
    version=$("$2/bin/python" -c "$minor")
    sw=$CLUSTER_FS/sw && dest=$sw/python && mkdir -p "$sw" && rm -rf "$dest.new" "$sw/base.new"
    link() { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }
    if [ "$(/usr/bin/python3 -c "$minor" 2>/dev/null)" = "$version" ]; then
      /usr/bin/python3 -m venv --without-pip "$dest.new"
    else
      link "$("$2/bin/python" -c 'import sys; print(sys.base_prefix)')" "$sw/base.new"
      rm -rf "$sw/base" && mv "$sw/base.new" "$sw/base" && chmod -R a+rX "$sw/base"
      LD_LIBRARY_PATH=$sw/base/lib "$sw/base/bin/python$version" -m venv --without-pip "$dest.new"
      rm "$dest.new/bin/python"
      printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$(dirname "$0")/python%s" "$@"\n' \
        "$sw/base" "$version" >"$dest.new/bin/python"
      chmod 755 "$dest.new/bin/python"
    fi
    packages=lib/python$version/site-packages
    rm -rf "${dest:?}.new/$packages"
    link "$2/$packages" "$dest.new/$packages"
    rm -f "$dest.new/$packages"/__editable__*tinygpt*
    chmod -R a+rX "$dest.new"
    rm -rf "$dest" && mv "$dest.new" "$dest"
    echo "login.sh: the jobs' Python is $CLUSTER_MOUNT/sw/python/bin/python (Python $version with $2's packages)"
    exit 0 ;;
  boot) ;;
  *) usage >&2; exit 2 ;;
esac
[ -e "/run/netns/$LOGIN_NS" ] || { echo "login.sh: no network namespace /run/netns/$LOGIN_NS: bring the cluster" \
  "up with up.sh --nodes 2 --login" >&2; exit 2; }
export PATH=$PATH:/usr/sbin:/sbin

# --- the package: installed, never started here ---------------------------------------------------------------
if [ ! -x /usr/sbin/sshd ]; then
  echo "login.sh: installing openssh-server (Debian's package; its service is not started)"
  # Debian's maintainer scripts start a service unless policy-rc.d says no (101): ours, only for this install.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# login.sh: no service starts while openssh-server installs\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server \
    >>/tmp/tinygpt-slurm-apt.log 2>&1 || status=$?
  [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "${status:-0}" = 0 ] || { echo "login.sh: apt-get install openssh-server failed; see" \
    "/tmp/tinygpt-slurm-apt.log" >&2; exit 1; }
fi

# --- the login shells a site may give its users (lib.sh's LOGIN_OTHERS have one each) ---------------------
# shellcheck disable=SC2086
if ! dpkg-query -W $LOGIN_SHELL_PACKAGES >/dev/null 2>&1; then
  echo "login.sh: installing the login shells $LOGIN_SHELL_PACKAGES"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $LOGIN_SHELL_PACKAGES \
    >>/tmp/tinygpt-slurm-apt.log 2>&1 || { echo "login.sh: apt-get install $LOGIN_SHELL_PACKAGES failed; see" \
    "/tmp/tinygpt-slurm-apt.log" >&2; exit 1; }
fi

# --- keys; each user's key in its home on the cluster's file system (up.sh made both) ----------------------
mkdir -p "$KEYS" "$RUN/login" /run/sshd
chmod 700 "$KEYS"
[ -f "$KEYS/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "$LOGIN_USER@local-cluster" -f "$KEYS/id_ed25519"
[ -f "$KEYS/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C login -f "$KEYS/ssh_host_ed25519_key"
# The login node's host key as a known_hosts line, for clients that check it (they all should).
echo "$LOGIN_NAME,$LOGIN_ADDR $(cut -d' ' -f1-2 "$KEYS/ssh_host_ed25519_key.pub")" >"$KEYS/known_hosts"
allowed=""
for entry in $LOGIN_USERS; do
  user=${entry%%:*} home=$CLUSTER_FS/home/${entry%%:*}
  id -u "$user" >/dev/null 2>&1 && [ -d "$home" ] && [ -d "$CLUSTER_MOUNT" ] || { echo "login.sh: no user" \
    "$user, $home or $CLUSTER_MOUNT: bring the cluster up with up.sh --nodes 2 --login" >&2; exit 2; }
  mkdir -p "$home/.ssh"
  cp "$KEYS/id_ed25519.pub" "$home/.ssh/authorized_keys"
  chown -R "$user:$user" "$home/.ssh"
  chmod 700 "$home/.ssh" && chmod 600 "$home/.ssh/authorized_keys"
  allowed+=" $user"
done

# --- sshd -----------------------------------------------------------------------------------------------------
cat >"$ETC/sshd_config.new" <<EOF
# Written by hpc_lab/local_cluster/login.sh: the login node's sshd, listening on its own address only
ListenAddress $LOGIN_ADDR
Port 22
HostKey $KEYS/ssh_host_ed25519_key
PidFile $PIDFILE
AllowUsers$allowed
PermitRootLogin no
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# (tests open many connections at once: more unauthenticated ones than OpenSSH's default of 10)
MaxStartups 100:30:200
LogLevel VERBOSE
Subsystem sftp internal-sftp
EOF
/usr/sbin/sshd -t -f "$ETC/sshd_config.new" || { echo "login.sh: sshd refuses its configuration" >&2; exit 1; }
changed=0
cmp -s "$ETC/sshd_config.new" "$ETC/sshd_config" || changed=1
mv "$ETC/sshd_config.new" "$ETC/sshd_config"
[ "$changed" = 1 ] && stop_daemon "$PIDFILE" sshd
if ! alive "$PIDFILE" sshd; then
  echo "login.sh: starting sshd (login, $LOGIN_ADDR)"
  # Its own hostname, and /cluster; in the cluster's Slurm release where that is not this machine's (lib.sh).
  release=${RELEASE_ROOT:+"$(overlay_usr) && "}
  nsenter --net="/run/netns/$LOGIN_NS" unshare --uts --mount --propagation private sh -c \
    "hostname $LOGIN_NAME && mount --bind '$CLUSTER_FS' '$CLUSTER_MOUNT' && $release exec /usr/sbin/sshd \
     -f '$ETC/sshd_config' -E '$LOG/sshd.log'" \
    || { echo "login.sh: sshd did not start; see $LOG/sshd.log" >&2; exit 1; }
fi
# Answers: the user logs in with the key, the host key is the one written above.
logs_in() {
  ssh -i "$KEYS/id_ed25519" -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KEYS/known_hosts" \
    -o ConnectTimeout=5 "$LOGIN_USER@$LOGIN_ADDR" true
}
wait_for 20 logs_in || { echo "login.sh: $LOGIN_USER cannot log in to $LOGIN_NAME; last lines of $LOG/sshd.log:" >&2
  tail -n 20 "$LOG/sshd.log" >&2; exit 1; }
