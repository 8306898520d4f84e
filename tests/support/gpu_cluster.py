"""A GPU cluster as `scontrol -o show partition|node` and sacctmgr describe it, for the tests of what is read
from them (the local cluster has no GPUs, no time limits and no accounts to show)."""

from tinygpt.launch.slurm.live_cluster import LiveCluster

# A GPU cluster as scontrol prints it (the local cluster has no GPUs): two partitions, GPUs of two types, one
# partition closed to the user's groups and one down.
GPU_PARTITIONS = [
    {"PartitionName": "a100", "Default": "YES", "MaxTime": "2-00:00:00", "MaxNodes": "UNLIMITED", "TotalNodes": "3",
     "State": "UP", "AllowGroups": "ALL", "AllowAccounts": "ALL", "PreemptMode": "OFF"},
    {"PartitionName": "h100", "Default": "NO", "MaxTime": "04:00:00", "MaxNodes": "1", "TotalNodes": "2",
     "State": "UP", "AllowGroups": "ALL", "AllowAccounts": "ALL", "PreemptMode": "OFF"},
    {"PartitionName": "staff", "Default": "NO", "MaxTime": "UNLIMITED", "MaxNodes": "UNLIMITED", "TotalNodes": "1",
     "State": "UP", "AllowGroups": "no-such-group-here", "AllowAccounts": "ALL"},
    {"PartitionName": "old", "Default": "NO", "MaxTime": "UNLIMITED", "TotalNodes": "1", "State": "DOWN"},
]
GPU_NODES = [
    *({"NodeName": f"a{i}", "CPUTot": "64", "RealMemory": "512000", "Gres": "gpu:a100:4(S:0-1)",
       "Partitions": "a100"} for i in range(2)),
    {"NodeName": "a2", "CPUTot": "128", "RealMemory": "1024000", "Gres": "gpu:a100:8(S:0-1)", "Partitions": "a100"},
    *({"NodeName": f"h{i}", "CPUTot": "96", "RealMemory": "768000", "Gres": "gpu:h100:8", "Partitions": "h100"}
      for i in range(2)),
]


GPU_CLUSTER = LiveCluster(
    {"ClusterName": "big", "MaxArraySize": "5001", "PreemptType": "preempt/none", "PreemptMode": "OFF"},
    {p["PartitionName"]: p for p in GPU_PARTITIONS}, GPU_NODES,
    ("proj1", [{"Account": "proj1", "QOS": "normal,long", "DefaultQOS": "normal"},
               {"Account": "proj2", "QOS": "normal", "DefaultQOS": ""}]))
