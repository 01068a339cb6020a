"""The ViT sub-DAG end to end on the smoke config's 2 x 1 x 1 grid: every ViT rule runs, the
combined file has the grid dims, and reruns touch exactly what changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from conftest import REPO, copy_run, job_stats, snakemake

from blockcoupling.files.io import read_netcdf

pytestmark = pytest.mark.slow

TARGETS = [
    "results/vit/combined.nc",
    "results/stats/vit_models.csv",
    "results/figures/vit_coupling_vs_sd.png",
    "results/figures/vit_coupling_vs_accuracy.png",
]


def planned(folder: Path) -> dict[str, int]:
    """Rule -> job count of a dry run of the ViT targets."""
    result = snakemake(folder, "-n", *TARGETS)
    assert result.returncode == 0, result.stdout + result.stderr
    return job_stats(result.stdout + result.stderr)


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("vit")
    shutil.copy(REPO / "config" / "smoke.yaml", folder / "config.yaml")
    result = snakemake(folder, "--cores", "2", *TARGETS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert planned(folder) == {}
    return folder


def variant(done: Path, tmp_path: Path, change) -> Path:
    """A copy of the finished run whose vit section ``change`` edits."""
    folder = copy_run(done, tmp_path)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    change(config["vit"])
    # in the config's own key order: the ViT figures quote claims.csv, so the language-model
    # rules are upstream too, and a reordered training spec reads as a changed param
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return folder


def test_every_vit_output_is_made(done: Path) -> None:
    for path in (
        "results/vit/data/digits.npz",
        "results/vit/train/sd0.2/wd0.05/seed0/model.safetensors",
        "results/vit/train/sd0/wd0.05/seed0/history.csv",
        "results/vit/extract/sd0.2/wd0.05/seed0/tokens.nc",
        "results/stats/vit_coupling_vs_sd.csv",
        "results/stats/vit_sd_trend.csv",
        "results/stats/vit_coupling_vs_accuracy.csv",
        "logs/vit/train/sd0.2_wd0.05_seed0.log",
        "benchmarks/vit/extract/sd0_wd0.05_seed0.tsv",
        *TARGETS,
    ):
        assert (done / path).is_file(), path
    combined = read_netcdf(done / "results/vit/combined.nc")
    assert dict(combined["test_accuracy"].sizes) == {"sd": 2, "wd": 1, "seed": 1}
    assert {"sd", "wd", "seed", "image", "k"} <= set(combined["coupling"].dims)
    assert combined["image"].size == 4 and list(combined["k"].values) == [2, 4]


def test_every_vit_netcdf_has_cf_labels_and_provenance(done: Path) -> None:
    from blockcoupling.files.cf import check_files

    files, checked, problems = check_files(done / "results" / "vit")
    assert files >= 9 and not problems, problems[:10]


def test_run_only_settings_rerun_nothing(done: Path, tmp_path: Path) -> None:
    """The device, data folder and chunk size are run settings; threads are not (the numbers
    depend on them: test_threads_rerun_training_and_extraction)."""

    def speed(vit: dict) -> None:
        vit.update(device="cpu", data_dir="elsewhere")
        vit["extract"]["chunk_size"] = 3

    assert planned(variant(done, tmp_path, speed)) == {}


def test_threads_rerun_training_and_extraction(done: Path, tmp_path: Path) -> None:
    jobs = planned(variant(done, tmp_path, lambda vit: vit.update(threads=2)))
    assert jobs.get("vit_train") == 2 and jobs.get("vit_extract") == 2, jobs  # both points


def test_ks_rerun_the_extraction_and_combination_not_training(done: Path, tmp_path: Path) -> None:
    """The sweep stores m_K's numerator at vit.ks alone (the outputs its statistics read), so a
    new K re-extracts the trained ViTs; it never retrains them."""
    jobs = planned(variant(done, tmp_path, lambda vit: vit.update(ks=[1, 2, 4])))
    assert jobs.get("vit_combine") == 1 and jobs.get("vit_extract") and "vit_train" not in jobs


def test_a_grid_point_added_trains_only_it(done: Path, tmp_path: Path) -> None:
    jobs = planned(variant(done, tmp_path, lambda vit: vit["grid"].update(seeds=[0, 1])))
    assert jobs.get("vit_train") == 2 and jobs.get("vit_extract") == 2 and "vit_data" not in jobs
