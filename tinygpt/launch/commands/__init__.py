"""commands/: the commands of `launch.py`: `cli` parses each and hands it to the library (`api`), to the wing
that does it (act/, read/) or to its own module here, then prints: `status` (its table and --watch), `sweeps`
(`list`), `logs`, `heal` (one pass of a retry policy: what the sweep's supervisor job runs), `json_schema`,
`wandb_sync`, `profile_new`. Commands stand side by side: only `cli` imports another; work two commands share lives
in a lower wing.

Imports every other wing of the launcher.
"""
