"""read/: what a run, a job, a log and a study say: each run's state (`run_states`) and the document of
`status --json` (`status_document`), its Slurm logs (`log_files`), how well jobs used their allocation
(`efficiency`), how each run ended in a retry policy's words (`run_ends`) and what the policy does next
(`retry_round`), an Optuna study (`study`), the sweep's report (`sweep_report`; `command_report` for a program of
the user's). Nothing here writes a sweep's files or submits (`retry_round` decides; `commands/heal.py` acts).

Imports the ground floor, `slurm/`, `spec/` and `node/`, and `tinygpt.report`.
"""
