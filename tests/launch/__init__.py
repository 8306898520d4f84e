"""The launcher, without a cluster: specs, profiles, scripts, snapshots, reading, remote."""
