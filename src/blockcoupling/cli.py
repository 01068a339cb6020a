"""The ``blockcoupling`` command: measure one model on a few prompts, check a workflow config.

blockcoupling measure SOURCE "prompt" ["prompt" ...]   coupling summary of one model
blockcoupling check-config FILE [--profile slurm]       validate a config as the workflow does
blockcoupling plan --configfile FILE                     cost of its jobs (GPU-hours, memory)
blockcoupling verify results/                            every result against its recorded hash
blockcoupling fetch REPO REVISION FOLDER                 one hub revision into the hub cache
blockcoupling claims RESULTS --readme README.md            put a run's claims table in the README
blockcoupling docs docs/datasets.md                      the measure registry's table into the docs
"""

from __future__ import annotations

import argparse
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

SOURCE_HELP = (
    "where the model is: a local folder or .gguf file; hub:ORG/NAME[@REVISION]; "
    "package:PACKAGE:FILE (a file inside an installed package); package:PACKAGE (a package that "
    "assembles its GGUF); or a YAML mapping such as '{hub: gpt2}'"
)


def source_spec(text: str) -> dict[str, Any]:
    """A model source mapping from the command-line form (see SOURCE_HELP)."""
    if text.lstrip().startswith("{"):
        spec = yaml.safe_load(text)
        if not isinstance(spec, dict):
            raise ValueError(f"SOURCE {text!r} is not a mapping")
        return spec
    if text.startswith("hub:"):
        name, _, revision = text[4:].partition("@")
        return {"hub": name, **({"revision": revision} if revision else {})}
    if text.startswith("package:"):
        package, _, file = text[8:].partition(":")
        return (
            {"package": package, "file": file} if file else {"package": package, "assemble": True}
        )
    if Path(text).exists():
        return {"path": text}
    raise ValueError(f"SOURCE {text!r}: no such path; for a hub model write hub:{text}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blockcoupling",
        description="Transformer block coupling: measure a model, check a workflow config.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    measure = commands.add_parser(
        "measure",
        help="block Jacobians of one model on a few prompts: prints coupling per prompt",
        description="Depth-wise block coupling of one model at the last token of each prompt.",
    )
    measure.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    measure.add_argument("prompts", metavar="PROMPT", nargs="+", help="prompt text(s)")
    measure.add_argument("--k", type=int, default=10, help="K of m_K (default 10)")
    measure.add_argument("--max-tokens", type=int, default=None, help="truncate prompts")
    measure.add_argument(
        "--reading", choices=("authors", "offdiag"), default="authors", help="m_K reading"
    )
    measure.add_argument("--variant", choices=("ujv", "vju"), default="ujv", help="basis variant")
    measure.add_argument("--dtype", default="float32", help="storage dtype of the weights")
    measure.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda")
    measure.add_argument(
        "--random-twin", action="store_true", help="measure the seeded random-init twin instead"
    )
    measure.add_argument("--seed", type=int, default=0, help="seed of the random twin")
    measure.add_argument("--threads", type=int, default=None, help="torch threads")
    check = commands.add_parser(
        "check-config",
        help="validate a workflow config (schema and every cross-field check), no job run",
        description="Validate FILE alone as `snakemake --configfile FILE` would, before any job.",
    )
    check.add_argument("file", metavar="FILE", type=Path, help="a config YAML file")
    check.add_argument(
        "--workflow-dir",
        type=Path,
        default=None,
        help="the workflow's folder (schemas/, resources/); default: found from this package",
    )
    check.add_argument(
        "--profile",
        choices=("slurm",),
        default=None,
        help="also run the Slurm checks of `snakemake --profile slurm` against sinfo",
    )
    plan = commands.add_parser(
        "plan",
        help="estimated GPU-hours, peak GPU memory and output size of a config's jobs",
        description=(
            "Cost of every extract and evaluate job of a workflow config: hours (all steps "
            "and shards), hours of the longest job, peak device memory against the model's "
            "gpu_mem_gb, output size, and the totals. Exits 1 when a GPU job does not fit "
            "(the workflow refuses such a config before any job). Rates: see "
            "blockcoupling.pipeline.cost (CPU calibrated on a 2-core machine; GPU on an H200)."
        ),
    )
    plan.add_argument("--configfile", type=Path, required=True, metavar="FILE", help="config")
    plan.add_argument(
        "--gpu-tflops", type=float, default=None, help="achieved float32 TFLOP/s of your GPUs"
    )
    plan.add_argument(
        "--gpu-rates",
        type=Path,
        default=None,
        help="a rates file bench/gpu_acceptance.py wrote on your GPU (default: the packaged one)",
    )
    plan.add_argument(
        "--time-limit",
        default=None,
        metavar="LIMIT",
        help="a Slurm partition's time limit (minutes, HH:MM:SS or D-HH:MM:SS): shards sized to "
        "it as the workflow does on Slurm, and each job's requested runtime",
    )
    plan.add_argument("--csv", type=Path, default=None, help="also write the rows as CSV")
    plan.add_argument("--workflow-dir", type=Path, default=None, help="as for check-config")
    fetch = commands.add_parser(
        "fetch",
        help="fetch one hub model revision into its folder of the hub cache, with its manifest",
        description=(
            "Fetch exactly one model revision (config, tokenizer, weights) into FOLDER, a "
            "revision folder of the hub cache (HUB_CACHE/models/REPO/REVISION or "
            "HUB_CACHE/checkpoints/REPO/REVISION), and write its manifest beside the others, "
            "as the workflow's fetch rules do; what a job's 'not in the hub cache' line names."
        ),
    )
    fetch.add_argument("repo", metavar="REPO", help="hub repo id, e.g. EleutherAI/pythia-160m")
    fetch.add_argument("revision", metavar="REVISION", help="branch, tag or commit, e.g. main")
    fetch.add_argument("folder", metavar="FOLDER", type=Path, help="its folder in the cache")
    verify = commands.add_parser(
        "verify",
        help="check every result against the content hash its job recorded",
        description=(
            "Name every file under FOLDER (a workflow's results/) that differs from the hash "
            "recorded when its job wrote it, has no record or an unreadable one, does not open "
            "(NetCDF, CSV, PNG, PDF, JSON, safetensors) or is a temp file left by an "
            "interrupted write; every symlink; and, against the run record (every job adds "
            "its outputs to it), a result deleted together with its record or a record added "
            "by hand. Exits 1 when any does."
        ),
    )
    verify.add_argument("folder", metavar="FOLDER", type=Path, help="a results folder")
    claims = commands.add_parser(
        "claims",
        help="render a run's claims table into the README",
        description=(
            "Replace the README's block between <!-- claims:start --> and <!-- claims:end --> "
            "with RESULTS/stats/claims.md, as the run wrote it (stamped with its commit)."
        ),
    )
    claims.add_argument("results", type=Path, metavar="RESULTS", help="a run's results folder")
    claims.add_argument("--readme", type=Path, required=True, metavar="FILE", help="README")
    docs = commands.add_parser(
        "docs",
        help="render the measure registry's table into the docs",
        description=(
            "Replace FILE's block between <!-- measures:start --> and <!-- measures:end --> with "
            "the table of every registered per-pair measure (blockcoupling.coupling.registry)."
        ),
    )
    docs.add_argument("file", type=Path, metavar="FILE", help="docs/datasets.md")
    return parser


def render_claims(results: Path, readme: Path) -> str:
    """Write ``results``/stats/claims.md into ``readme`` between the claims markers."""
    from blockcoupling.stats.claims import END, START

    source = results / "stats" / "claims.md"
    if not source.is_file():
        raise ValueError(f"{source} not found: run the workflow's stats_claims rule first")
    _rewrite_block(readme, START, END, source.read_text(encoding="utf-8"))
    return f"{readme}: claims table from {source}"


def render_docs(file: Path) -> str:
    """Write the measure registry's table into ``file`` between the measure markers."""
    from blockcoupling.coupling.registry import DOCS_END, DOCS_START, docs_table

    _rewrite_block(file, DOCS_START, DOCS_END, docs_table() + "\n")
    return f"{file}: measure table from blockcoupling.coupling.registry"


def _rewrite_block(file: Path, start: str, end: str, body: str) -> None:
    """Replace ``file``'s block between ``start`` and ``end`` by ``body``, atomically: a
    symlink's target is rewritten (the link kept) with its own permissions; a read-only file is
    refused, untouched.
    """
    from blockcoupling.files.io import replace_marked_block, write_text

    target = file.resolve()
    if target.is_dir():
        raise ValueError(f"{file} is a folder: name the file that holds the markers {start}")
    if not target.is_file():
        raise ValueError(f"{file} does not exist: name the file that holds the markers {start}")
    mode = stat.S_IMODE(target.stat().st_mode)
    if not mode & stat.S_IWUSR:
        raise ValueError(f"{file} is read-only: make it writable (chmod u+w {file}) first")
    try:
        text = target.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{file} is not UTF-8 text (byte {error.start}): re-save it as UTF-8, then rerun"
        ) from None
    write_text(target, replace_marked_block(text, file, start, end, body))
    target.chmod(mode)  # its own permissions, not the umask's


def _workflow_dir(given: Path | None) -> Path:
    candidates = [given] if given else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for folder in candidates:
        if folder is not None and (folder / "schemas" / "config.schema.yaml").is_file():
            return folder
    raise ValueError("cannot find schemas/config.schema.yaml; give --workflow-dir")


def load_plan(file: Path, workflow_dir: Path | None = None, check_memory: bool = True) -> Any:
    """The workflow's ``Plan`` of a config file: schema defaults and every check applied."""
    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.schema_check import validate_config

    folder = _workflow_dir(workflow_dir)
    try:
        config = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{file}: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file}: not a YAML mapping")
    try:
        validate_config(config, folder / "schemas" / "config.schema.yaml")
    except ValueError as error:
        raise ValueError(f"{file}: {error}") from None
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
    file: Path, workflow_dir: Path | None = None, profile: str | None = None
) -> str:
    """Validate a config file as the workflow does; return a one-paragraph summary and a line
    per warning (K above d/8).
    """
    from blockcoupling.pipeline.k_warnings import k_warnings

    plan = load_plan(file, workflow_dir)
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
        f"{file}: ok. {len(plan.models)} models ({len(plan.cross_model)} cross-model, "
        f"{len(plan.checkpoint_models)} checkpoint suites), {jobs} extract jobs, "
        f"{len(plan.train_runs)} training runs, prompt set {plan.prompt_set!r}, statistics at "
        + ", ".join(f"{k}={v}" for k, v in plan.selection.items())
        + vit
        + (check_slurm(plan) if profile == "slurm" else "")
        + "".join(f"\nwarning: {line}" for line in k_warnings(plan))
    )


def plan_report(args: argparse.Namespace) -> tuple[str, bool]:
    """The cost table of a config's extract/evaluate jobs, and whether every GPU job fits."""
    from dataclasses import replace

    from blockcoupling.pipeline import cost, hub_volume, plan_table, slurm_sizing

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
    plan = load_plan(args.configfile, args.workflow_dir, check_memory=False)
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
        f"{args.configfile}: {len(plan.models)} models, {plan.n_prompts} prompts, "
        f"max_tokens {plan.measure.max_tokens} (null counts as "
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
    return header + "\n" + table + "\n" + hub, all(r.fits for r in rows if r.on_gpu)


def _check_measure_flags(args: argparse.Namespace) -> None:
    """The flags of ``measure`` that need no model, checked before it loads (errors name them)."""
    if args.k < 1:
        raise ValueError(f"--k {args.k}: K must be >= 1")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens {args.max_tokens}: keep at least 2 tokens")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: give at least 1")


def measure_source(args: argparse.Namespace) -> str:
    """Load the model (or its twin), measure the prompts, return the summary table."""
    _check_measure_flags(args)
    from blockcoupling.runtime import isa

    isa.pin()  # the workflow jobs' code path (AVX2), set before torch loads
    import torch

    from blockcoupling.runtime import blas

    blas.route_if_pinned()  # and their matmuls

    from blockcoupling.coupling.finite import require_rank
    from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset
    from blockcoupling.jacobians.extract import MeasureConfig, measure
    from blockcoupling.lm.models import LoadOptions, load_model, load_random_twin
    from blockcoupling.lm.sources import parse_source
    from blockcoupling.runtime.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    source = parse_source(source_spec(args.source))
    if source.kind == "assembled":
        raise ValueError("package:PACKAGE (assembled) needs a file: use package:PACKAGE:FILE")
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        raise ValueError(f"--{error}; give --device cpu or auto") from None  # "--device 'x'..."
    options = LoadOptions(dtype=args.dtype, device=device)
    if args.random_twin:
        model, tokenizer = load_random_twin(source, args.seed, options)
    else:
        model, tokenizer = load_model(source, options)
    width = getattr(getattr(model, "config", None), "hidden_size", None)
    if isinstance(width, int) and args.k > width:
        raise ValueError(f"--k {args.k} exceeds the model's hidden size {width}; give --k {width}")
    config = MeasureConfig(k_max=args.k, max_tokens=args.max_tokens, variants=(args.variant,))
    data = measure(model, tokenizer, args.prompts, config, attrs={"model": args.source})
    width = int(data["depth"].attrs.get("hidden_size", width or data["depth"].sizes["rank"]))
    require_rank(data["depth"]["singular_values"], args.k, width, source.describe())
    metrics = coupling_dataset(data["depth"], MetricConfig(ks=(args.k,), readings=(args.reading,)))
    at = {"k": args.k, "reading": args.reading, "variant": args.variant, "norm": "p"}
    coupling = metrics["coupling"].sel(at)
    adjacent = metrics["adjacent_coupling"].sel(at)
    twin = f" (random twin, seed {args.seed})" if args.random_twin else ""
    lines = [
        f"{source.describe()}{twin}: "
        f"{data['depth'].sizes['layer']} blocks; m_{args.k} {args.reading}/{args.variant}, p=2",
        f"{'prompt':<10} {'tokens':>6} {'coupling':>9} {'adjacent':>9}",
    ]
    for i, prompt in enumerate(coupling["prompt"].values):
        lines.append(
            f"{prompt:<10} {int(data['depth']['n_tokens'][i]):>6} "
            f"{float(coupling[i]):>9.4f} {float(adjacent[i]):>9.4f}"
        )
    lines.append(
        f"{'mean':<10} {'':>6} {float(coupling.mean()):>9.4f} {float(adjacent.mean()):>9.4f}"
    )
    lines.append("coupling = minus the mean m_K over layer pairs l != l' (higher: more coupled)")
    return "\n".join(lines)


def fetch_revision(repo: str, revision: str, folder: Path) -> str:
    """Fetch one model revision into ``folder`` (a revision folder of the hub cache) and write
    its manifest where the fetch rules keep it; returns a one-line summary.
    """
    from blockcoupling.lm import hub
    from blockcoupling.lm.hub_names import check_fetch_folder
    from blockcoupling.pipeline.hub_settings import HubSettings

    hub.go_online()  # before check_fetch_folder imports huggingface_hub
    cache, kind, _ = check_fetch_folder(folder, repo, revision)
    manifest = hub.fetch_model(repo, revision, folder)
    target = HubSettings(cache_dir=str(cache)).manifest(kind, repo, revision)
    hub.write_manifest(manifest, target)
    size = manifest["bytes"] / 1e9
    return f"{repo}@{revision}: {len(manifest['files'])} files, {size:.2f} GB in {folder}"


def verify_results(folder: Path) -> int:
    """Print each problem of ``folder`` (see ``manifest.verify``) and a summary; 1 if any."""
    from blockcoupling.files import manifest

    problems = manifest.verify(folder)
    for line in problems:
        print(line)
    if problems:
        print(f"{len(problems)} problem(s) in {folder}: it fails verification", file=sys.stderr)
        return 1
    print(f"{folder}: every result matches its recorded hash and opens")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``blockcoupling`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-config":
            print(check_config_file(args.file, args.workflow_dir, args.profile))
        elif args.command == "claims":
            print(render_claims(args.results, args.readme))
        elif args.command == "docs":
            print(render_docs(args.file))
        elif args.command == "plan":
            report, fits = plan_report(args)
            print(report)
            return 0 if fits else 1
        elif args.command == "fetch":
            print(fetch_revision(args.repo, args.revision, args.folder))
        elif args.command == "verify":
            return verify_results(args.folder)
        else:
            print(measure_source(args))
    except (ValueError, OSError) as error:
        print(f"blockcoupling {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
