"""The trainer's runtime: the `Trainer` loop and everything it is built from (run setup, optimizers and their
schedule, precision, distributed ranks, checkpoints and the train state, preemption, the hang watchdog, progress,
metrics and trackers, the run-directory lock, provenance, what a run tells as it trains, the attention maps
it writes as it ends).

Imports `tinygpt.base`, `tinygpt.model` and `tinygpt.data`; never the launcher, nor the entry points above it
(`tinygpt.train`, `tinygpt.sample`, `tinygpt.report`). Its torch-free modules (metrics, progress, preemption,
precision's probes, rundir_lock, attention's file name) are read by the launcher too: torch is imported inside
functions, never at the top.
"""
