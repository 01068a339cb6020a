# One dataset per metric across models (dims model x init) and across checkpoints (model x step).
for _along, _folder in (("init", "results/combined"), ("step", "results/combined/checkpoints")):
    if not PLAN.combined_names(_along):
        continue

    _rule = "combine_models" if _along == "init" else "combine_checkpoints"

    rule:
        f"""Combine one metric's files across {'models' if _along == 'init' else 'checkpoints'}."""
        name:
            _rule
        input:
            lambda wildcards, along=_along: PLAN.combine_inputs(along, wildcards.name),
        output:
            f"{_folder}/{{name}}.nc",
        log:
            f"logs/combine/{_along}_{{name}}.log",
        benchmark:
            f"benchmarks/combine/{_along}_{{name}}.tsv"
        wildcard_constraints:
            name="|".join(PLAN.combined_names(_along)),
        group:
            job_group(_rule)
        conda:
            "../envs/analysis.yaml"
        resources:
            **JOBS.own(),
        params:
            parts=lambda wildcards, along=_along: [
                [model, step, path]
                for (model, step), path in zip(
                    PLAN.combine_parts(along, wildcards.name),
                    PLAN.combine_inputs(along, wildcards.name),
                )
            ],
            meta={name: entry.meta for name, entry in PLAN.models.items()},
            along=_along,
            code=script_hash("combine"),
        script:
            "../scripts/combine.py"
