"""A planted CIFAR-10 batch is never executed: its MD5 is checked before it is read, and the
unpickler builds nothing but what an official batch holds.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from blockcoupling.vit import data as vision_data


class _Planted:
    """Unpickling this calls ``os.system``: it would write ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def _plant(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A CIFAR folder of valid synthetic batches whose test_batch is a crafted pickle."""
    folder = tmp_path / "data" / vision_data.CIFAR10_FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        batch = {b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"labels": [i, 0]}
        (folder / f"data_batch_{i}").write_bytes(pickle.dumps(batch))
    marker = tmp_path / "executed"
    crafted = {b"data": _Planted(marker), b"labels": [0]}
    (folder / "test_batch").write_bytes(pickle.dumps(crafted))
    md5s = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in folder.iterdir()}
    return folder, marker, md5s


def test_the_crafted_pickle_would_execute(tmp_path: Path) -> None:
    folder, marker, _ = _plant(tmp_path)
    pickle.loads((folder / "test_batch").read_bytes())  # what the old reader did
    assert marker.exists()


def test_a_planted_batch_fails_its_md5_unread(tmp_path: Path) -> None:
    folder, marker, _ = _plant(tmp_path)
    with pytest.raises(ValueError) as error:
        vision_data.prepare("cifar10", data_dir=folder.parent)  # the folder is there: no download
    message = str(error.value)
    assert "\n" not in message and str(folder / "data_batch_1") in message
    assert "does not have the MD5" in message and not marker.exists()


def test_a_crafted_batch_with_a_matching_md5_is_refused_by_the_unpickler(tmp_path: Path) -> None:
    folder, marker, md5s = _plant(tmp_path)
    with pytest.raises(ValueError) as error:
        vision_data.read_cifar10(folder, md5s)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{folder / 'test_batch'} is not a CIFAR")
    assert "posix.system" in message or "os.system" in message or "nt.system" in message
    assert not marker.exists()


def test_the_official_md5s_are_torchvisions() -> None:
    assert vision_data.CIFAR10_BATCHES["data_batch_1"] == "c99cafc152244af753f735de768cd75f"
    assert vision_data.CIFAR10_BATCHES["test_batch"] == "40351d587109b95175f43aff81a1287e"
    assert sorted(vision_data.CIFAR10_BATCHES) == [f"data_batch_{i}" for i in range(1, 6)] + [
        "test_batch"
    ]
