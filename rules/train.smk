# The small Pythia-architecture suite trained here; checkpoints are outputs, consumed by extract
# through {step}. The trainer works in results/train/{run}/work (not an output, so it survives an
# interrupted job) and resumes from its newest checkpoint there.
for _run, _spec in TRAIN_RUNS.items():

    rule:
        name:
            f"train_{_run.replace('-', '_').replace('.', '_')}"
        output:
            checkpoints=expand(
                "results/train/{run}/step{step}/model.safetensors",
                run=_run,
                step=TRAIN_STEPS[_run],
            ),
            history=f"results/train/{_run}/history.csv",
        log:
            f"logs/train/{_run}.log",
        benchmark:
            f"benchmarks/train/{_run}.tsv"
        conda:
            "../envs/torch.yaml"
        threads: config["train"].get("threads", 1)
        resources:
            mem_mb=4000,
        params:
            run=_run,
            spec=_spec,
            code=TRAIN_CODE,
        script:
            "../scripts/train.py"
