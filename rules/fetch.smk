# The fetch stage: every hub model revision (config, tokenizer, weights) and hub prompt dataset
# the config names, downloaded where Snakemake runs (local rules: on a cluster, the login node)
# into the shared hub cache (hub.cache_dir), with a manifest of what each fetch wrote. Compute
# jobs read the cache offline. Checkpoint revisions (revision_template steps) are temporary: each
# is deleted once its jobs are done, and a checkpoint is fetched only after the jobs of the one
# hub.max_revisions places before it are done, so at most hub.max_revisions sit in the cache.
#   snakemake --cores 1 fetch     (kept revisions and datasets now; checkpoints come in turn)
# With hub.max_revisions: all, `fetch` fetches every revision, checkpoints too, and keeps them
# (printing first what the planner says they take on disk), so that the compute part runs with
# no network anywhere.
# The bound is a DAG order, not a Snakemake resource (a resource is held only while a job runs,
# not while its output sits on disk): the checkpoints form max_revisions lanes, each fetch
# waiting for the outputs of the previous revision of its lane. Limits: at most max_revisions
# revisions are extracted at once; a failed job stops its lane (--keep-going runs the others);
# asking for one checkpoint's results runs its lane's earlier revisions first; the bound holds
# per run (two runs sharing a cache each keep their own), and --notemp keeps every revision.


localrules:
    fetch,
    fetch_model,
    fetch_checkpoint,
    fetch_dataset,


# repo -> (dataset config, revision: prompts.revisions' pin, else main)
HUB_DATASETS = PLAN.hub_datasets()
# The lock file (hub.lock_file; lockfile.py) is, like the hub itself, state of the fetch stage
# rather than a declared input: each fetch reads the commit it pins (params.lock names it) and
# records the commit it fetched and the hub's content hash of each file, so its own updates
# re-run nothing. A fetched folder that holds another commit than the lock pins stops the run
# before any job (workflow_setup.check_locked_fetches); one the lock lacks (a deleted lock) is
# recorded into it again when a run starts its jobs (the Snakefile's onstart).


rule fetch:
    """Fetch every kept hub model revision and prompt dataset into the hub cache."""
    input:
        [
            HUB.folder(r.repo, r.revision, r.checkpoint)
            for r in HUB_REVISIONS.values()
            if HUB.ahead or not r.checkpoint
        ],
        [HUB.dataset_folder(repo, revision) for repo, (_, revision) in HUB_DATASETS.items()],


rule fetch_model:
    """Fetch one hub model revision (config, tokenizer, weights) into the cache."""
    output:
        folder=directory(HUB.folder("{repo}", "{revision}", False)),
        manifest=HUB.manifest("model", "{repo}", "{revision}"),
    log:
        "logs/fetch/model/{repo}/{revision}.log",
    wildcard_constraints:
        repo=constraint({r.repo for r in HUB_REVISIONS.values()}),
        revision=r"[^/]+",
    conda:
        "../envs/analysis.yaml"
    resources:  # named in a hub-down line; a resource, so a cache fetched before stays
        hub_keys=lambda wildcards: models_of(wildcards.repo, wildcards.revision),
    params:
        checkpoint=False,
        lock=HUB.lock_file,
        code=script_hash("fetch_model"),
    script:
        "../scripts/fetch_model.py"


rule fetch_checkpoint:
    """Fetch one hub checkpoint revision in its turn (deleted once its jobs are done)."""
    input:
        revision_done,
    output:
        folder=checkpoint_folder(directory(HUB.folder("{repo}", "{revision}", True))),
        manifest=HUB.manifest("checkpoint", "{repo}", "{revision}"),
    log:
        "logs/fetch/checkpoint/{repo}/{revision}.log",
    wildcard_constraints:
        repo=constraint({r.repo for r in HUB_REVISIONS.values() if r.checkpoint}),
        revision=r"[^/]+",
    conda:
        "../envs/analysis.yaml"
    resources:  # named in a hub-down line; a resource, so a cache fetched before stays
        hub_keys=lambda wildcards: models_of(wildcards.repo, wildcards.revision),
    params:
        checkpoint=True,
        cache_dir=lambda wildcards: HUB.cache_dir,
        lock=HUB.lock_file,
        code=script_hash("fetch_model"),
    script:
        "../scripts/fetch_model.py"


rule fetch_dataset:
    """Fetch one prompt dataset at its pinned commit into the hub cache."""
    output:
        folder=directory(HUB.dataset_folder("{repo}", "{revision}")),
        manifest=HUB.manifest("dataset", "{repo}", "{revision}"),
    log:
        "logs/fetch/dataset/{repo}/{revision}.log",
    wildcard_constraints:
        repo=constraint(HUB_DATASETS),
        revision=r"[^/]+",
    conda:
        "../envs/analysis.yaml"
    params:
        config=lambda wildcards: HUB_DATASETS[wildcards.repo][0],
        revision=lambda wildcards: wildcards.revision,
        lock=HUB.lock_file,
        code=script_hash("fetch_dataset"),
    script:
        "../scripts/fetch_dataset.py"
