# How a batch script starts its srun step, in one place: the scripts launch.py writes carry this text (sbatch.py
# reads it; these comment lines stay out), and hpc_lab/04_tinygpt/train.sbatch sources this file.
#
# srun asks the controller for each step. While the controller is away (a restart, a failover, maintenance)
# srun cannot start one and exits with SLURM_EXIT_ERROR (108, a status no trainer uses) instead of the
# program's: the task waits for the controller and for its nodes to register with it again (a step asked for
# before that waits on srun's growing back-off, minutes), says so in its log, and starts the step again; a
# trainer that had begun resumes from its checkpoint. Bounded: three more tries, each after at most 600 s of
# waiting. (submitit's scripts, whose srun line is submitit's, wait for the controller once before it:
# `controller_back`.)
export SLURM_EXIT_ERROR=108
answers() {  # the controller, and every node of this job (after a restart: registered)
  local nodes
  scontrol ping >/dev/null 2>&1 || return 1
  nodes=$(scontrol -o show node "$SLURM_JOB_NODELIST" 2>/dev/null) || return 1
  [ -n "$nodes" ] && ! grep -q 'SlurmdStartTime=None' <<<"$nodes"
}
controller_back() {
  local start=$SECONDS
  answers && return 0
  echo "tinygpt: the controller does not answer (scontrol ping); waiting for it, at most 600 s" >&2
  until answers; do
    if [ $(( SECONDS - start )) -ge 600 ]; then
      echo "tinygpt: the controller did not answer for 600 s; giving up (resubmit runs it again)" >&2
      return 1
    fi
    sleep 2
  done
  echo "tinygpt: the controller answers again after $(( SECONDS - start )) s; starting the step" >&2
}
step() {
  local code tries=1
  "$@"; code=$?
  while [ "$code" -eq 108 ] && [ "$tries" -lt 4 ] && controller_back; do
    tries=$(( tries + 1 ))
    "$@"; code=$?
  done
  return "$code"
}
