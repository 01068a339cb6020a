# The small Pythia-architecture suite trained here; checkpoints are outputs, consumed by extract
# through {step}. The trainer works in results/train/{run}/work-<key>, keyed to the exact run
# config and training code: an interrupted job resumes there, any change starts afresh.
for _run, _spec in PLAN.train_runs.items():

    rule:
        f"""Stage train_{{run}} for run {_run}: train its GPT-NeoX on Shakespeare."""
        name:
            f"train_{rule_suffix(_run)}"
        output:
            checkpoints=expand(
                "results/train/{run}/step{step}/model.safetensors",
                run=_run,
                step=PLAN.train_steps(_run),
            ),
            history=f"results/train/{_run}/history.csv",
        log:
            f"logs/train/{_run}.log",
        benchmark:
            f"benchmarks/train/{_run}.tsv"
        conda:
            "../envs/torch.yaml"
        threads: PLAN.threads("train")
        resources:
            **JOBS.own(TRAIN_MEM_MB, TRAIN_RUNTIME),
        params:
            math_threads=PLAN.threads("train"),  # the numbers follow it: a change re-runs
            spec=_spec,
            code=script_hash("train"),
        script:
            "../scripts/train.py"
