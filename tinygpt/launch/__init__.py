"""The login-node side (`launch.py`, and the library `tinygpt.launch.api`): specs and cluster profiles in, scripts
and jobs out, and what they say after.

A ground floor of plain modules (layout, errors, console, manifest) under wings by role: slurm/, spec/, node/,
submit/, read/, act/, remote/, then the library `api` and commands/ over it; each imports only lower ones
(docs/launcher.md has the table, and a test holds it to the code). Nothing here imports torch: a login node must
start it in well under a second.
"""
