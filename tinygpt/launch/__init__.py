"""The login-node side: YAML specs, cluster profiles, sbatch/submitit/local backends, status.

Nothing in this package imports torch: a login node must start it in well under a second.
"""
