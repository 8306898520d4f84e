"""commands/: one module per command of `launch.py` (`cli` parses and hands each to its module). Commands
stand side by side: none imports another; work two commands share lives in a lower wing.

Imports every other wing of the launcher.
"""
