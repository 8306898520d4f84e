"""read/: what a run, a job, a log and a study say: each run's state (`run_states`), its Slurm logs (`log_files`),
how well jobs used their allocation (`efficiency`), an Optuna study (`study`), the sweep's report (`sweep_report`;
`command_report` for a program of the user's). Nothing here writes a sweep's files or submits.

Imports the ground floor, `slurm/`, `spec/` and `node/`, and `tinygpt.report`.
"""
