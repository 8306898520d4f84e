# Sourced by train.sbatch on the compute node before training. Put what your cluster needs here:
#
#   module load cuda/12.1 python/3.11          # your site's module names
#   source "$HOME/venvs/tinygpt/bin/activate"   # or: conda activate tinygpt
#   export NCCL_DEBUG=WARN
#
# By default: the repository's own .venv (made by `make venv`) when it exists.
if [ -x "$REPO/.venv/bin/python" ]; then
  PYTHON="$REPO/.venv/bin/python"
fi
