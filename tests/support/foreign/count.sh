#!/bin/sh
# Not Python: a shell program that keeps the run contract by hand. It counts, one a second, to $1 (or to the
# number in the run's file `goal`, once there is one), keeping its count in the run's directory; on the stop
# signal it saves and exits 75. $2 = hang: it stops beating its heart at 3 and waits for ever; $2 = fail-once:
# its first life fails (exit 3), the next counts.
dir=${TINYGPT_RUN_DIR:?}
n=$(cat "$dir/count" 2>/dev/null || echo 0)
if [ "${2:-}" = fail-once ] && [ ! -e "$dir/failed-once" ]; then
  touch "$dir/failed-once"; echo "error: the first life of this run fails" >&2; exit 3
fi
stop=0
trap 'stop=1' USR2 TERM
while [ "$n" -lt "$(cat "$dir/goal" 2>/dev/null || echo "$1")" ]; do
  n=$((n + 1))
  echo "{\"step\": $n}" >> "$dir/metrics.jsonl"
  if [ "${2:-}" = hang ] && [ "$n" -ge 3 ]; then
    trap - TERM  # (stuck, as a process in a dead collective is: SIGTERM ends it)
    while :; do sleep 1; done
  fi
  [ -n "${TINYGPT_HEARTBEAT:-}" ] && touch "$TINYGPT_HEARTBEAT"
  sleep 1
  if [ "$stop" = 1 ]; then echo "$n" > "$dir/count"; echo "saved at $n"; exit 75; fi
done
echo "$n" > "$dir/count"
echo "counted to $n"
