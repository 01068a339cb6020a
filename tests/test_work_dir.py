"""The training work folder, keyed to the run config and the training code."""

from __future__ import annotations

from pathlib import Path

from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.lm.training.train import work_dir


def test_training_folder_is_keyed_to_config_and_code(tmp_path: Path) -> None:
    config = TrainConfig(n_layers=1, d_model=8, n_heads=2, total_steps=2)
    first = work_dir(tmp_path, config, "code1")
    first.mkdir()
    assert work_dir(tmp_path, config, "code1") == first and first.is_dir()
    changed = work_dir(
        tmp_path, TrainConfig(n_layers=1, d_model=8, n_heads=2, total_steps=2, seed=1), "code1"
    )
    assert changed != first and not first.exists()  # the stale folder is gone
    assert work_dir(tmp_path, config, "code2") not in (first, changed)
