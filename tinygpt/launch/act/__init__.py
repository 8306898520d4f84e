"""act/: what changes a sweep and its jobs, under the sweep's lock: a launch (`launch`; and `relaunch`: a spec launched
again submits only its new runs), a resubmission of chosen runs (`resubmit`), a cancellation (`cancel`). The library
(`tinygpt.launch.api`) and the commands stand on it.

Imports the wings below it: submit/, read/, spec/, slurm/ and the ground floor.
"""
