"""The workflow's side of the library (torch-free): a config becomes a checked ``Plan`` that
the rules read.

- ``checks``: ``check_config`` and every cross-field check (one-line ``errors.ConfigError``);
- ``entries``: what each model is; ``grids``: training grids expanded into runs;
- ``plan``: the ``Plan`` and its targets; ``figure_registry``: the figures as plain data;
- ``code_hash``: a rule's code hash from the modules its script imports;
- ``cost``: the run's cost model and shard sizes; ``slurm``: Slurm requests and checks.

The package imports nothing itself: each rule file and module imports what it uses.
"""
