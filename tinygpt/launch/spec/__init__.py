"""spec/: a spec and a cluster profile become a checked sweep: the spec (`sweep`), its runs (`sweep_runs`), its search
section (`search`), a program of the user's (`command`), the retry policy (`retry`), the profile (`profiles`), what
a job asks for in Slurm's units (`resources`), the options passed through as they are (`passthrough`), the corpora
it trains on (`corpora`).

Imports the ground floor, `slurm/` and `tinygpt.base`.
"""
