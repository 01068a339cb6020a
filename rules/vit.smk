# The ViT sweep (paper Section 4, Appendix A.7): one ViT per grid point of stochastic-depth rate
# {drop_path_rate}, weight decay {weight_decay} and {seed}, trained here, its block Jacobians measured on test images,
# then one dataset of coupling and accuracy, statistics and the two figures (rules/figures.smk).
# Training works in results/vit/train/.../work-<key>, keyed to the run config and code, so an
# interrupted job resumes there. Threads, device, data folder and chunk size re-run nothing.
if PLAN.vit:

    wildcard_constraints:
        drop_path_rate="|".join(re.escape(label) for label in PLAN.vit.drop_path_rate),
        weight_decay="|".join(re.escape(label) for label in PLAN.vit.weight_decay),
        seed="|".join(str(seed) for seed in PLAN.vit.seeds),

    localrules:
        vit_data,  # CIFAR-10 downloads where Snakemake runs (compute nodes may have no internet)

    rule vit_data:
        """Download or build the ViT image dataset (digits or CIFAR-10)."""
        output:
            PLAN.vit.data_file,
        log:
            "logs/vit/data.log",
        benchmark:
            "benchmarks/vit/data.tsv"
        conda:
            "../envs/torch.yaml"
        resources:
            data_dir=PLAN.vit.data_dir,
        params:
            dataset=PLAN.vit.base["dataset"],
            split_seed=PLAN.vit.base["split_seed"],
            test_fraction=PLAN.vit.base["test_fraction"],
            code=script_hash("vit_data"),
        script:
            "../scripts/vit_data.py"

    rule vit_train:
        """Train one Vision Transformer of the stochastic-depth grid."""
        input:
            data=PLAN.vit.data_file,
        output:
            model="results/vit/train/sd{drop_path_rate}/wd{weight_decay}/seed{seed}/model.safetensors",
            history="results/vit/train/sd{drop_path_rate}/wd{weight_decay}/seed{seed}/history.csv",
        log:
            "logs/vit/train/sd{drop_path_rate}_wd{weight_decay}_seed{seed}.log",
        benchmark:
            "benchmarks/vit/train/sd{drop_path_rate}_wd{weight_decay}_seed{seed}.tsv"
        retries: 1  # training resumes from its work folder: a retry continues, on twice the time
        conda:
            "../envs/torch.yaml"
        threads: PLAN.threads("vit")
        resources:
            **JOBS.resources("vit_train", "vit"),
            device=vit_device,
        params:
            math_threads=PLAN.threads("vit"),  # the numbers follow it: a change re-runs
            run=lambda wildcards: PLAN.vit.run(
                wildcards.drop_path_rate, wildcards.weight_decay, wildcards.seed
            ).to_dict(),
            code=script_hash("vit_train"),
        script:
            "../scripts/vit_train.py"

    rule vit_extract:
        """Block Jacobians and coupling statistics of one trained ViT."""
        input:
            data=PLAN.vit.data_file,
            model="results/vit/train/sd{drop_path_rate}/wd{weight_decay}/seed{seed}/model.safetensors",
        output:
            **{
                kind: f"results/vit/extract/sd{{drop_path_rate}}/wd{{weight_decay}}/seed{{seed}}/{kind}.nc"
                for kind in EXTRACTED
            },
        log:
            "logs/vit/extract/sd{drop_path_rate}_wd{weight_decay}_seed{seed}.log",
        benchmark:
            "benchmarks/vit/extract/sd{drop_path_rate}_wd{weight_decay}_seed{seed}.tsv"
        retries: 1  # a node fault or a run past its time: again on twice the time
        conda:
            "../envs/torch.yaml"
        threads: PLAN.threads("vit")
        resources:
            **JOBS.resources("vit_extract", "vit"),
            device=vit_device,
            vjp_chunk=PLAN.vit.extraction.chunk_size or 0,
        params:
            math_threads=PLAN.threads("vit"),  # the numbers follow it: a change re-runs
            run=lambda wildcards: PLAN.vit.run(
                wildcards.drop_path_rate, wildcards.weight_decay, wildcards.seed
            ).to_dict(),
            extract=PLAN.vit.extract,
            code=script_hash("vit_extract"),
        script:
            "../scripts/vit_extract.py"

    rule vit_combine:
        """Coupling and test accuracy of every ViT in one dataset."""
        input:
            [part[kind] for part in PLAN.vit.parts() for kind in ("depth", "tokens", "history")],
        output:
            "results/vit/combined.nc",
        log:
            "logs/vit/combine.log",
        benchmark:
            "benchmarks/vit/combine.tsv"
        group:
            job_group("vit_combine")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            parts=PLAN.vit.parts(),  # each point with its files, by name
            metrics=PLAN.vit_metric,
            code=script_hash("vit_combine"),
        script:
            "../scripts/vit_combine.py"

    rule vit_stats:
        """Statistics of the ViT sweep: coupling vs stochastic depth and accuracy."""
        input:
            "results/vit/combined.nc",
        output:
            **{name: f"results/stats/{name}.csv" for name in VIT_STATS_TABLES},
        log:
            "logs/vit/stats.log",
        benchmark:
            "benchmarks/vit/stats.tsv"
        group:
            job_group("vit_stats")
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            selection=PLAN.vit_selection,
            bootstrap=PLAN.bootstrap,
            primary=list(PLAN.primary),
            code=script_hash("vit_stats"),
        script:
            "../scripts/vit_stats.py"
