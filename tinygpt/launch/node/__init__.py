"""node/: the launcher's code that runs on a compute node, inside a job: a run's config file written from the
manifest (`run_config`), submitit's picklable task (`train_task`), one Optuna worker (`search_worker`) and the
journal file its study lives in (`study_journal`), the process beside a command's program (`supervise`), the
progress it prints made records (`printed_progress`) and a command under torchrun (`torchrun_start`).

Imports the ground floor and `tinygpt.base`, and the trainer (`tinygpt.training`) inside the functions a job
calls: the login node never imports torch.
"""
