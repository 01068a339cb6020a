"""The cost planner: how estimates scale, the memory refusal before any job, the CLI."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SCHEMA
from snakemake.utils import validate

from blockcoupling import cli
from blockcoupling.jacobians.options import ExtractConfig, SVDOptions
from blockcoupling.pipeline import cost, hub_volume, plan_table
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.schema_check import validate_config

SHAPE = cost.Shape(n_layers=32, d_model=4096, params=7e9, bytes_per_param=2)
EXTRACT = ExtractConfig(  # chunk_size None: options.auto_chunk, a batch's activations < 1 GiB
    max_tokens=64, k_max=50, variants=("ujv", "vju"), token_layers=(), spectra_prompts=0
)


def paper(**extract) -> dict:
    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config["extract"].update(extract)
    validate(config, SCHEMA)
    return config


def test_extraction_time_is_linear_in_prompts_and_token_families_cubic_in_tokens() -> None:
    one = cost.extract_cost(SHAPE, EXTRACT, 10, cost.GPU)
    two = cost.extract_cost(SHAPE, EXTRACT, 20, cost.GPU)
    for part, seconds in one["seconds"].items():
        assert two["seconds"][part] == pytest.approx(2 * seconds, rel=1e-9), part
    tokens = replace(EXTRACT, token_layers=(-1,), token_prompts=1)
    short = cost.extract_cost(SHAPE, replace(tokens, token_max_tokens=16), 1, cost.GPU)
    long = cost.extract_cost(SHAPE, replace(tokens, token_max_tokens=32), 1, cost.GPU)
    assert long["seconds"]["token statistics"] == pytest.approx(
        8 * short["seconds"]["token statistics"]
    )
    assert long["output"] > 7 * short["output"] - 8 * one["output"]


def test_top_k_svd_is_cheaper_than_dense_at_paper_width() -> None:
    dense = cost.extract_cost(
        SHAPE, replace(EXTRACT, svd=SVDOptions(method="dense")), 100, cost.CPU
    )
    topk = cost.extract_cost(SHAPE, replace(EXTRACT, svd=SVDOptions(method="topk")), 100, cost.CPU)
    # measured at d=4096, one thread: 13.2 s dense, 3.4 s for the top 50
    assert topk["seconds"]["depth svd"] < dense["seconds"]["depth svd"] / 3
    # the memory of a dense SVD's U and V is not needed either
    assert topk["peak"] < dense["peak"]


def test_peak_memory_holds_the_weights_one_block_copy_and_the_depth_stack() -> None:
    peak = cost.extract_cost(SHAPE, replace(EXTRACT, svd=SVDOptions(method="topk")), 1, cost.GPU)[
        "peak"
    ]
    weights = SHAPE.params * 2
    stack = SHAPE.n_layers * SHAPE.d_model**2 * 4
    assert weights + stack < peak < weights + stack + SHAPE.block_params * 4 + 2e9


def test_shards_shorten_the_longest_job_not_the_total() -> None:
    def costs(**extract) -> dict[str, cost.JobCost]:  # Jacobians on every prompt
        extract = {"jacobian_prompts": None, "token_prompts": 20, **extract}
        plan = check_config(paper(**extract), REPO, check_memory=False)
        return {r.model: r for r in cost.plan_costs(plan)}

    whole, split = costs(prompts_per_shard=None), costs(prompts_per_shard=100)
    row, part = whole["llama-3-8b"], split["llama-3-8b"]
    assert part.jobs == (12 + 20) * row.jobs  # 12 shards and 20 token-family jobs per step
    overheads = (part.jobs - row.jobs) * cost.GPU.overhead  # the same work, more job starts
    assert part.seconds - overheads == pytest.approx(row.seconds, rel=1e-9)
    assert part.job_seconds < row.job_seconds / 8
    depth_only = costs(prompts_per_shard=100, token_prompts=0)["llama-3-8b"]
    one_job = costs(prompts_per_shard=None, token_prompts=0)["llama-3-8b"]
    assert depth_only.jobs == 12 * one_job.jobs
    assert depth_only.job_seconds < one_job.job_seconds / 6  # 12 shards, plus overheads


def test_a_job_over_its_gpu_memory_is_refused_before_any_job() -> None:
    config = paper()
    config["models"]["pythia-12b-steps"]["resources"]["gpu_mem_gb"] = 16
    with pytest.raises(ConfigError, match=r"models.pythia-12b-steps: one extract job needs"):
        check_config(copy.deepcopy(config), REPO)
    plan = check_config(config, REPO, check_memory=False)  # the planner still reports it
    row = next(r for r in cost.plan_costs(plan) if r.model == "pythia-12b-steps")
    assert not row.fits and "OVER gpu_mem_gb" in plan_table.plan_table([row])


def test_cli_plan_prints_the_totals_and_fails_when_a_job_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["plan", "--configfile", str(REPO / "config" / "paper.yaml")]) == 0
    out = capsys.readouterr().out
    assert "GPU-hours" in out and "llama-3-70b" in out and "pythia-12b-steps" in out
    assert "GB to download" in out and "peak cache" in out and "vit_train" in out
    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config["models"]["pythia-12b-steps"]["resources"]["gpu_mem_gb"] = 16
    config["model_table"] = str(REPO / config["model_table"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    csv = tmp_path / "plan.csv"
    assert cli.main(["plan", "--configfile", str(bad), "--csv", str(csv)]) == 1
    assert "OVER gpu_mem_gb" in capsys.readouterr().out
    assert "pythia-12b-steps" in csv.read_text()


def test_jacobians_scale_with_jacobian_prompts_and_forward_passes_with_all_prompts() -> None:
    every = cost.extract_cost(SHAPE, EXTRACT, 1200, cost.GPU)
    subset = cost.extract_cost(SHAPE, replace(EXTRACT, jacobian_prompts=200), 1200, cost.GPU)
    for part in ("depth jacobians", "depth svd", "depth statistics"):
        assert subset["seconds"][part] == pytest.approx(every["seconds"][part] / 6), part
    assert subset["seconds"]["forward passes"] == every["seconds"]["forward passes"]


def test_the_paper_suite_fits_1000_gpu_hours_with_every_measure() -> None:
    plan = check_config(paper(), REPO, check_memory=False)
    rows = cost.plan_costs(plan)
    assert sum(r.seconds for r in rows if r.on_gpu) / 3600 <= 1000
    assert plan.extraction.jacobian_prompts and plan.extraction.token_prompts > 0
    assert all(r.on_gpu and r.fits for r in rows)


def test_a_model_on_the_cpu_is_a_cpu_job_for_the_planner_and_the_memory_check() -> None:
    config = paper()
    config["models"]["pythia-12b-steps"]["load"] = {"device": "cpu"}
    config["models"]["pythia-12b-steps"]["resources"]["gpu_mem_gb"] = 16  # a GPU job: too small
    plan = check_config(config, REPO)  # not refused: it runs on the CPU
    row = next(r for r in cost.plan_costs(plan) if r.model == "pythia-12b-steps")
    assert not plan.on_gpu("pythia-12b-steps") and not row.on_gpu
    assert plan.on_gpu("pythia-6.9b-steps")  # device auto with gpu_mem_gb


def test_hub_volume_counts_each_revision_once_and_the_cache_bound() -> None:
    config = paper()
    plan = check_config(copy.deepcopy(config), REPO, check_memory=False)
    download, peak, revisions = hub_volume.hub_volume(plan)
    suites = [e for e in plan.models.values() if e.is_checkpoint_suite]
    others = [e for e in plan.models.values() if not e.is_checkpoint_suite]
    assert revisions == len(others) + sum(len(e.steps) for e in suites)  # a twin needs no weights
    weights = {
        e.name: e.meta["params"] * hub_volume.HUB_BYTES_PER_PARAM for e in plan.models.values()
    }
    suite_bytes = sum(weights[e.name] * len(e.steps) for e in suites)
    other_bytes = sum(weights[e.name] for e in others)
    assert download == pytest.approx(suite_bytes + other_bytes + hub_volume.VIT_DATA_BYTES)
    largest = max(weights[e.name] for e in suites)
    default = plan.hub.max_revisions  # the schema's bound
    assert peak == pytest.approx(other_bytes + default * largest + hub_volume.VIT_DATA_BYTES)
    config["hub"] = {"max_revisions": 2}
    plan = check_config(config, REPO, check_memory=False)
    bounded = hub_volume.hub_volume(plan)[1]
    assert bounded == pytest.approx(other_bytes + 2 * largest + hub_volume.VIT_DATA_BYTES)
    config["hub"] = {"max_revisions": "all"}  # fetched ahead: every revision on disk at once
    validate_config(config, REPO / "schemas" / "config.schema.yaml")
    plan = check_config(config, REPO, check_memory=False)
    assert hub_volume.hub_volume(plan)[1] == pytest.approx(download)


def test_gpu_rates_are_read_from_the_file_the_acceptance_run_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The packaged rates are GPU's; a written file reads back equal; a broken one is one line
    naming the file; ``plan --gpu-rates`` costs the paper suite with it."""
    assert cost.load_rates(cost.GPU_RATES) == cost.GPU
    faster = replace(cost.GPU, name="twice the matmul", matmul=2 * cost.GPU.matmul)
    path = tmp_path / "rates.json"
    cost.write_rates(faster, path, {"device": "test"})
    assert cost.load_rates(path) == faster
    paper_yaml = str(REPO / "config" / "paper.yaml")
    hours = []
    for extra in ([], ["--gpu-rates", str(path)]):
        assert cli.main(["plan", "--configfile", paper_yaml, *extra]) == 0
        total = next(line for line in capsys.readouterr().out.splitlines() if "total:" in line)
        hours.append(float(total.split()[1].replace(",", "")))
    assert hours[1] < hours[0]
    for text, message in (
        ("{}", "not a rates file"),
        ('{"name": "x", "matmul": 0, "dense_svd": 1, "svdvals": 1, "topk": 1, "overhead": 1}',
         "matmul = 0.0; every rate must be above 0"),
    ):  # fmt: skip
        path.write_text(text)
        with pytest.raises(ValueError, match=f"{path}: {message}"):
            cost.load_rates(path)
