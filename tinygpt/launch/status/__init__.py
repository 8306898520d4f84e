"""status/: what `status` says of a sweep, in one place: its document (`document`: `status --json`, the library's
`Sweep.status()`, its JSON Schema) and its tables on the terminal (`table`: the runs, fitted to the width, with
--watch, and the use of the allocation, --efficiency); and the sweeps of a work directory, an entry each
(`listing`: `list`, the library's `list_sweeps()`). What each run is doing is read below, in
`read/run_states.py`.

Imports heal/ (what the retry policy does next), remote/ (a sweep launched from this laptop: listed by its login
node), read/, spec/ and the ground floor.
"""
