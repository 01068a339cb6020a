"""The blockcoupling CLI: check-config and measure."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import REPO

from blockcoupling import cli


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_cli_check_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check-config", str(REPO / "config" / "smoke.yaml")]) == 0
    assert "ok." in capsys.readouterr().out
    bad = load("config/smoke.yaml")
    bad["stats"]["k"] = 7
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["check-config", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "stats.k=7 is not in metrics.ks" in err and "Traceback" not in err
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**load("config/smoke.yaml"), "extrct": {}}))
    assert cli.main(["check-config", str(tmp_path / "typo.yaml")]) == 2
    assert "extrct" in capsys.readouterr().err


def test_cli_measure_prints_the_coupling_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import tiny_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_models.llama(layers=3)
    model.to(dtype=__import__("torch").float32).save_pretrained(tmp_path / "m")
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path / "m")
    from blockcoupling import cli

    # in this process: the worker has torch loaded (the command line's entry point runs in
    # tests/test_fetch.py and CI)
    assert cli.main(["measure", str(tmp_path / "m"), "hello there", "--k", "4"]) == 0
    out = capsys.readouterr()
    assert "3 blocks" in out.out and "p0000" in out.out and "mean" in out.out, out.err[-2000:]
    # a missing model: one line, checked in this process (an exception escaping main fails the
    # test as a traceback would fail the command line)
    assert cli.main(["measure", "no/such/model", "x"]) == 2
    assert "no such path" in capsys.readouterr().err
