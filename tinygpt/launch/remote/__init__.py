"""remote/: working from a laptop over SSH: the laptop's half (`laptop`, with `private_folders`, its folders that
must be the user's alone) and the login node's half (`login_side`, one stdlib-only file sent to the login node as
source text, importing nothing of this project).

Imports the ground floor, `spec/` and `submit/`.
"""
