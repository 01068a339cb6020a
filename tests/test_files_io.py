"""Result files as files.io writes and reads them: atomic writes under the umask, a truncated NetCDF
named with its remedy, strings read from files written untruncated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from blockcoupling.files import io


def test_atomic_write_respects_the_umask(tmp_path: Path) -> None:
    import os

    previous = os.umask(0o027)
    try:
        path = io.write_text(tmp_path / "a" / "b.txt", "hello")
    finally:
        os.umask(previous)
    assert path.read_text() == "hello" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in path.parent.iterdir()] == ["b.txt"]  # no temp file left


def test_a_truncated_netcdf_names_the_file_and_the_remedy(tmp_path: Path) -> None:
    path = io.write_netcdf(xr.Dataset({"lss": ("token", np.arange(1000.0))}), tmp_path / "x.nc")
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"x.nc cannot be read .*delete it and run snakemake"):
        io.read_netcdf(path)


def test_strings_read_from_files_are_not_written_truncated(tmp_path: Path) -> None:
    """A string coord read back with 8 characters, concatenated with longer ones, is written
    whole (the encoding inherited from the file is dropped)."""
    for name, prompt in (("a", "arc-0001"), ("b", "mmlu-0001")):
        data = xr.Dataset({"lss": ("prompt", [1.0])}, coords={"prompt": np.array([prompt])})
        io.write_netcdf(data, tmp_path / f"{name}.nc")
    parts = [io.read_netcdf(tmp_path / f"{name}.nc") for name in "ab"]
    io.write_netcdf(xr.concat(parts, dim="prompt"), tmp_path / "both.nc")
    back = io.read_netcdf(tmp_path / "both.nc")
    assert list(back["prompt"].values) == ["arc-0001", "mmlu-0001"]
    assert parts[0]["prompt"].encoding  # the inputs keep theirs
