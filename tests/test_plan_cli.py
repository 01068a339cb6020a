"""`blockcoupling plan`: a GPU rate that is not positive is refused, a given one is honoured, a
model it cannot cost is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO, smoke

from blockcoupling import cli

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- the planner -------------------------------------------------------------------------


@pytest.mark.parametrize("tflops", ["-5", "0", "nan", "inf"])
def test_plan_refuses_a_gpu_rate_that_is_not_positive(
    tflops: str, capsys: pytest.CaptureFixture
) -> None:
    config = str(REPO / "config" / "paper.yaml")
    assert cli.main(["plan", "--configfile", config, f"--gpu-tflops={tflops}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--gpu-tflops" in err[0] and "above 0" in err[0]


def test_plan_honours_a_given_gpu_rate(capsys: pytest.CaptureFixture) -> None:
    config = str(REPO / "config" / "paper.yaml")
    cli.main(["plan", "--configfile", config, "--gpu-tflops", "50"])
    assert "50 TFLOP/s given" in capsys.readouterr().out


def test_plan_refuses_a_model_it_cannot_cost(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = smoke()
    config["models"] = {"nometa": {"source": {"hub": "org/x"}}}
    config["figures"] = {}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["plan", "--configfile", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "models.nometa" in err and "meta.n_layers" in err and "cannot be costed" in err
