"""heal/: a sweep's heal job, the one home of its retry policy's work (the policy itself is a section of the spec,
`spec/retry.py`): how each run's newest job ended, in the policy's words (`ends`), what the policy does next with
each run and the summary once nothing is left (`decide`), the small jobs' scripts and submissions (`job`: the heal
job, `<sweep>-heal`, after each round; the summary's mail), and one pass of the heal job, which sends what was
decided and submits itself again after the new round (`heal_pass`).

"Heal job" names the sweep's own Slurm job; `node/supervise.py` is the process beside one run's program.

Imports the wings below it: submit/, read/, spec/, slurm/ and the ground floor.
"""
