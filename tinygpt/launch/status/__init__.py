"""status/: what `status` says of a sweep, in one place: its document (`document`: `status --json`, the library's
`Sweep.status()`, its JSON Schema) and its tables on the terminal (`table`: the runs, fitted to the width, with
--watch, and the use of the allocation, --efficiency). What each run is doing is read below, in
`read/run_states.py`.

Imports heal/ (what the retry policy does next), read/, spec/ and the ground floor.
"""
