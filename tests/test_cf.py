"""CF-style labels: every NetCDF variable and coordinate has long_name and units, every file
Conventions and its provenance: here the table and the writer; over finished runs in
test_workflow.py and test_vit_workflow.py, and in CI on the smoke run's files (.ci/run:
python -m blockcoupling.files.cf "$smoke/results")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from blockcoupling.coupling.registry import MEASURES
from blockcoupling.files.cf import CONVENTIONS, attributes, check_files, label
from blockcoupling.files.io import command_line, read_netcdf, write_netcdf


def small() -> xr.Dataset:
    return xr.Dataset(
        {
            "depth_mis": (("k", "prompt"), np.ones((2, 3))),
            "self_diag": (("prompt", "rank"), np.ones((3, 2))),
            "coupling": (("k", "prompt"), np.ones((2, 3)), {"unit": "dimensionless (m_K)"}),
            "bits_per_byte": ((), 2.5, {"long_name": "own name", "units": "bit/byte"}),
        },
        coords={"k": [4, 8], "prompt": ["arc-0001", "mmlu-0001", "x"], "rank": [0, 1]},
    )


def test_every_variable_and_coordinate_gets_long_name_and_units() -> None:
    labelled = label(small())
    for name, variable in labelled.variables.items():
        assert variable.attrs["long_name"] and variable.attrs["units"], name
    assert labelled["depth_mis"].attrs["units"] == "1"
    assert labelled["depth_mis"].attrs["long_name"].startswith("depth-wise: m_K(J_i, J_j)")
    assert labelled["self_diag"].attrs["long_name"].startswith("self token family: diagonal")
    assert labelled["k"].attrs["long_name"] == "number K of top singular triplets"
    assert labelled.attrs["Conventions"] == CONVENTIONS
    # a builder's own labels stay; the registry's prose unit becomes a comment
    assert labelled["bits_per_byte"].attrs == {"long_name": "own name", "units": "bit/byte"}
    assert labelled["coupling"].attrs["comment"] == "dimensionless (m_K)"
    assert "unit" not in labelled["coupling"].attrs
    assert "long_name" not in small()["k"].attrs  # the input is not changed


def test_every_registered_measure_is_named_in_every_family() -> None:
    for family in ("depth", "self", "fixed_in", "fixed_out"):
        for measure in MEASURES:
            assert attributes(f"{family}_{measure.name}") is not None
    assert attributes("tokens_mis") is None and attributes("nonsense") is None


def test_an_unknown_variable_stops_the_write_naming_it(tmp_path: Path) -> None:
    data = small().assign(mystery=(("k",), [1.0, 2.0]))
    with pytest.raises(ValueError, match=r"'mystery' has no long_name/units: add it to"):
        write_netcdf(data, tmp_path / "x.nc")
    assert not list(tmp_path.iterdir())


def test_written_files_carry_the_labels_and_the_provenance(tmp_path: Path) -> None:
    write_netcdf(small(), tmp_path / "x.nc")
    with xr.open_dataset(tmp_path / "x.nc") as opened:
        assert opened.attrs["Conventions"] == CONVENTIONS
        assert {"git_commit", "blockcoupling_version", "torch_version"} <= set(opened.attrs)
        assert opened["depth_mis"].attrs["units"] == "1"
        assert opened["prompt"].attrs["long_name"] == "prompt id"
    again = tmp_path / "y.nc"  # re-written (metrics from extract files): labels kept, not doubled
    write_netcdf(read_netcdf(tmp_path / "x.nc"), again)
    assert check_files(tmp_path) == (2, 2 * 7, [])


def test_check_files_names_what_is_missing(tmp_path: Path) -> None:
    small().to_netcdf(tmp_path / "bare.nc")
    files, checked, problems = check_files(tmp_path)
    assert (files, checked) == (1, 7)
    assert f"{tmp_path / 'bare.nc'}: no Conventions attribute" in problems
    assert f"{tmp_path / 'bare.nc'}: depth_mis has no long_name/units" in problems
    assert not any("bits_per_byte" in problem for problem in problems)


def test_files_carry_title_history_and_source(tmp_path: Path) -> None:
    """Every written file has the CF global attributes: a title naming what it holds, a source
    naming the package, and a history line with the command and the commit; a file written from
    one read keeps the earlier line. (They had none.)"""
    path = write_netcdf(small(), tmp_path / "coupling.nc")
    written = read_netcdf(path)
    assert written.attrs["title"].startswith("block coupling m_K")
    assert written.attrs["source"].startswith("blockcoupling ")
    history = written.attrs["history"]
    assert f"blockcoupling commit {written.attrs['git_commit']}" in history, history
    again = read_netcdf(write_netcdf(written, tmp_path / "other" / "trajectories.nc"))
    assert again.attrs["title"] == written.attrs["title"]  # the file's own title stays
    assert again.attrs["history"].startswith(history)
    assert check_files(tmp_path)[2] == []
    bare = tmp_path / "bare.nc"
    label(small()).to_netcdf(bare)
    assert any("no title attribute" in p for p in check_files(tmp_path)[2])


def test_history_names_a_snakemake_jobs_script_not_its_temporary_copy() -> None:
    job = ["/run/.snakemake/scripts/tmpa1b2c3d4.figure.py"]
    assert command_line(job) == "Snakemake job: scripts/figure.py"
    assert command_line(["/x/.venv/bin/blockcoupling", "measure", "gpt2", "a b"]) == (
        "blockcoupling measure gpt2 'a b'"
    )


def test_a_renamed_coordinate_gets_its_own_long_name() -> None:
    """vit/combined.nc renames the prompt coordinate to image: it said "prompt id"."""
    renamed = label(small()).rename(prompt="image")
    assert renamed["image"].attrs["long_name"] == "prompt id"  # what the rename carries
    assert label(renamed)["image"].attrs["long_name"] == "test image id"


def test_a_measured_models_source_is_kept(tmp_path: Path) -> None:
    """The CF ``source`` of a file that names its model's source (``hub:REPO@REVISION``) stays
    that: the global attribute had replaced it with the package's name, so a step's depth file
    no longer said which checkpoint revision it measured."""
    data = small()
    data.attrs["source"] = "hub:tiny-org/neox@step16"
    written = read_netcdf(write_netcdf(data, tmp_path / "depth.nc"))
    assert written.attrs["source"] == "hub:tiny-org/neox@step16"
    assert check_files(tmp_path)[2] == []
