"""remote/: working from a laptop over SSH: the laptop's half (`laptop`, with `socket_folder`, the private folder of
its shared connection's sockets) and the login node's half (`login_side`, one stdlib-only file sent to the login
node as source text, importing nothing of this project).

Imports the ground floor, `spec/` and `submit/`.
"""
