"""Jobs check their inputs before reading them: a recorded input that changed since its job
wrote it stops the next job in one line naming the file, the rule that wrote it and the command
that makes it again; NaN/Inf values a NetCDF file's writer did not declare stop any reader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr

from blockcoupling.files import io, manifest
from blockcoupling.runtime.runner import run_script


def job(rule: str, inputs: list[Path], outputs: list[Path], main) -> None:
    """A workflow job of ``rule`` through run_script (as scripts/*.py run)."""
    sm = SimpleNamespace(
        log=[], input=inputs, output=outputs, rule=rule, threads=1, params=SimpleNamespace()
    )
    run_script(sm, main)


@pytest.fixture
def spectra(tmp_path: Path) -> Path:
    """results/extract/m/final/spectra.nc as the extract job writes and records it."""
    path = tmp_path / "results" / "extract" / "m" / "final" / "spectra.nc"
    data = xr.Dataset({"singular_values": (("layer", "rank"), np.arange(1.0, 7.0).reshape(2, 3))})
    job("extract", [], [path], lambda sm: io.write_netcdf(data, sm.output[0]))
    return path


def nan_into(path: Path) -> None:
    """One value of ``path`` set to NaN, written back as a hand edit would (attrs kept)."""
    with xr.open_dataset(path, engine="netcdf4") as opened:
        data = opened.load()
    data["singular_values"][0, 0] = np.nan
    data.to_netcdf(path, engine="netcdf4")


def combine(spectra: Path, capsys: pytest.CaptureFixture) -> tuple[list[str], list[str]]:
    """The combine job over ``spectra``: (its stderr lines, what its main did)."""
    out = spectra.parents[3] / "combined" / "spectra.nc"
    ran = []

    def main(sm: SimpleNamespace) -> None:
        ran.append("main")
        io.write_netcdf(io.read_netcdf(sm.input[0]), sm.output[0])

    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        job("combine_models", [spectra], [out], main)
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    return [line for line in lines if " INFO " not in line], ran


def test_a_changed_recorded_input_stops_the_job_before_it_reads_it(
    spectra: Path, capsys: pytest.CaptureFixture
) -> None:
    nan_into(spectra)
    lines, ran = combine(spectra, capsys)
    assert ran == []  # stopped before main
    [line] = lines
    assert f"ERROR combine_models: input {spectra}: it differs from its record " in line
    assert "(written by rule extract)" in line
    assert f"make it again: snakemake --cores 1 --force {spectra}" in line


def test_an_input_changed_with_its_record_stops_at_its_undeclared_nan(
    spectra: Path, capsys: pytest.CaptureFixture
) -> None:
    """The record rewritten too: the NetCDF's own declaration of its NaN count still differs."""
    nan_into(spectra)
    manifest.record([spectra])
    lines, ran = combine(spectra, capsys)
    assert ran == ["main"]
    [line] = lines
    assert line.endswith(
        f"ERROR combine_models: {spectra} holds 1 non-finite (NaN/Inf) values (in "
        "singular_values) where it declares 0: it changed after its job wrote it, or an older "
        "version wrote it; delete it and run snakemake again to rebuild it"
    )


def test_declared_nan_read_back_and_undeclared_refused(tmp_path: Path) -> None:
    """An outer join's NaN (a model with fewer layers) are the writer's own: they read back."""
    padded = xr.Dataset({"lss": ("layer", [1.0, 2.0, np.nan])})
    path = io.write_netcdf(padded, tmp_path / "combined.nc")
    back = io.read_netcdf(path)
    assert int(np.isnan(back["lss"].values).sum()) == 1
    assert io.NONFINITE not in back.attrs  # the declaration is the file's, not the data's
    padded.to_netcdf(tmp_path / "foreign.nc", engine="netcdf4")  # a writer that declares none
    with pytest.raises(ValueError, match=r"holds 1 non-finite .* where it declares none"):
        io.read_netcdf(tmp_path / "foreign.nc")


def test_a_changed_file_of_an_input_folder_stops_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "results" / "models" / "m" / "converted"

    def convert(sm: SimpleNamespace) -> None:
        Path(sm.output[0]).mkdir(parents=True)
        (Path(sm.output[0]) / "config.json").write_text("{}")

    job("convert_gguf", [], [folder], convert)
    (folder / "config.json").write_text('{"n_layer": 99}')
    capsys.readouterr()
    with pytest.raises(SystemExit):
        job("extract", [folder], [tmp_path / "results" / "x.nc"], lambda sm: None)
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"input {folder / 'config.json'}: it differs from its record" in line
    assert "(written by rule convert_gguf)" in line
