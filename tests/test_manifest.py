"""The results manifest: every job records its outputs' hashes; ``blockcoupling verify`` names a
result changed afterwards (mtime restored), one with no record, one that does not open, and temp
files left by a killed writer; and ``atomic_write`` clears such temp files at the next write.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from blockcoupling import cli
from blockcoupling.files import io, manifest
from blockcoupling.runtime.runner import run_script


def _job(outputs: list[Path]) -> None:
    """A workflow job (through run_script) writing a NetCDF, a CSV and a PNG + PDF figure."""

    def main(sm: SimpleNamespace) -> None:
        nc, csv, png, pdf = sm.output
        io.write_netcdf(xr.Dataset({"lss": ("token", np.arange(50.0))}), nc)
        io.atomic_write(csv, lambda temp: pd.DataFrame({"a": [1, 2]}).to_csv(temp, index=False))
        Path(png).parent.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots()
        ax.plot([0, 1])
        fig.savefig(png)
        fig.savefig(pdf)
        plt.close(fig)

    job = SimpleNamespace(log=[], output=outputs, rule="job", threads=1, params=SimpleNamespace())
    run_script(job, main)


@pytest.fixture
def results(tmp_path: Path) -> tuple[Path, list[Path]]:
    root = tmp_path / "results"
    outputs = [
        root / "a" / "x.nc",
        root / "b" / "t.csv",
        root / "f" / "p.png",
        root / "f" / "p.pdf",
    ]
    _job(outputs)
    return root, outputs


def test_a_clean_results_folder_verifies(results: tuple[Path, list[Path]]) -> None:
    root, outputs = results
    assert manifest.verify(root) == []
    assert cli.main(["verify", str(root)]) == 0
    record = manifest.record_path(root, outputs[0])
    assert record == root / ".manifest" / "a" / "x.nc.json" and record.is_file()


def test_garbage_with_its_old_mtime_is_named(results: tuple[Path, list[Path]], capsys) -> None:
    root, (nc, csv, png, pdf) = results
    before = nc.stat()
    garbage = bytearray(nc.read_bytes())
    garbage[len(garbage) // 2] ^= 0xFF  # same size, one byte flipped
    nc.write_bytes(bytes(garbage))
    os.utime(nc, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert nc.stat().st_mtime_ns == before.st_mtime_ns and nc.stat().st_size == before.st_size
    assert manifest.verify(root) == [
        f"{nc}: differs from its record (changed since its job wrote it)"
    ]
    assert cli.main(["verify", str(root)]) == 1
    assert (
        capsys.readouterr().out.strip()
        == f"{nc}: differs from its record (changed since its job wrote it)"
    )


def test_unrecorded_unreadable_and_leftover_files_are_named(
    results: tuple[Path, list[Path]],
) -> None:
    root, (nc, csv, png, pdf) = results
    planted = root / "a" / "planted.nc"
    planted.write_bytes(b"not a netcdf")
    broken = root / "g" / "broken.png"
    broken.parent.mkdir()
    broken.write_bytes(png.read_bytes()[:100])  # a truncated PNG, recorded as it is
    manifest.record([broken])
    leftover = root / "a" / ".x.nc.abcd_123.tmp"
    leftover.write_bytes(b"partial")
    problems = manifest.verify(root)
    assert len(problems) == 3
    assert problems[0] == f"{leftover}: a temp file of an interrupted write; delete it"
    assert problems[1].startswith(f"{planted}: no record")
    assert problems[2].startswith(f"{broken}: does not open (")


def test_a_folder_without_a_manifest_is_one_line(tmp_path: Path) -> None:
    assert cli.main(["verify", str(tmp_path)]) == 2


def test_files_outside_a_results_folder_are_not_recorded(tmp_path: Path) -> None:
    path = io.write_text(tmp_path / "elsewhere" / "x.txt", "x")
    manifest.record([path])
    assert manifest.results_root(path) is None and not list(tmp_path.rglob(".manifest"))


def test_a_killed_writers_temp_file_is_removed_at_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "tokens.nc"
    code = (
        "import sys, time; from blockcoupling.files.io import atomic_write\n"
        "def write(temp):\n"
        "    open(temp, 'wb').write(b'half'); print('writing', flush=True); time.sleep(60)\n"
        "atomic_write(sys.argv[1], write)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"writing\n"
    child.send_signal(signal.SIGKILL)  # no handler runs: the temp file stays
    child.wait()
    left = io.temp_files(target)
    assert len(left) == 1 and left[0].name.startswith(".tokens.nc.")
    other = tmp_path / ".tokens.nc.x.nc.abcdefgh.tmp"  # another target's temp file is kept
    other.write_bytes(b"")
    io.write_text(target, "whole")
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "tokens.nc"]
    assert target.read_text() == "whole"


def test_a_deleted_result_is_named(results: tuple[Path, list[Path]], capsys) -> None:
    root, (nc, csv, png, pdf) = results
    pdf.unlink()
    nc.unlink()
    assert manifest.verify(root) == [
        f"{nc}: recorded but missing (deleted since its job wrote it); rerun the workflow",
        f"{pdf}: recorded but missing (deleted since its job wrote it); rerun the workflow",
    ]
    assert cli.main(["verify", str(root)]) == 1
    assert str(nc) in capsys.readouterr().out


def test_merged_temporary_shards_are_not_missing(tmp_path: Path) -> None:
    root = tmp_path / "results"
    shard = root / "extract" / "m" / "final" / "shards" / "0" / "depth.nc"
    shard.parent.mkdir(parents=True)
    io.write_netcdf(xr.Dataset({"lss": ("a", np.arange(3.0))}), shard)
    manifest.record([shard])
    shard.unlink()  # Snakemake deletes a temp() output once its consumer is done
    assert manifest.verify(root) == []


def test_a_directory_output_gets_a_record_per_file(tmp_path: Path) -> None:
    root = tmp_path / "results"
    folder = root / "models" / "m" / "converted"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "old.json").write_text("{}")
    manifest.record([folder])
    (folder / ".snakemake_timestamp").touch()  # Snakemake marks a directory() output after it
    assert manifest.verify(root) == []
    (folder / "old.json").unlink()  # the rule rewrote the folder without it, then recorded it
    (folder / "config.json").write_text('{"a": 1}')
    manifest.record([folder])
    assert manifest.verify(root) == []
    (folder / "config.json").unlink()
    assert manifest.verify(root) == [
        f"{folder / 'config.json'}: recorded but missing (deleted since its job wrote it); "
        "rerun the workflow"
    ]
