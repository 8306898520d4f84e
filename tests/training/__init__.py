"""The trainer's runtime: the loop, optimizers, precision, checkpoints, ranks, trackers, locks."""
