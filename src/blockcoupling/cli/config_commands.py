"""``check-config`` and ``plan``: a config file checked as the workflow checks it, and the cost
of its jobs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml


def _workflow_dir(given: Path | None) -> Path:
    candidates = [given] if given else [Path.cwd(), Path(__file__).resolve().parents[3]]
    for folder in candidates:
        if folder is not None and (folder / "schemas" / "config.schema.yaml").is_file():
            return folder
    raise ValueError("cannot find schemas/config.schema.yaml; give --workflow-dir")


def read_config(file: Path) -> dict[str, Any]:
    """A config file's YAML mapping, or a one-line ValueError naming the file: unreadable, not
    UTF-8, a YAML error (its first line), nested too deeply to parse, or not a mapping.
    """
    try:
        config = yaml.safe_load(Path(file).read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(
            f"{file}: YAML error{where}: {error.problem or error.context}; fix the file"
        ) from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{file}: {str(error).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError(
            f"{file}: nested too deeply to parse (Python's recursion limit); a config is a "
            "few levels of sections: flatten it"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a YAML mapping")
    return config


def layered(files: list[Path]) -> dict[str, Any]:
    """Config files merged in order by Snakemake's own merge, as ``--configfile`` layers them
    (later keys win, nested sections merged); a file that does not read is one error naming it
    (``read_config``).
    """
    from snakemake.utils import update_config

    config: dict[str, Any] = {}
    for file in files:
        update_config(config, read_config(Path(file)))
    return config


def describe(files: list[Path]) -> str:
    """The config files as a message names them."""
    return " + ".join(map(str, files))


def load_plan(
    files: Path | list[Path], workflow_dir: Path | None = None, check_memory: bool = True
) -> Any:
    """The workflow's ``Plan`` of a config file, or of several layered as ``--configfile``
    layers them: schema defaults and every check applied.
    """
    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.schema_check import validate_config

    files = [files] if isinstance(files, (str, Path)) else list(files)
    folder = _workflow_dir(workflow_dir)
    config = layered(files)
    try:
        validate_config(config, folder / "schemas" / "config.schema.yaml")
    except ValueError as error:
        raise ValueError(f"{describe(files)}: {error}") from None
    return check_config(config, folder, check_memory)


def check_slurm(plan: Any) -> str:
    """The Slurm checks of the slurm profile (``slurm_fit.check_plan`` against sinfo's nodes, the
    ``BLOCKCOUPLING_SLURM_*`` settings); raises ``SlurmError`` naming the setting.
    """
    from blockcoupling.pipeline import slurm, slurm_fit, slurm_nodes

    settings = slurm.SlurmSettings.from_env()
    try:
        if slurm_nodes.read_nodes(settings.partition) is None:
            return "; Slurm: sinfo did not answer, nothing checked"
    except slurm_nodes.SlurmError:  # no such partition: check_plan names the setting
        pass
    threads = min(plan.threads("extract"), settings.max_threads() or sys.maxsize)
    slurm_fit.check_plan(plan, settings, threads)
    return "; Slurm: every job fits a node of its partition"


def check_config_file(
    files: Path | list[Path], workflow_dir: Path | None = None, profile: str | None = None
) -> str:
    """Validate a config file (or several, layered) as the workflow does; return a
    one-paragraph summary and a line per warning (K above d/8).
    """
    from blockcoupling.pipeline.design_units import primary_unit_warnings
    from blockcoupling.pipeline.k_warnings import k_warnings

    files = [files] if isinstance(files, (str, Path)) else list(files)
    plan = load_plan(files, workflow_dir)
    jobs = sum(
        len(e.measured_steps) * (len(plan.shards(name)) + len(plan.token_jobs(name)))
        for name, e in plan.models.items()
    )
    vit = (
        f"; ViT sweep: {len(plan.vit.points)} ViTs on {plan.vit.base['dataset']} "
        f"({len(plan.vit.drop_path_rate)} rates x {len(plan.vit.weight_decay)} weight decays x "
        f"{len(plan.vit.seeds)} seeds)"
        if plan.vit
        else ""
    )
    return (
        f"{describe(files)}: ok. {len(plan.models)} models ({len(plan.cross_model)} cross-model, "
        f"{len(plan.checkpoint_models)} checkpoint suites), {jobs} extract jobs, "
        f"{len(plan.train_runs)} training runs, prompt set {plan.prompt_set!r}, statistics at "
        + ", ".join(f"{k}={v}" for k, v in plan.selection.items())
        + vit
        + (check_slurm(plan) if profile == "slurm" else "")
        + "".join(f"\nwarning: {line}" for line in k_warnings(plan))
        + "".join(f"\nwarning: {line}" for line in primary_unit_warnings(plan))
    )


def plan_report(args: argparse.Namespace) -> tuple[str, bool]:
    """The cost table of a config's extract/evaluate jobs, and whether every GPU job fits."""
    from dataclasses import replace

    from blockcoupling.cli.parser import configfiles
    from blockcoupling.pipeline import budget, cost, hub_volume, plan_table, slurm_sizing

    if args.gpu_tflops is not None and not 0 < args.gpu_tflops < float("inf"):
        raise ValueError(
            f"--gpu-tflops {args.gpu_tflops:g}: give your GPUs' achieved float32 TFLOP/s, a "
            "number above 0 (or leave it out for the H200 measured)"
        )
    if args.csv is not None and (args.csv.is_dir() or not args.csv.parent.is_dir()):
        what = "is a folder" if args.csv.is_dir() else "is in no existing folder"
        raise ValueError(f"--csv {args.csv}: {what}; name a CSV file, e.g. --csv plan.csv")
    limit = None
    if args.time_limit:
        from blockcoupling.pipeline.slurm_nodes import minutes

        try:
            limit = minutes(args.time_limit)
        except ValueError as error:
            raise ValueError(
                f"--time-limit {args.time_limit!r}: {error}; give a positive limit: minutes, "
                "HH:MM:SS or D-HH:MM:SS"
            ) from None
    files = configfiles(args)
    plan = load_plan(files, args.workflow_dir, check_memory=False)
    uncosted = [n for n, e in plan.models.items() if cost.shape_of(e.meta, e.load) is None]
    if uncosted:
        raise ValueError(
            f"models.{uncosted[0]}: no meta.n_layers and meta.d_model, so its jobs cannot be "
            f"costed ({len(uncosted)} such model(s): {', '.join(uncosted)}); add them under "
            f"models.{uncosted[0]}.meta"
        )
    gpu = cost.GPU if args.gpu_rates is None else cost.load_rates(args.gpu_rates)
    if args.gpu_tflops is not None:
        gpu = replace(
            gpu,
            name=f"GPU, float32 ({args.gpu_tflops:g} TFLOP/s given)",
            matmul=args.gpu_tflops * 1e12,
        )
    if args.time_limit:
        where = f"of --time-limit {args.time_limit}"
        plan = slurm_sizing.sized_plan(
            plan, lambda model: (where, limit), lambda m: gpu if plan.on_gpu(m) else cost.CPU
        )
    rows = cost.plan_costs(plan, gpu=gpu)
    if args.csv:
        import pandas as pd

        frame = pd.DataFrame(
            [
                {
                    "model": r.model,
                    "rule": r.rule,
                    "jobs": r.jobs,
                    "device": "gpu" if r.on_gpu else "cpu",
                    "hours": r.seconds / 3600,
                    "hours_per_job": r.job_seconds / 3600,
                    "runtime_min": slurm_sizing.runtime_minutes(r.job_seconds, 1, limit),
                    "peak_gb": r.peak_bytes / cost.GB,
                    "gpu_mem_gb": r.declared_gb,
                    "output_gb": r.output_bytes / cost.GB,
                    "fits": r.fits,
                }
                for r in rows
            ]
        )
        frame.to_csv(args.csv, index=False)
    header = (
        f"{describe(files)}: {len(plan.models)} models, {plan.n_prompts} prompts, "
        f"max_tokens {plan.extraction.max_tokens} (null counts as "
        f"{cost.DEFAULT_TOKENS})"
    )
    download, peak, revisions = hub_volume.hub_volume(plan)
    bound = plan.hub.max_revisions
    hub = (
        f"hub: {download / cost.GB:,.0f} GB to download ({revisions} model revisions at "
        f"{hub_volume.HUB_BYTES_PER_PARAM} bytes/parameter), peak cache {peak / cost.GB:,.0f} GB "
        f"(hub.max_revisions={bound if bound is not None else 'all'}"
        + ("; every revision fetched ahead)" if bound is None else ")")
    )
    table = plan_table.plan_table(rows, gpu=gpu, limit=limit)
    volumes = budget.volume_lines(plan, rows)
    refusal = budget.over_budget(plan, rows)
    report = "\n".join([header, table, hub, *volumes, *([f"stop: {refusal}"] if refusal else [])])
    return report, all(r.fits for r in rows if r.on_gpu) and refusal is None
