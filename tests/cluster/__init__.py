"""What needs the local Slurm cluster (hpc_lab/local_cluster/up.sh): marked `slurm`."""
