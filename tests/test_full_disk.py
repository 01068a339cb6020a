"""A full disk under a NetCDF write says disk full, not HDF5's permission denied."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- a full disk under NetCDF -------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path: Path) -> object:
    """A 64 KiB tmpfs (needs the right to mount: root in a container that allows it)."""
    import subprocess

    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    yield folder
    subprocess.run(["umount", "--lazy", str(folder)], check=True)  # HDF5 may hold the file


def test_a_full_disk_under_netcdf_says_disk_full_not_permission_denied(full_disk: Path) -> None:
    import errno

    import numpy as np
    import xarray as xr

    from blockcoupling.files import io
    from blockcoupling.runtime.runner import reason

    target = full_disk / "coupling.nc"
    with pytest.raises(OSError) as error:
        io.write_netcdf(
            xr.Dataset({"lss": ("a", np.random.default_rng(0).random(200_000))}), target
        )
    assert error.value.errno == errno.ENOSPC and error.value.filename == str(target)
    assert reason(error.value).startswith("the disk is full (No space left on device")
    assert not list(full_disk.iterdir())  # no partial file left
