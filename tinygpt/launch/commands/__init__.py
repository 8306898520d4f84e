"""commands/: the commands of `launch.py`: `cli` parses each and hands it to the library (`api`) or to the wing that
does it (act/, status/, heal/, read/, profile_new), then prints; the commands that are only printing live here:
`list_sweeps` (`list`), `logs`, `json_schema` (`schema`), `wandb_sync`. Commands stand side by side: only `cli`
imports another; work two commands share lives in a lower wing.

Imports every other wing of the launcher.
"""
