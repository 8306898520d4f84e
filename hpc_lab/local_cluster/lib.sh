# Sourced by up.sh, down.sh and daemon.sh: how the local cluster's daemons are found, stopped and started.
# Needs HOME_DIR (the cluster's folder); sets RUN and LOG under it.
RUN=$HOME_DIR/run
LOG=$HOME_DIR/log

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
start_slurmdbd() { /usr/sbin/slurmdbd >>"$LOG/slurmdbd.out" 2>&1; }
start_slurmctld() { /usr/sbin/slurmctld >>"$LOG/slurmctld.out" 2>&1; }
