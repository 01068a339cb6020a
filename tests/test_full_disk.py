"""A full disk under a NetCDF write says disk full, not HDF5's permission denied."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- a full disk under NetCDF -------------------------------------------------------------


@pytest.fixture
def full_disk(small_tmpfs: Callable[[str], Path]) -> Path:
    """A 64 KiB tmpfs (conftest's ``small_tmpfs``)."""
    return small_tmpfs("64k")


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


def test_one_disk_full_fixture_serves_every_test() -> None:
    """The tmpfs that fills up is built once (conftest's ``small_tmpfs``): two test files
    each mounted and unmounted their own."""
    here = Path(__file__).parent
    needle = '"mount", "-t", ' + '"tmpfs"'  # split: this file does not mount one
    mounting = [p.name for p in here.glob("*.py") if needle in p.read_text()]
    assert mounting == ["conftest.py"], mounting
