"""What the tests and bench/ share: tiny runs, processes waited on, sweeps made by hand, the cluster's gate,
the hermetic PATH, the Slurm helpers and the oracles. Import it as `tests.support.MODULE`; nothing here is a test."""
