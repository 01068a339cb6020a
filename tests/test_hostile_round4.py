"""The fourth round of hostile inputs and faults (issue 26): hub ids and revisions the hub
would refuse, paths out of their folder, custom model code, non-finite values that used to
shrink a statistic silently, specta that cannot carry the asked K, ``verify`` and deletions,
planner nonsense and late config errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SCHEMA
from snakemake.utils import validate

from blockcoupling import cli
from blockcoupling.coupling.metrics import MetricConfig
from blockcoupling.lm.hub_names import HubNameError, check_repo_id, check_revision, contained
from blockcoupling.lm.sources import ModelSourceError, parse_source, resolve
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.schema_check import validate_config


@pytest.fixture(autouse=True)
def _root_logging() -> object:
    """The root logger's handlers as they were, less any writing to a closed stream: rule
    scripts run in-process (run_script) point it at the test's stderr, closed once it ends.
    """
    import logging

    handlers = [  # not one an earlier test left writing to its closed stderr
        handler
        for handler in logging.root.handlers
        if not getattr(getattr(handler, "stream", None), "closed", False)
    ]
    logging.root.handlers[:] = handlers
    level = logging.root.level
    yield
    for handler in logging.root.handlers:
        if handler not in handlers:
            handler.close()
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def smoke(**changes: dict) -> dict:
    """config/smoke.yaml with sections updated (one level deep), schema-validated."""
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    for section, values in changes.items():
        config[section] = {**config.get(section, {}), **values}
    validate(config, SCHEMA)
    return config


def refusal(config: dict) -> str:
    """The one-line ConfigError of the schema or check_config for ``config``."""
    config = copy.deepcopy(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config, SCHEMA)
        check_config(config, REPO)
    message = str(error.value)
    assert "\n" not in message
    return message


def with_model(source: dict, **spec: object) -> dict:
    config = smoke()
    config["models"] = {"evil": {"source": source, **spec}}
    return config


# --- hub ids, revisions, contained paths ---------------------------------------------------


@pytest.mark.parametrize("repo", ["../..", "..", "org/..", "a..b", "/etc", "a/b/c", "x--y"])
def test_hub_ids_the_hub_refuses_are_refused(repo: str) -> None:
    with pytest.raises(HubNameError):
        check_repo_id(repo)
    assert "hub" in refusal(with_model({"hub": repo}))


@pytest.mark.parametrize("repo", ["gpt2", "EleutherAI/pythia-70m", "HuggingFaceTB/SmolLM2-135M"])
def test_real_hub_ids_pass(repo: str) -> None:
    assert check_repo_id(repo) == repo


@pytest.mark.parametrize(
    "revision", ["..", "../../x", "victim/..", "/abs", "a//b", ".hidden", "x.lock", "a b", "x/"]
)
def test_revisions_that_escape_or_git_refuses_are_refused_at_check_config(revision: str) -> None:
    with pytest.raises(HubNameError):
        check_revision(revision)
    message = refusal(with_model({"hub": "org/x", "revision": revision}))
    assert "models.evil.source" in message and "hub revision" in message


@pytest.mark.parametrize("revision", ["main", "step1000", "refs/pr/1", "v1.0", "a" * 40])
def test_real_revisions_pass(revision: str) -> None:
    assert check_revision(revision) == revision


def test_a_revision_with_a_slash_is_refused_by_the_workflow_not_missing_input() -> None:
    message = refusal(with_model({"hub": "org/x", "revision": "refs/pr/1"}))
    assert "refs/pr/1" in message and "commit hash" in message


def test_a_revision_template_that_escapes_is_refused() -> None:
    config = with_model({"hub": "org/x"}, steps=[1], revision_template="../../{step}")
    assert "hub revision '../../1'" in refusal(config)


def test_a_hub_source_with_an_unknown_key_is_refused_before_any_download() -> None:
    with pytest.raises(ModelSourceError, match="unknown key.*evil"):
        parse_source({"hub": "gpt2", "evil": 1})
    # the command line's YAML form: one line, no retries against the hub
    assert cli.main(["measure", "{hub: gpt2, evil: 1}", "hi"]) == 2


def test_a_hub_source_on_the_command_line_cannot_name_a_folder(
    capsys: pytest.CaptureFixture,
) -> None:
    assert cli.main(["measure", "hub:../../etc", "hello"]) == 2
    assert "hub id '../../etc'" in capsys.readouterr().err


def test_a_package_file_outside_its_package_is_refused(tmp_path: Path) -> None:
    source = parse_source({"package": "blockcoupling", "file": "../../../../etc/passwd"})
    with pytest.raises(ModelSourceError, match="outside"):
        resolve(source)
    message = refusal(with_model({"package": "blockcoupling", "file": "../../../../etc/passwd"}))
    assert "models.evil.source" in message and "outside" in message
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ModelSourceError, match="outside"):
        resolve(parse_source({"path": str(folder), "file": "../../etc/passwd"}))
    outside = tmp_path / "x"
    outside.mkdir()
    with pytest.raises(HubNameError):
        contained(outside, tmp_path / "inside", "file")


# --- custom model code, emptied fetched folders -------------------------------------------


def save_tiny_folder(folder: Path) -> Path:
    """A 2-block llama with a character tokenizer saved to ``folder``."""
    import tiny_models
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tiny_models.llama(layers=2).save_pretrained(folder)
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


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
    from blockcoupling.lm import hub, models

    folder = tmp_path / "hub_cache" / "models" / "org" / "x" / "main"
    folder.mkdir(parents=True)
    (folder / "leftover.txt").write_text("")  # emptied of its model files
    spec = {"name": "x", "source": {"hub": "org/x"}, "fetched": str(folder)}
    with pytest.raises(hub.HubCacheError, match="org/x.*no manifest.*fetch exactly it"):
        models.load_for_job(spec)


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
    config["figures"]["token_model"] = "gemma3-270m"  # token_families: false in the default
    assert config["models"]["gemma3-270m"]["token_families"] is False
    message = refusal(config)
    assert "figures.token_model 'gemma3-270m'" in message and "token_families" in message
    assert "smollm2-135m" in message


@pytest.mark.parametrize("seed", [2**70, -1])
def test_random_init_seed_out_of_range_is_refused_at_check_config(seed: int) -> None:
    config = smoke()
    config["random_init"]["seed"] = seed
    message = refusal(config)
    assert message.startswith("random_init.seed")


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


# --- claims --readme ---------------------------------------------------------------------


@pytest.fixture
def claims_run(tmp_path: Path) -> Path:
    (tmp_path / "results" / "stats").mkdir(parents=True)
    (tmp_path / "results" / "stats" / "claims.md").write_text("| new table |\n")
    return tmp_path / "results"


def _readme(text: str) -> str:
    from blockcoupling.stats import claims

    return text.format(start=claims.START, end=claims.END)


def test_claims_refuses_markers_twice(
    claims_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    readme = tmp_path / "README.md"
    text = _readme("{start}\nA\n{end}\nmiddle\n{start}\nB\n{end}\n")
    readme.write_text(text)
    assert cli.main(["claims", str(claims_run), "--readme", str(readme)]) == 2
    assert "2 <!-- claims:start -->" in capsys.readouterr().err
    assert readme.read_text() == text


def test_claims_refuses_a_read_only_readme_and_leaves_it_alone(
    claims_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    readme = tmp_path / "README.md"
    text = _readme("top\n{start}\nold\n{end}\n")
    readme.write_text(text)
    readme.chmod(0o444)
    assert cli.main(["claims", str(claims_run), "--readme", str(readme)]) == 2
    assert "read-only" in capsys.readouterr().err
    assert readme.read_text() == text and (readme.stat().st_mode & 0o777) == 0o444


def test_claims_keeps_a_readme_symlink_and_the_files_mode(claims_run: Path, tmp_path: Path) -> None:
    real = tmp_path / "docs" / "README.md"
    real.parent.mkdir()
    real.write_text(_readme("top\n{start}\nold\n{end}\n"))
    real.chmod(0o640)
    link = tmp_path / "README.md"
    link.symlink_to(real)
    assert cli.main(["claims", str(claims_run), "--readme", str(link)]) == 0
    assert link.is_symlink() and "| new table |" in real.read_text()
    assert (real.stat().st_mode & 0o777) == 0o640


# --- spectra that cannot carry K ----------------------------------------------------------


def zeroed_tiny(folder: Path, blocks: tuple[int, ...]) -> Path:
    """A 3-block llama whose ``blocks`` (0-based) have their output projections zeroed: their
    block Jacobians are exactly 0.
    """
    import torch
    import transformers

    save_tiny_folder(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for block in blocks:
            model.model.layers[block].self_attn.o_proj.weight.zero_()
            model.model.layers[block].mlp.down_proj.weight.zero_()
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("blocks", [(1,), (0, 1)])
def test_measure_names_a_zero_block_instead_of_printing_nan(
    tmp_path: Path, blocks: tuple[int, ...], capsys: pytest.CaptureFixture
) -> None:
    folder = zeroed_tiny(tmp_path / "m", blocks)
    capsys.readouterr()
    assert cli.main(["measure", str(folder), "hello there", "--k", "4"]) == 2
    captured = capsys.readouterr()
    err = [line for line in captured.err.splitlines() if line.strip() and "it/s]" not in line]
    assert len(err) == 1 and "nan" not in captured.out
    assert f"layer {blocks[0] + 1} has rank below K=4" in err[0] and "s_1 = 0" in err[0]


def test_the_metrics_rule_names_a_zero_block_not_nan_weights(tmp_path: Path) -> None:
    import runpy
    import types

    from blockcoupling.files import io
    from blockcoupling.jacobians.extract import MeasureConfig, measure
    from blockcoupling.lm.models import load_model

    folder = zeroed_tiny(tmp_path / "m", (1,))
    model, tokenizer = load_model(parse_source({"path": str(folder)}))
    data = measure(model, tokenizer, ["hello there"], MeasureConfig(k_max=4, token_prompts=0))
    io.write_netcdf(data["depth"], tmp_path / "depth.nc")
    io.write_netcdf(data["tokens"], tmp_path / "tokens.nc")
    log = tmp_path / "metrics.log"
    sm = types.SimpleNamespace(
        log=[str(log)],
        threads=1,
        rule="metrics",
        input=types.SimpleNamespace(depth=tmp_path / "depth.nc", tokens=tmp_path / "tokens.nc"),
        output=types.SimpleNamespace(depth=tmp_path / "o.nc", tokens=tmp_path / "t.nc"),
        params=types.SimpleNamespace(metrics=MetricConfig(ks=(2, 4))),
        wildcards=types.SimpleNamespace(model="zeroed", step="final"),
    )
    with pytest.raises(SystemExit):
        runpy.run_path(str(REPO / "scripts" / "metrics.py"), {"snakemake": sm})
    text = log.read_text()
    assert "model zeroed, step final: the Jacobian at prompt p0000, layer 2" in text
    assert "rank below K=4" in text and "NaN/Inf" not in text
    assert not (tmp_path / "o.nc").exists()


def test_require_rank_agrees_with_numpys_rank() -> None:
    import numpy as np
    import xarray as xr

    from blockcoupling.coupling.finite import require_rank

    rng = np.random.default_rng(0)
    d, k = 12, 5
    for rank in range(0, d + 1):
        jac = rng.normal(size=(d, rank)) @ rng.normal(size=(rank, d))
        s = np.linalg.svd(jac.astype(np.float32), compute_uv=False)
        values = xr.DataArray(s[None, :], dims=("layer", "rank"), coords={"layer": [1]})
        deficient = np.linalg.matrix_rank(jac) < k
        if deficient:
            with pytest.raises(ValueError, match=f"rank below K={k}"):
                require_rank(values, k, d, "m")
        else:
            require_rank(values, k, d, "m")


# --- no statistic over a silently smaller set ---------------------------------------------


def _run_combine(tmp_path: Path, name: str, datasets: dict[str, object]) -> Path:
    """scripts/combine.py on per-model files ``datasets`` (model -> dataset, step final);
    returns its log.
    """
    import runpy
    import types

    from blockcoupling.files import io

    paths = {}
    for model, dataset in datasets.items():
        paths[model] = tmp_path / model / f"{name}.nc"
        io.write_netcdf(dataset, paths[model])  # type: ignore[arg-type]
    log = tmp_path / "combine.log"
    sm = types.SimpleNamespace(
        log=[str(log)],
        threads=1,
        rule="combine_models",
        input=[str(path) for path in paths.values()],
        output=[str(tmp_path / "combined" / f"{name}.nc")],
        params=types.SimpleNamespace(
            parts=[(model, "final", str(path)) for model, path in paths.items()],
            along="init",
            meta={},
        ),
    )
    runpy.run_path(str(REPO / "scripts" / "combine.py"), {"snakemake": sm})
    return log


def _coupling(values: list[float]) -> object:
    import numpy as np
    import xarray as xr

    prompts = [f"p{i:04d}" for i in range(len(values))]
    return xr.Dataset(
        {
            "coupling": ("prompt", np.array(values)),
            "depth_mis": (("prompt", "layer"), np.zeros((len(values), 2))),
        },
        coords={"prompt": prompts, "layer": [1, 2]},
    )


def test_a_nan_coupling_of_one_prompt_stops_the_combine_naming_file_and_prompt(
    tmp_path: Path,
) -> None:
    good, bad = _coupling([-0.5, -0.4, -0.3]), _coupling([-0.5, float("nan"), -0.3])
    with pytest.raises(SystemExit):
        _run_combine(tmp_path, "coupling", {"a": good, "b": bad})
    text = (tmp_path / "combine.log").read_text()
    assert "b/coupling.nc (b, final): coupling is nan at prompt=p0001" in text
    assert "verify" in text and "NaN/Inf" not in text
    assert not (tmp_path / "combined" / "coupling.nc").exists()


def test_finite_coupling_parts_combine(tmp_path: Path) -> None:
    _run_combine(tmp_path, "coupling", {"a": _coupling([-0.5, -0.4]), "b": _coupling([-0.1, 0])})
    assert (tmp_path / "combined" / "coupling.nc").is_file()


def test_a_nan_bits_per_byte_stops_the_combine(tmp_path: Path) -> None:
    import xarray as xr

    def evaluation(bpb: float) -> xr.Dataset:
        return xr.Dataset({"bits_per_byte": ((), bpb)}, attrs={"n_items": 0})

    with pytest.raises(SystemExit):
        _run_combine(tmp_path, "evaluation", {"a": evaluation(1.2), "b": evaluation(float("nan"))})
    assert (
        "b/evaluation.nc (b, final): bits_per_byte is nan" in (tmp_path / "combine.log").read_text()
    )


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
