"""heal/: a sweep's heal job, the one home of the work Slurm leaves to a sweep: its retry policy's (the policy itself
is a section of the spec, `spec/retry.py`) and its waves'. How each run's newest job ended, in the policy's words
(`ends`), what the policy does next with each run and the summary once nothing is left (`decide`), the runs a sweep
larger than the queue limits lets wait and the next wave of them (`waves`), the small jobs' scripts and
submissions (`job`: the heal job, `<sweep>-heal`; the summary's mail), and one pass of the heal job, which sends
the next wave and what the policy decided, then submits itself again (`heal_pass`).

"Heal job" names the sweep's own Slurm job; `node/supervise.py` is the process beside one run's program.

Imports the wings below it: submit/, read/, spec/, slurm/ and the ground floor.
"""
