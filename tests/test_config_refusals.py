"""Config errors that used to surface late or not at all, refused at check-config in one line: non-
finite scores, a token model without token families, a random-init seed out of range."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, refusal, smoke

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- late or silent config errors ----------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_meta_score_is_refused_at_check_config(bad: float) -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["models"]["smollm2-135m"]["meta"]["score"] = bad
    message = refusal(config)
    assert "models.smollm2-135m.meta.score" in message and "finite" in message


def test_a_non_finite_score_in_the_model_table_is_refused(tmp_path: Path) -> None:
    table = (REPO / "resources" / "paper_models.tsv").read_text().splitlines()
    header = table[0].split("\t")
    row = table[1].split("\t")
    row[header.index("score")] = "nan"
    (tmp_path / "models.tsv").write_text("\n".join([table[0], "\t".join(row)]) + "\n")
    config = yaml.safe_load((REPO / "config" / "paper.yaml").read_text())
    config["model_table"] = str(tmp_path / "models.tsv")
    config["models"] = {}
    config["figures"] = {}
    message = refusal(config)
    assert f"models.{row[header.index('name')]}.meta.score" in message and "models.tsv" in message


def test_token_model_without_token_families_is_refused_at_check_config() -> None:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["figures"]["token_model"] = "smollm2-135m"  # token_families: false in the default
    assert config["models"]["smollm2-135m"]["token_families"] is False
    message = refusal(config)
    assert "figures.token_model 'smollm2-135m'" in message and "token_families" in message
    assert "fixed_size-f0.7943-s19-final" in message  # the models that have them


@pytest.mark.parametrize("seed", [2**70, -1])
def test_random_init_seed_out_of_range_is_refused_at_check_config(seed: int) -> None:
    config = smoke()
    config["random_init"]["seed"] = seed
    message = refusal(config)
    assert message.startswith("random_init.seed")
