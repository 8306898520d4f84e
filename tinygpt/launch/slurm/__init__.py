"""slurm/: the one door to Slurm: every call to its commands (`slurm_cli`), what the live cluster says about
itself (`live_cluster`), the queue limits that count the user's jobs (`limits`), and how sbatch reads an `#SBATCH`
line (`directives`). Where Slurm releases differ, the difference lives here.

Imports only the ground floor (`tinygpt.launch.errors`, `layout`, `console`, `manifest`).
"""
