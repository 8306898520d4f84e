"""submit/: a checked sweep becomes files and jobs: the plan on disk (`plan`), its batch scripts (`sbatch`, over
`slurm_options`, which both backends share), the backends that submit, resubmit and cancel (`backends`), the job
chain (`chain`), the code snapshot jobs run (`snapshot`), the check against the live cluster before anything is
written (`preflight`) and the way of the spec's that would start soonest (`placement`), and the warm fork server
that runs local runs (`fork_server`).

Imports the ground floor, `slurm/`, `spec/` and `node/`.
"""
