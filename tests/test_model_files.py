"""What a model's files may hold: custom model code is refused and never runs, every load passes
trust_remote_code=False, an emptied fetched folder says fetch it again, the smoke run's tiny GGUF
is byte-identical and loads as its conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import save_tiny_folder

from blockcoupling import cli
from blockcoupling.lm.sources import parse_source

pytestmark = pytest.mark.usefixtures("root_logging")  # rule scripts run in-process


# --- custom model code, emptied fetched folders -------------------------------------------


def test_a_folder_with_custom_code_is_refused_and_its_code_never_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = save_tiny_folder(tmp_path / "m")
    config = yaml.safe_load((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel", "AutoConfig": "evil.Cfg"}
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    capsys.readouterr()
    assert cli.main(["measure", str(folder), "hello", "--k", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "auto_map" in err[0] and "config.json" in err[0]
    assert cli.main(["measure", str(folder), "hello", "--k", "2", "--random-twin"]) == 2
    assert not marker.exists()


def test_every_load_passes_trust_remote_code_false(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    from blockcoupling.lm import models

    folder = save_tiny_folder(tmp_path / "m")
    seen: list[tuple[str, object]] = []
    for cls in ("AutoModelForCausalLM", "AutoConfig", "AutoTokenizer"):
        original = getattr(transformers, cls).from_pretrained

        def spy(*args: object, _cls: str = cls, _orig: object = original, **kw: object) -> object:
            seen.append((_cls, kw.get("trust_remote_code", "absent")))
            return _orig(*args, **kw)  # type: ignore[operator]

        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained", spy)
    source = parse_source({"path": str(folder)})
    models.load_model(source)
    models.load_random_twin(source, 0)
    assert {cls for cls, _ in seen} == {"AutoModelForCausalLM", "AutoConfig", "AutoTokenizer"}
    assert all(value is False for _, value in seen), seen


def test_an_emptied_fetched_folder_says_fetch_it_again(tmp_path: Path) -> None:
    from blockcoupling.lm import models
    from blockcoupling.lm.hub import cache as hub_cache

    folder = tmp_path / "hub_cache" / "models" / "org" / "x" / "main"
    folder.mkdir(parents=True)
    (folder / "leftover.txt").write_text("")  # emptied of its model files
    spec = {"name": "x", "source": {"hub": "org/x"}, "fetched": str(folder)}
    with pytest.raises(hub_cache.HubCacheError, match="org/x.*no manifest.*fetch exactly it"):
        models.load_for_job(spec)


# --- the smoke run's GGUF model -----------------------------------------------------------


def test_the_tiny_gguf_is_byte_identical_and_loads_as_its_conversion(tmp_path: Path) -> None:
    import hashlib

    import torch

    from blockcoupling.files import manifest
    from blockcoupling.lm.models import convert_gguf, load_model
    from blockcoupling_tinygguf import D_MODEL, N_LAYERS, assemble

    first, second = assemble(tmp_path / "a.gguf"), assemble(tmp_path / "b.gguf")
    digest = [hashlib.sha256(path.read_bytes()).hexdigest() for path in (first, second)]
    assert digest[0] == digest[1]
    source = parse_source({"path": str(first)})
    model, tokenizer = load_model(source)
    assert (model.config.num_hidden_layers, model.config.hidden_size) == (N_LAYERS, D_MODEL)
    text = "Whether 'tis nobler in the mind to suffer"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    assert tokenizer.decode(ids[0]) == text
    folder = convert_gguf(source, tmp_path / "results" / "models" / "tiny" / "converted")
    manifest.record([folder])
    converted, converted_tokenizer = load_model(parse_source({"path": str(folder)}))
    assert torch.equal(converted_tokenizer(text, return_tensors="pt")["input_ids"], ids)
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, model(ids).logits)
    assert manifest.verify(tmp_path / "results") == []
