"""The ViT sweep's library: config checks, schedule, data, model, deterministic resumable training,
and its block Jacobians against finite differences inside a full forward."""

from __future__ import annotations

import copy
import hashlib
import math
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO, SCHEMA
from finite_differences import block_jacobian
from safetensors.torch import load_file
from snakemake.utils import validate

from blockcoupling.jacobians.adapters import adapter_for, architecture_key, blocks_of
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.extract import ExtractConfig, extract_inputs
from blockcoupling.jacobians.options import PromptText
from blockcoupling.jacobians.run_mode import eager_attention
from blockcoupling.pipeline.checks import check_config
from blockcoupling.pipeline.errors import ConfigError
from blockcoupling.pipeline.plan import Plan
from blockcoupling.pipeline.vit_plan import grid_label
from blockcoupling.vit import data as vision_data
from blockcoupling.vit.config import ViTRunConfig, learning_rate
from blockcoupling.vit.model import VisionTransformer, build_vit, drop_path, load_vit
from blockcoupling.vit.train import train_vit

TINY = ViTRunConfig(
    embed_dim=8, depth=2, num_heads=2, patch_size=4, epochs=3, warmup_epochs=1, batch_size=256
)


# --- config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_heads=3), "num_heads=3 does not divide embed_dim=8"),
        (dict(patch_size=3), "patch_size=3 does not divide img_size=8"),
        (dict(drop_path_rate=1.0), r"drop_path_rate must be in \[0, 1\)"),
        (dict(weight_decay=-0.1), "weight_decay must be >= 0"),
        (dict(in_chans=3), "do not match digits"),
        (dict(warmup_epochs=3), "warmup_epochs=3 must be in"),
        (dict(min_lr=1.0), "min_lr <= lr"),
        (dict(dataset="mnist"), "dataset 'mnist' is not one of"),
    ],
)
def test_run_config_validation(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTRunConfig(**{**TINY.to_dict(), **change})


def test_learning_rate_warmup_then_cosine_by_hand() -> None:
    cfg = ViTRunConfig(epochs=10, warmup_epochs=2, lr=1e-3, min_lr=1e-5, warmup_lr=1e-6)
    per_epoch = 5  # 10 warmup updates, 40 cosine updates
    assert learning_rate(0, per_epoch, cfg) == pytest.approx(1e-6)
    assert learning_rate(5, per_epoch, cfg) == pytest.approx(1e-6 + (1e-3 - 1e-6) * 0.5)
    assert learning_rate(10, per_epoch, cfg) == pytest.approx(1e-3)
    assert learning_rate(30, per_epoch, cfg) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))
    expected = 1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * 39 / 40))
    assert learning_rate(49, per_epoch, cfg) == pytest.approx(expected)
    assert learning_rate(50, per_epoch, cfg) == pytest.approx(1e-5)


def test_grid_labels() -> None:
    assert [grid_label(v) for v in (0.0, 0.1, 0.05, 1e-5, 0.5)] == [
        "0",
        "0.1",
        "0.05",
        "1e-05",
        "0.5",
    ]


def _config(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def _checked(config: dict) -> Plan:
    config = copy.deepcopy(config)
    validate(config, SCHEMA)
    return check_config(config, REPO)


@pytest.mark.parametrize("name", ["config.yaml", "config/smoke.yaml", "config/paper.yaml"])
def test_shipped_configs_enable_the_sweep(name: str) -> None:
    plan = _checked(_config(name))
    assert plan.vit is not None
    targets = plan.targets()
    assert "results/vit/combined.nc" in targets and "results/stats/vit_models.csv" in targets
    rate, decay, seed = plan.vit.points[-1]
    assert f"results/vit/extract/sd{rate}/wd{decay}/seed{seed}/depth.nc" in targets
    assert plan.vit.run(rate, decay, seed).drop_path_rate == plan.vit.drop_path_rate[rate]


def test_default_grid_is_5_rates_by_2_seeds_at_one_decay_with_k_an_eighth_of_d() -> None:
    """The default's sweep is exploratory (docs/design_default.md): 5 rates x 2 seeds (a seed
    block of the sd test); config/paper.yaml declares its tests primary."""
    config = _config("config.yaml")
    vit = _checked(config).vit
    assert len(vit.drop_path_rate) >= 5 and len(vit.weight_decay) == 1 and len(vit.seeds) >= 2
    assert not [t for t in config["stats"]["primary"] if t.startswith("vit_")]
    assert "vit_sd_effect" in _config("config/paper.yaml")["stats"]["primary"]
    assert vit.k / vit.base["embed_dim"] <= 1 / 8
    paper = _checked(_config("config/paper.yaml")).vit
    assert (len(paper.drop_path_rate), len(paper.weight_decay)) == (8, 8)
    run = paper.run(*paper.points[0])
    assert (run.dataset, run.embed_dim, run.depth, run.num_heads, run.patch_size) == (
        "cifar10",
        192,
        12,
        3,
        4,
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda v: v["model"].update(num_heads=5), r"vit\.model\.num_heads=5 does not divide"),
        (lambda v: v["model"].update(patch_size=3), r"vit\.model\.patch_size=3 does not divide"),
        (lambda v: v["extract"].update(k_max=128), r"vit\.extract\.k_max=128 exceeds embed_dim"),
        (lambda v: v.update(ks=[4, 32]), r"vit\.ks has K=32 > extract\.k_max"),
        (lambda v: v.update(k=5), r"vit\.k=5 is not in ks"),
        (lambda v: v["grid"].update(seeds=[0, 0]), r"vit\.grid\.seeds has a repeated seed"),
        (lambda v: v["grid"].update(weight_decay=[0.1, 0.10]), r"vit\.grid\.weight_decay repeats"),
        (lambda v: v["extract"].update(token_layers=[9]), r"vit\.extract\.token_layers \[9\]"),
        (lambda v: v["extract"].update(depth_token=40), r"vit\.extract\.depth_token=40"),
    ],
)
def test_bad_vit_configs_stop_with_one_line(change, message: str) -> None:
    config = _config("config.yaml")
    change(config["vit"])
    with pytest.raises(ConfigError, match=message) as error:
        _checked(config)
    assert "\n" not in str(error.value)


def test_plan_extract_config_and_disabled_sweep() -> None:
    config = _config("config.yaml")
    plan = _checked(config).vit
    assert plan.extraction == ExtractConfig(  # stored at vit.ks; the results read no token overlaps
        k_max=16,
        depth_token=0,
        token_layers=(-1,),
        token_prompts=1,
        stored_ks=tuple(plan.ks),
        token_bases=False,
    )
    config["vit"]["enabled"] = False
    off = _checked(config)
    assert off.vit is None and not [t for t in off.targets() if "vit" in t]


# --- data -----------------------------------------------------------------------------------------
def test_digits_split_is_seeded_stratified_and_disjoint() -> None:
    a, b = vision_data.digits(0), vision_data.digits(0)
    assert np.array_equal(a.x_test, b.x_test) and np.array_equal(a.y_train, b.y_train)
    assert a.x_train.shape == (1437, 1, 8, 8) and a.x_test.shape == (360, 1, 8, 8)
    assert a.x_train.dtype == np.uint8 and a.x_train.max() == 16
    assert not np.array_equal(vision_data.digits(1).y_test, a.y_test)
    counts = np.bincount(a.y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37  # 20% of every class
    x = a.normalized(a.x_train)
    assert x.dtype == np.float32
    assert abs(float(x.mean())) < 1e-5 and float(x.std()) == pytest.approx(1.0, abs=1e-4)


def _fake_cifar(folder: Path, per_batch: int = 4) -> dict[str, str]:
    """Synthetic batches in CIFAR-10's format; returns their MD5s (name -> MD5)."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for i, name in enumerate(names):
        batch = {
            b"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
            b"labels": [(i + j) % 10 for j in range(per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return {name: hashlib.md5((folder / name).read_bytes()).hexdigest() for name in names}


def test_cifar10_reader_on_a_synthetic_folder(tmp_path: Path) -> None:
    md5s = _fake_cifar(tmp_path / vision_data.CIFAR10_FOLDER)
    data = vision_data.read_cifar10(tmp_path / vision_data.CIFAR10_FOLDER, md5s)
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (4, 3, 32, 32)
    raw = pickle.loads((tmp_path / vision_data.CIFAR10_FOLDER / "test_batch").read_bytes())
    assert np.array_equal(data.x_test[1, 2].ravel(), raw[b"data"][1, 2048:])  # channel-major rows
    assert list(data.y_test) == raw[b"labels"]
    expected = data.x_train.astype(float).mean(axis=(0, 2, 3)) / 255
    assert np.allclose(data.mean, expected, atol=1e-6)


def test_cifar10_download_checks_and_unpacks(tmp_path: Path) -> None:
    source = tmp_path / "source"
    md5s = _fake_cifar(source / vision_data.CIFAR10_FOLDER)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source / vision_data.CIFAR10_FOLDER, arcname=vision_data.CIFAR10_FOLDER)
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    data_dir = tmp_path / "data"
    folder = vision_data.download_cifar10(data_dir, archive.as_uri(), md5)
    assert (folder / "test_batch").is_file() and folder.parent == data_dir
    assert vision_data.read_cifar10(folder, md5s).x_test.shape == (4, 3, 32, 32)
    with pytest.raises(ValueError, match="data_batch_1 does not have the MD5"):
        vision_data.read_cifar10(folder)  # the official MD5s are checked by default
    assert vision_data.download_cifar10(data_dir, "file:///nowhere", md5) == folder  # cached
    with pytest.raises(ValueError, match="does not have the MD5"):
        vision_data.download_cifar10(tmp_path / "other", archive.as_uri(), "0" * 32)


def test_prepared_round_trip(tmp_path: Path) -> None:
    data = vision_data.digits(0)
    back = vision_data.read_prepared(vision_data.write_prepared(data, tmp_path / "d.npz"))
    assert np.array_equal(back.x_train, data.x_train) and back.scale == 16.0
    assert np.array_equal(back.normalized(back.x_test), data.normalized(data.x_test))


# --- model ----------------------------------------------------------------------------------------
def test_model_shapes_rates_and_parameter_names() -> None:
    torch.manual_seed(0)
    cfg = ViTRunConfig(embed_dim=8, depth=3, num_heads=2, drop_path_rate=0.3)
    model = build_vit(cfg)
    assert model(torch.randn(5, 1, 8, 8)).shape == (5, 10)
    rates = [block.drop_path1.rate for block in model.blocks]
    assert rates == pytest.approx([0.0, 0.15, 0.3])
    names = set(model.state_dict())
    for name in ("cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.attn.qkv.weight"):
        assert name in names  # timm's VisionTransformer names
    assert model.pos_embed.shape == (1, 17, 8)
    assert architecture_key(model) == "blockcoupling.VisionTransformer"
    assert adapter_for(model).causal is False and len(blocks_of(model)) == 3


def test_drop_path_drops_whole_samples_and_keeps_the_mean() -> None:
    x = torch.ones(4000, 3, 2)
    torch.manual_seed(0)
    out = drop_path(x.double(), 0.25, training=True)
    per_sample = out[:, 0, 0]
    assert set(per_sample.unique().tolist()) == {0.0, 1 / 0.75}
    assert torch.equal(out, per_sample[:, None, None].expand_as(out))
    assert abs(float((per_sample == 0).float().mean()) - 0.25) < 0.03
    assert torch.equal(drop_path(x, 0.25, training=False), x)


def test_fused_and_eager_attention_agree_and_the_switch_is_restored() -> None:
    torch.manual_seed(0)
    model = build_vit(ViTRunConfig(embed_dim=8, depth=2, num_heads=2)).double().eval()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    fused = model(x)
    with eager_attention(model):
        assert not any(block.attn.fused_attn for block in model.blocks)
        eager = model(x)
    assert all(block.attn.fused_attn for block in model.blocks)
    assert torch.allclose(fused, eager, atol=1e-12)


# --- training -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits() -> vision_data.Prepared:
    return vision_data.digits(0)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, digits) -> Path:
    cfg = ViTRunConfig(**{**TINY.to_dict(), "drop_path_rate": 0.3, "mixup_alpha": 0.8})
    return train_vit(
        cfg, digits, tmp_path_factory.mktemp("vit") / "work", threads=1, progress=False
    )


def test_training_writes_weights_and_history(trained: Path) -> None:
    import pandas as pd

    history = pd.read_csv(trained.parent / "history.csv")
    assert list(history["epoch"]) == [1, 2, 3]
    assert history["test_accuracy"].between(0, 1).all()
    assert not (trained.parent / "state.pt").exists()  # removed once the run is complete


def test_interrupted_training_resumes_to_identical_weights(
    tmp_path: Path, digits, trained: Path
) -> None:
    cfg = ViTRunConfig(**{**TINY.to_dict(), "drop_path_rate": 0.3, "mixup_alpha": 0.8})
    work = tmp_path / "work"
    train_vit(cfg, digits, work, threads=1, progress=False, stop_after=1)
    assert (work / "state.pt").is_file() and not (work / "model.safetensors").exists()
    resumed = train_vit(cfg, digits, work, threads=1, progress=False)
    a, b = load_file(str(trained)), load_file(str(resumed))
    assert all(torch.equal(a[name], b[name]) for name in a)
    other = train_vit(
        ViTRunConfig(**{**cfg.to_dict(), "seed": 1}), digits, tmp_path / "w2", 1, progress=False
    )
    assert not torch.equal(load_file(str(other))["head.weight"], a["head.weight"])


def test_a_work_folder_of_another_run_is_refused(tmp_path: Path, digits) -> None:
    train_vit(TINY, digits, tmp_path, threads=1, progress=False, stop_after=0)
    with pytest.raises(ValueError, match="different config"):
        train_vit(
            ViTRunConfig(**{**TINY.to_dict(), "seed": 3}), digits, tmp_path, 1, progress=False
        )


def test_augmentation_options_train(tmp_path: Path, digits) -> None:
    cfg = ViTRunConfig(
        **{**TINY.to_dict(), "epochs": 1, "warmup_epochs": 0},
        # crop and flip exercised on digits only as a code path (flips do not suit digits)
    )
    cfg = ViTRunConfig(**{**cfg.to_dict(), "random_crop_padding": 1, "horizontal_flip": True})
    weights = train_vit(cfg, digits, tmp_path, threads=1, progress=False)
    assert load_vit(weights, cfg).training is False


# --- Jacobians ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vit64() -> tuple[VisionTransformer, torch.Tensor]:
    torch.manual_seed(0)
    cfg = ViTRunConfig(embed_dim=8, depth=3, num_heads=2, drop_path_rate=0.5)
    model = build_vit(cfg).double()
    with torch.no_grad():  # weights far from the small initialisation: a nonlinear regime
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model.eval(), torch.randn(1, 1, 8, 8, dtype=torch.float64)


@pytest.mark.parametrize("layer, t1, t2", [(1, 0, 0), (2, 5, 0), (3, 0, 7), (2, 16, 16)])
def test_vit_jacobians_match_finite_differences(vit64, layer: int, t1: int, t2: int) -> None:
    model, x = vit64
    with eager_attention(model):
        engine = JacobianEngine(model, {"x": x})
        assert engine.n_tokens == 17  # class token + 16 patches
        reverse = engine.output_token(layer, t2)[t1]  # VJPs
        forward = engine.input_token(layer, t1)[t2]  # JVPs
        diagonal = engine.diagonal(layer, t2) if t1 == t2 else None
    fd = block_jacobian(model.blocks[layer - 1], lambda batch: model(**batch), {"x": x}, t1, t2)
    assert fd.norm() > 1e-3
    for jac in (reverse, forward) + ((diagonal,) if diagonal is not None else ()):
        assert float((jac - fd).norm() / fd.norm()) < 1e-6


def test_measurement_is_in_eval_mode_and_restores_training(vit64) -> None:
    model, x = vit64
    items = [PromptText("a", "3", ""), PromptText("b", "4", "")]
    inputs = [{"x": x}, {"x": x.flip(-1)}]
    config = ExtractConfig(k_max=4, depth_token=0, token_layers=(-1,), token_prompts=1)
    reference = extract_inputs(model, inputs, items, config, progress=False)
    model.train()  # drop path 0.5 would change every call if it were active
    try:
        again = extract_inputs(model, inputs, items, config, progress=False)
        assert model.training
    finally:
        model.eval()
    assert np.allclose(reference["depth"]["depth_diag"], again["depth"]["depth_diag"], atol=1e-10)
    depth = reference["depth"]
    assert depth.sizes["layer"] == 3 and list(depth["token_position"].values) == [0, 0]
    assert reference["tokens"].sizes["token"] == 17


def test_schema_defaults_equal_the_library_defaults() -> None:
    config = _config("config.yaml")
    config["vit"] = {"enabled": True}
    plan = _checked(config).vit
    sd, wd, seed = plan.points[0]
    defaults = ViTRunConfig().to_dict()
    run = plan.run(sd, wd, seed).to_dict()
    assert {
        k: v for k, v in run.items() if k not in ("drop_path_rate", "weight_decay", "seed")
    } == {k: v for k, v in defaults.items() if k not in ("drop_path_rate", "weight_decay", "seed")}


def test_grid_dataset_stacks_coupling_and_accuracy(vit64) -> None:
    import pandas as pd

    from blockcoupling.coupling.metrics import (
        MetricConfig,
        coupling_dataset,
        token_coupling_dataset,
    )
    from blockcoupling.vit.results import grid_dataset

    model, x = vit64
    items = [PromptText("test00000", "3", ""), PromptText("test00001", "4", "")]
    config = ExtractConfig(k_max=4, depth_token=0, token_layers=(-1,), token_prompts=1)
    result = extract_inputs(model, [{"x": x}, {"x": x.flip(-1)}], items, config, progress=False)
    history = pd.DataFrame(
        {
            "epoch": [1, 2],
            "test_accuracy": [0.5, 0.75],
            "test_loss": [1.0, 0.7],
            "train_loss": [2, 1],
        }
    )
    metric = MetricConfig(ks=(2, 4))
    parts = {
        (0.0, 0.05, 0): (result["depth"], result["tokens"], history),
        (0.2, 0.05, 0): (
            result["depth"],
            result["tokens"],
            history.assign(test_accuracy=[0.5, 0.6]),
        ),
    }
    data = grid_dataset(parts, metric)
    assert data["coupling"].sizes["sd"] == 2 and list(data["image"].values) == [
        "test00000",
        "test00001",
    ]
    assert list(data["image_label"].values) == ["3", "4"]
    assert float(data["test_accuracy"].sel(sd=0.2, wd=0.05, seed=0)) == 0.6
    assert data["test_accuracy_curve"].sizes["epoch"] == 2
    expected = coupling_dataset(result["depth"], metric)["coupling"]
    got = data["coupling"].sel(sd=0.0, wd=0.05, seed=0).rename(image="prompt")
    assert np.allclose(got.transpose(*expected.dims).values, expected.values)
    mis = token_coupling_dataset(result["tokens"], metric)["self_mis"].sel(layer=3, layer_ref=3)
    at = dict(reading="authors", norm="p", k=4, variant="ujv")
    values = mis.sel(**at).isel(prompt=0).values  # (token, token_ref)
    off = values[~np.eye(values.shape[0], dtype=bool)]
    summary = data["self_token_coupling"].sel(sd=0.0, wd=0.05, seed=0, token_layer=3, **at)
    assert float(summary.isel(token_image=0)) == pytest.approx(-off.mean())
    with pytest.raises(ValueError, match="other images"):
        other = result["depth"].assign_coords(prompt=["x", "y"])
        grid_dataset({**parts, (0.4, 0.05, 0): (other, result["tokens"], history)}, metric)


def test_check_config_names_the_sweep() -> None:
    from blockcoupling.cli import check_config_file

    summary, *warnings = check_config_file(REPO / "config" / "paper.yaml", REPO).splitlines()
    assert summary.endswith("ViT sweep: 64 ViTs on cifar10 (8 rates x 8 weight decays x 1 seeds)")
    assert all(line.startswith("warning: ") for line in warnings)  # K above d/8 (k_warnings)


def test_published_vit_weights_are_recorded_copies(tmp_path: Path) -> None:
    import runpy
    from types import SimpleNamespace

    from blockcoupling.files import manifest

    data = vision_data.write_prepared(vision_data.digits(0), tmp_path / "digits.npz")
    folder = tmp_path / "results" / "vit" / "train" / "sd0.0" / "wd0.05" / "seed0"  # rules/vit.smk
    output = _Outputs([str(folder / "model.safetensors"), str(folder / "history.csv")])
    output.model, output.history = output
    sm = SimpleNamespace(
        input=SimpleNamespace(data=str(data)),
        output=output,
        params=SimpleNamespace(run={**TINY.to_dict(), "epochs": 1, "warmup_epochs": 0}, code="t"),
        resources=SimpleNamespace(device="cpu"),
        log=[],
        rule="vit_train",
        threads=1,
    )
    runpy.run_path(str(REPO / "scripts" / "vit_train.py"), init_globals={"snakemake": sm})
    for path in output:
        assert Path(path).stat().st_nlink == 1  # a copy: damage to one is not damage to both
    assert manifest.verify(tmp_path / "results") == []


class _Outputs(list):
    """Snakemake's output list: every path, and the named ones as attributes."""


def test_combine_reads_each_point_from_files_that_hold_its_run(vit64, tmp_path: Path) -> None:
    """vit_combine pairs a grid point with its files by name and refuses a file whose attrs
    (written from the run config by vit_extract) hold another run."""
    from blockcoupling.files.io import write_netcdf
    from blockcoupling.vit.results import read_part

    model, x = vit64
    items = [PromptText("test00000", "3", "")]
    config = ExtractConfig(k_max=4, depth_token=0, token_layers=(), token_prompts=0)
    run = {"drop_path_rate": 0.1, "weight_decay": 0.05, "seed": 2}
    result = extract_inputs(model, [{"x": x}], items, config, run, progress=False)
    for kind in ("depth", "tokens"):
        write_netcdf(result[kind], tmp_path / f"{kind}.nc")
    (tmp_path / "history.csv").write_text("epoch,test_accuracy\n1,0.5\n")
    part = {kind: str(tmp_path / f"{kind}.nc") for kind in ("depth", "tokens")}
    part["history"] = str(tmp_path / "history.csv")
    point, (depth, _, history) = read_part({**part, "point": [0.1, 0.05, 2]})
    assert point == (0.1, 0.05, 2) and depth.sizes["prompt"] == 1 and len(history) == 1
    with pytest.raises(ValueError, match=r"depth\.nc holds the ViT run .*'seed': 2.*not the grid"):
        read_part({**part, "point": [0.1, 0.05, 3]})
