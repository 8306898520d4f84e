"""tinygpt: a character-level GPT that trains the same way on a laptop CPU and on a Slurm cluster.

This package's top level imports nothing heavy: the launcher (`tinygpt.launch`) and the configuration
schema (`tinygpt.base.config`) must load on a login node without torch.
"""

__version__ = "0.1.0"
