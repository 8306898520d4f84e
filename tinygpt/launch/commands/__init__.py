"""commands/: the commands of `launch.py`: `cli` parses each and hands it to the library (`api`), to the wing
that does it (act/, read/) or to its own module here, then prints. Commands stand side by side: none imports another;
work two commands share lives in a lower wing.

Imports every other wing of the launcher.
"""
