"""``extract()`` and ``coupling_dataset()`` on tiny models, against independent computations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import transformers
import xarray as xr
from tiny_models import ARCHITECTURES, VOCAB, CharTokenizer

from blockcoupling.coupling import formulas
from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.jacobians import statistics as coupling
from blockcoupling.jacobians import trajectories
from blockcoupling.jacobians.adapters import ADAPTERS, UnknownArchitectureError, blocks_of
from blockcoupling.jacobians.capture import record_calls, states
from blockcoupling.jacobians.engine import JacobianEngine
from blockcoupling.jacobians.extract import ExtractConfig, extract

PROMPTS = ["hello", "abc"]  # 5 and 3 tokens: the second is NaN-padded
K_MAX = 6
KS = (2, 6)
TOKEN_LAYERS = (2, -1)  # -> blocks 2 and 3
CONFIG = ExtractConfig(k_max=K_MAX, token_layers=TOKEN_LAYERS, token_prompts=1)
METRICS = MetricConfig(ks=KS)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return ARCHITECTURES["llama"]()


@pytest.fixture(scope="module")
def result(model) -> dict[str, xr.Dataset]:
    return extract(
        model, CharTokenizer(), PROMPTS, CONFIG, attrs={"model_id": "tiny-llama"}, progress=False
    )


@pytest.fixture(scope="module")
def metrics(result) -> xr.Dataset:
    return xr.merge(
        [
            coupling_dataset(result["depth"], METRICS),
            token_coupling_dataset(result["tokens"], METRICS),
        ],
        join="outer",
    )


def ids_of(text: str) -> torch.Tensor:
    return CharTokenizer()(text)["input_ids"]


# --- structure (docs/datasets.md) -----------------------------------------------------------------


def test_depth_dataset_layout(result) -> None:
    depth = result["depth"]
    assert set(depth.data_vars) == {
        "singular_values",
        "depth_diag",
        "depth_corner",
        "depth_ucorner",
        "depth_vcorner",
        "sv_sum2",
        "sv_sum4",
    }
    assert depth["depth_ucorner"].dims == ("prompt", "layer", "layer_ref", "k")
    assert depth["sv_sum2"].dims == ("prompt", "layer")
    assert depth.attrs["hidden_size"] == 16
    assert depth["singular_values"].dims == ("prompt", "layer", "rank")
    assert depth["depth_diag"].dims == ("variant", "prompt", "layer", "layer_ref", "rank")
    assert depth["depth_corner"].dims == ("variant", "prompt", "layer", "layer_ref", "k")
    assert dict(depth.sizes) == {
        "prompt": 2,
        "layer": 3,
        "layer_ref": 3,
        "rank": K_MAX,
        "k": K_MAX,
        "variant": 2,
    }
    assert list(depth["prompt"].values) == ["p0000", "p0001"]
    assert list(depth["layer"].values) == [1, 2, 3] and list(depth["k"].values) == list(
        range(1, K_MAX + 1)
    )
    assert list(depth["variant"].values) == ["ujv", "vju"]
    assert list(depth["n_tokens"].values) == [5, 3]
    assert list(depth["token_position"].values) == [4, 2]  # last token
    assert list(depth["prompt_source"].values) == ["text", "text"]
    assert depth.attrs["model_id"] == "tiny-llama" and depth.attrs["k_max"] == K_MAX
    assert np.isfinite(depth["depth_diag"]).all() and np.isfinite(depth["depth_corner"]).all()
    # singular values descending, corner sums non-decreasing in k
    assert (depth["singular_values"].diff("rank") <= 0).all()
    assert (depth["depth_corner"].diff("k") >= -1e-12).all()


def test_spectra_hold_the_full_spectrum(result) -> None:
    spectra = result["spectra"]
    assert spectra["singular_values"].dims == ("prompt", "layer", "rank")
    assert spectra.sizes["rank"] == 16  # d
    np.testing.assert_allclose(  # svdvals here, the SVD's own values there
        spectra["singular_values"].isel(rank=slice(0, K_MAX)),
        result["depth"]["singular_values"],
        rtol=1e-12,
    )


def test_spectra_only_for_the_first_spectra_prompts(model) -> None:
    out = extract(
        model, CharTokenizer(), PROMPTS, ExtractConfig(k_max=2, spectra_prompts=1), progress=False
    )
    assert list(out["spectra"]["prompt"].values) == ["p0000"]
    assert list(out["spectra"]["n_tokens"].values) == [5]
    assert out["depth"].sizes["prompt"] == 2
    none = extract(
        model, CharTokenizer(), PROMPTS, ExtractConfig(k_max=2, spectra_prompts=0), progress=False
    )
    assert "singular_values" not in none["spectra"] and none["spectra"].sizes["prompt"] == 0


def test_tokens_dataset_layout(result) -> None:
    tokens = result["tokens"]
    assert list(tokens["prompt"].values) == ["p0000"]  # token_prompts=1: the first prompt only
    assert list(tokens["layer"].values) == [2, 3] and list(tokens["layer_ref"].values) == [2, 3]
    assert tokens["singular_values"].dims == ("prompt", "layer", "token_in", "token_out", "rank")
    expected = {
        "self": ("token", "token_ref"),
        "fixed_in": ("token_in", "token", "token_ref"),
        "fixed_out": ("token_out", "token", "token_ref"),
    }
    for family, token_dims in expected.items():
        for stat, last in (("diag", "rank"), ("corner", "k")):
            assert tokens[f"{family}_{stat}"].dims == (
                "variant",
                "prompt",
                "layer",
                "layer_ref",
                *token_dims,
                last,
            )
        for stat in ("ucorner", "vcorner"):
            assert tokens[f"{family}_{stat}"].dims == (
                "prompt",
                "layer",
                "layer_ref",
                *token_dims,
                "k",
            )
    for stat in ("sv_sum2", "sv_sum4"):
        assert tokens[stat].dims == ("prompt", "layer", "token_in", "token_out")
    for dim in ("token", "token_ref", "token_in", "token_out"):
        assert tokens.sizes[dim] == 5
    s = tokens["singular_values"].isel(prompt=0, layer=0, rank=0).values
    assert np.isnan(s[np.tril_indices(5, -1)]).all(), "t1 > t2 is NaN (causality)"
    assert np.isfinite(s[np.triu_indices(5)]).all()
    fixed_in = (
        tokens["fixed_in_diag"].isel(variant=0, prompt=0, layer=0, layer_ref=0, rank=0).values
    )
    for t1 in range(5):  # token_in = t1: only t2, t2' >= t1
        assert np.isfinite(fixed_in[t1, t1:, t1:]).all() and np.isnan(fixed_in[t1, :t1]).all()
    fixed_out = (
        tokens["fixed_out_diag"].isel(variant=0, prompt=0, layer=0, layer_ref=0, rank=0).values
    )
    for t2 in range(5):  # token_out = t2: only t1, t1' <= t2
        assert (
            np.isfinite(fixed_out[t2, : t2 + 1, : t2 + 1]).all()
            and np.isnan(fixed_out[t2, t2 + 1 :]).all()
        )


def test_no_token_layers_gives_an_empty_tokens_dataset(model) -> None:
    out = extract(
        model, CharTokenizer(), ["abc"], ExtractConfig(k_max=2, token_prompts=3), progress=False
    )
    assert len(out["tokens"].data_vars) == 0
    metrics = token_coupling_dataset(out["tokens"], MetricConfig(ks=(2,)))
    assert "self_mis" not in metrics


def test_trajectories_layout_and_padding(result) -> None:
    traj = result["trajectories"]
    assert dict(traj.sizes) == {"prompt": 2, "token": 5, "layer": 4, "pc": 2}
    assert list(traj["layer"].values) == [0, 1, 2, 3]
    for name in ("lss", "expodistance", "spacing_cv"):
        assert traj[name].dims == ("prompt", "token")
        assert np.isfinite(traj[name].sel(prompt="p0000")).all()
        assert np.isfinite(traj[name].sel(prompt="p0001", token=[0, 1, 2])).all()
        assert np.isnan(traj[name].sel(prompt="p0001", token=[3, 4])).all()
    assert traj["step_norm"].dims == ("prompt", "layer", "token")
    assert np.isnan(traj["step_norm"].sel(layer=0)).all()
    assert traj["pca"].dims == ("prompt", "layer", "token", "pc")
    assert np.isnan(traj["pca"].sel(prompt="p0001", token=4)).all()
    assert traj["pca_explained"].dims == ("prompt", "pc")


def test_coupling_dataset_layout_and_summary(metrics) -> None:
    depth_mis = metrics["depth_mis"]
    assert set(depth_mis.dims) == {
        "reading",
        "variant",
        "norm",
        "k",
        "prompt",
        "layer",
        "layer_ref",
    }
    assert dict(depth_mis.sizes) == {
        "reading": 2,
        "variant": 2,
        "norm": 2,
        "k": 2,
        "prompt": 2,
        "layer": 3,
        "layer_ref": 3,
    }
    assert list(depth_mis["k"].values) == list(KS)
    values = depth_mis.transpose(
        "reading", "variant", "norm", "k", "prompt", "layer", "layer_ref"
    ).values
    assert np.isfinite(values).all() and (values >= 0).all()
    off = ~np.eye(3, dtype=bool)
    np.testing.assert_allclose(
        metrics["coupling"].transpose("reading", "variant", "norm", "k", "prompt").values,
        -values[..., off].mean(axis=-1),
        rtol=1e-12,
    )
    adjacent = np.abs(np.subtract.outer(np.arange(3), np.arange(3))) == 1
    np.testing.assert_allclose(
        metrics["adjacent_coupling"].transpose("reading", "variant", "norm", "k", "prompt").values,
        -values[..., adjacent].mean(axis=-1),
        rtol=1e-12,
    )
    # ujv of a Jacobian in its own basis is zero
    own = depth_mis.sel(variant="ujv").values
    assert np.abs(np.diagonal(own, axis1=-2, axis2=-1)).max() < 1e-6
    for family in ("self", "fixed_in", "fixed_out"):
        assert f"{family}_mis" in metrics


# --- against independent computations ------------------------------------------------------------


def test_depth_mis_equals_direct_computation(model, metrics) -> None:
    """J^l_tt at the last token from JacobianEngine, then coupling.depth_mis_coupling."""
    for p, text in enumerate(PROMPTS):
        engine = JacobianEngine(model, {"input_ids": ids_of(text)})
        t = len(text) - 1
        jacs = torch.stack([engine.output_token(layer, t)[t] for layer in (1, 2, 3)])
        for reading, variant, norm, k in itertools.product(
            formulas.READINGS, formulas.VARIANTS, formulas.NORMS, KS
        ):
            direct = coupling.depth_mis_coupling(
                jacs, k, reading=reading, variant=variant, norm=norm
            )
            stored = metrics["depth_mis"].sel(
                prompt=f"p{p:04d}", reading=reading, variant=variant, norm=norm, k=k
            )
            np.testing.assert_allclose(
                stored.transpose("layer", "layer_ref").values,
                direct,
                rtol=0,
                atol=1e-7,
                err_msg=f"{text} {reading} {variant} {norm} K={k}",
            )


def overlap_corners(jac_i: torch.Tensor, jac_j: torch.Tensor, k_max: int) -> np.ndarray:
    """``(2, k_max)``: ||U_{i,k}^T U_{j,k}||_F^2 and the same for V, k = 1..k_max (numpy SVDs)."""
    u_i, _, vt_i = np.linalg.svd(jac_i.double().numpy())
    u_j, _, vt_j = np.linalg.svd(jac_j.double().numpy())
    return np.array(
        [
            [np.sum((u_i[:, :k].T @ u_j[:, :k]) ** 2) for k in range(1, k_max + 1)],
            [np.sum((vt_i[:k] @ vt_j[:k].T) ** 2) for k in range(1, k_max + 1)],
        ]
    )


def test_depth_overlap_and_spectrum_sums_equal_direct_computation(model, result) -> None:
    """Basis corner sums and full-spectrum sums against numpy SVDs of the engine's Jacobians."""
    depth = result["depth"]
    for p, text in enumerate(PROMPTS):
        engine = JacobianEngine(model, {"input_ids": ids_of(text)})
        t = len(text) - 1
        jacs = [engine.output_token(layer, t)[t] for layer in (1, 2, 3)]
        for i, j in itertools.product(range(3), range(3)):
            stored = depth[["depth_ucorner", "depth_vcorner"]].isel(prompt=p, layer=i, layer_ref=j)
            np.testing.assert_allclose(
                [stored["depth_ucorner"].values, stored["depth_vcorner"].values],
                overlap_corners(jacs[i], jacs[j], K_MAX),
                atol=1e-6,
            )
        s = np.stack([np.linalg.svd(jac.double().numpy(), compute_uv=False) for jac in jacs])
        np.testing.assert_allclose(depth["sv_sum2"].isel(prompt=p), (s**2).sum(-1), rtol=1e-6)
        np.testing.assert_allclose(depth["sv_sum4"].isel(prompt=p), (s**4).sum(-1), rtol=1e-6)


def test_token_overlap_and_spectrum_sums_equal_direct_computation(model, result) -> None:
    """Every family's basis corner sums (a few entries) and every J_{t1 t2}'s spectrum sums."""
    tokens = result["tokens"].isel(prompt=0)
    jacs = token_jacobians(model, "hello", (2, 3))
    for (layer, t1, t2), jac in jacs.items():
        s = np.linalg.svd(jac.double().numpy(), compute_uv=False)
        where = dict(layer=layer, token_in=t1, token_out=t2)
        assert float(tokens["sv_sum2"].sel(**where)) == pytest.approx((s**2).sum(), rel=1e-6)
        assert float(tokens["sv_sum4"].sel(**where)) == pytest.approx((s**4).sum(), rel=1e-6)
    cases = {  # stored coords -> (J_i, J_j) keys
        "self": (dict(token=1, token_ref=3), (2, 1, 1), (3, 3, 3)),
        "fixed_in": (dict(token_in=1, token=2, token_ref=4), (2, 1, 2), (3, 1, 4)),
        "fixed_out": (dict(token_out=3, token=0, token_ref=2), (2, 0, 3), (3, 2, 3)),
    }
    for family, (where, i, j) in cases.items():
        u, v = (
            tokens[f"{family}_{stat}"].sel(layer=2, layer_ref=3, **where).values
            for stat in ("ucorner", "vcorner")
        )
        np.testing.assert_allclose(
            [u, v], overlap_corners(jacs[i], jacs[j], K_MAX), atol=1e-6, err_msg=family
        )


def test_depth_token_option(model) -> None:
    out = extract(
        model, CharTokenizer(), ["hello"], ExtractConfig(k_max=3, depth_token=1), progress=False
    )
    assert int(out["depth"]["token_position"].item()) == 1
    engine = JacobianEngine(model, {"input_ids": ids_of("hello")})
    s = torch.linalg.svdvals(engine.output_token(2, 1)[1])[:3]
    np.testing.assert_allclose(
        out["depth"]["singular_values"].sel(layer=2).values[0], s.numpy(), rtol=1e-10
    )


def token_jacobians(
    model: torch.nn.Module, text: str, layers: tuple[int, ...]
) -> dict[tuple[int, int, int], torch.Tensor]:
    """Every J^l_{t1 t2} (t1 <= t2), keyed (layer, t1, t2), one output token at a time."""
    engine = JacobianEngine(model, {"input_ids": ids_of(text)})
    n = len(text)
    jacs = {}
    for layer in layers:
        for t2 in range(n):
            block = engine.output_token(layer, t2)
            for t1 in range(t2 + 1):
                jacs[(layer, t1, t2)] = block[t1]
    return jacs


def check_token_families(
    model: torch.nn.Module, text: str, layers: tuple[int, ...], k: int
) -> None:
    """Every stored entry of the three families against coupling.mis_coupling on the engine's
    Jacobians (one reading, variant, norm), and one entry of each for every option."""
    out = extract(
        model,
        CharTokenizer(),
        [text],
        ExtractConfig(k_max=k, token_layers=layers, token_prompts=1),
        progress=False,
    )
    metrics = token_coupling_dataset(out["tokens"], MetricConfig(ks=(k,)))
    jacs = token_jacobians(model, text, layers)
    n = len(text)

    def pairs(family: str):
        """(stored coords, (l, t1, t2) of J_i, (l', t1', t2') of J_j) for every stored entry."""
        for layer, layer_ref in itertools.product(layers, layers):
            if family == "self":
                for t, tr in itertools.product(range(n), range(n)):
                    yield (
                        dict(layer=layer, layer_ref=layer_ref, token=t, token_ref=tr),
                        (layer, t, t),
                        (layer_ref, tr, tr),
                    )
            elif family == "fixed_in":
                for t1 in range(n):
                    for t2, t2r in itertools.product(range(t1, n), range(t1, n)):
                        yield (dict(layer=layer, layer_ref=layer_ref,
                                    token_in=t1, token=t2, token_ref=t2r),
                               (layer, t1, t2), (layer_ref, t1, t2r))  # fmt: skip
            else:
                for t2 in range(n):
                    for t1, t1r in itertools.product(range(t2 + 1), range(t2 + 1)):
                        yield (dict(layer=layer, layer_ref=layer_ref,
                                    token_out=t2, token=t1, token_ref=t1r),
                               (layer, t1, t2), (layer_ref, t1r, t2))  # fmt: skip

    for family in ("self", "fixed_in", "fixed_out"):
        stored = metrics[f"{family}_mis"].isel(prompt=0)
        fixed = stored.sel(reading="offdiag", variant="ujv", norm="p", k=k)
        count = 0
        for where, i, j in pairs(family):
            direct = coupling.mis_coupling(
                jacs[i], jacs[j], k, reading="offdiag", variant="ujv", norm="p"
            )
            assert float(fixed.sel(**where)) == pytest.approx(direct, abs=1e-7), f"{family} {where}"
            count += 1
        assert int(np.isfinite(fixed.values).sum()) == count, (
            f"{family}: entries outside the family are NaN"
        )
        where, i, j = list(pairs(family))[-3]
        for reading, variant, norm in itertools.product(
            formulas.READINGS, formulas.VARIANTS, formulas.NORMS
        ):
            direct = coupling.mis_coupling(
                jacs[i], jacs[j], k, reading=reading, variant=variant, norm=norm
            )
            got = float(stored.sel(reading=reading, variant=variant, norm=norm, k=k, **where))
            assert got == pytest.approx(direct, abs=1e-7), (
                f"{family} {where} {reading} {variant} {norm}"
            )


def test_token_families_equal_direct_computation(model) -> None:
    check_token_families(model, "hello", (2, 3), k=4)


def tiny_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=32, max_position_embeddings=32, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.BertModel(config).double().eval()


def test_token_families_of_a_non_causal_model() -> None:
    check_token_families(tiny_bert(), "hello", (1, 2), k=4)


def test_trajectories_equal_direct_computation(model, result) -> None:
    traj = result["trajectories"]
    for p, text in enumerate(PROMPTS):
        x = states(record_calls(model, input_ids=ids_of(text))).double().numpy()
        n = len(text)
        row = traj.isel(prompt=p, token=slice(0, n))
        np.testing.assert_allclose(row["lss"], trajectories.line_shape_score(x), rtol=1e-12)
        np.testing.assert_allclose(row["expodistance"], trajectories.expodistance(x), rtol=1e-12)
        np.testing.assert_allclose(row["spacing_cv"], trajectories.spacing_cv(x), rtol=1e-12)
        np.testing.assert_allclose(
            row["step_norm"].isel(layer=slice(1, None)), trajectories.step_norms(x), rtol=1e-12
        )
        projection, explained = trajectories.pca_projection(x, 2)
        np.testing.assert_allclose(row["pca"], projection, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(traj["pca_explained"].isel(prompt=p), explained, rtol=1e-12)


# --- bad input and side effects ----------------------------------------------------------------


@pytest.mark.parametrize(
    "prompts, config, message",
    [
        (["   "], ExtractConfig(k_max=2), "is empty"),
        (["x" * 33], ExtractConfig(k_max=2), "longer than the model's context of 32"),
        (["hello"], ExtractConfig(k_max=100), "K=100 exceeds the hidden size d=16"),
        (
            ["hello"],
            ExtractConfig(k_max=2, token_layers=(4,), token_prompts=1),
            "token layer 4 is outside 1..3",
        ),
        (
            ["hello"],
            ExtractConfig(k_max=2, token_layers=(-4,), token_prompts=1),
            "token layer -4 is outside",
        ),
        ([], ExtractConfig(k_max=2), "no prompts given"),
        (["a"], ExtractConfig(k_max=2), "at least 2 are needed"),
    ],
)
def test_bad_input_gets_one_clear_error(model, prompts, config, message) -> None:
    with pytest.raises(ValueError, match=message):
        extract(model, CharTokenizer(), prompts, config, progress=False)


def test_bad_metric_options() -> None:
    with pytest.raises(ValueError, match="reading 'x'"):
        MetricConfig(readings=("x",))
    with pytest.raises(ValueError, match="norm 'x'"):
        MetricConfig(norms=("x",))
    with pytest.raises(ValueError, match="variant 'x'"):
        ExtractConfig(variants=("x",))


def test_k_above_k_max_is_refused(result) -> None:
    with pytest.raises(ValueError, match=f"K=10 exceeds K_max={K_MAX}"):
        coupling_dataset(result["depth"], MetricConfig(ks=(10,)))


def test_unknown_architecture_names_the_supported_ones() -> None:
    class Mystery(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = transformers.PretrainedConfig()
            self.config.model_type = "mystery"
            self.layer = torch.nn.Linear(4, 4)

    with pytest.raises(UnknownArchitectureError, match="ADAPTERS") as error:
        extract(Mystery(), CharTokenizer(), ["hello"], ExtractConfig(k_max=2), progress=False)
    text = str(error.value)
    assert "'mystery'" in text
    assert all(name in text for name in ("llama", "gpt2", "gpt_neox", "falcon", "opt"))
    assert len(ADAPTERS) > 5


def test_attention_implementation_is_switched_and_restored() -> None:
    model = ARCHITECTURES["gpt2"](layers=2)
    model.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "sdpa"
    seen = []
    handle = blocks_of(model)[0].register_forward_pre_hook(
        lambda *_: seen.append(model.config._attn_implementation)
    )
    try:
        extract(model, CharTokenizer(), ["hello"], ExtractConfig(k_max=2), progress=False)
    finally:
        handle.remove()
    assert seen and set(seen) == {"eager"}
    assert model.config._attn_implementation == "sdpa"


def test_attention_is_restored_after_an_error() -> None:
    model = ARCHITECTURES["gpt2"](layers=2)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        blocks_of(model)[1].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError):
        extract(model, CharTokenizer(), ["hello"], ExtractConfig(k_max=2), progress=False)
    assert model.config._attn_implementation == "sdpa"


def test_merged_prompt_shards_equal_one_job_over_every_prompt(model) -> None:
    """Shards of 2, 2 and 1 prompts (token families on the first 3 prompts, spectra on the first
    one) merge into exactly the datasets of one job: values, padding, coords and attrs."""
    from blockcoupling.jacobians.datasets import merge_shards

    texts = ["hello", "abc", "fourteen", "xy", "abcdefg"]
    config = ExtractConfig(k_max=3, token_layers=(-1,), token_prompts=3, spectra_prompts=1)
    ids = [f"p{i:04d}" for i in range(len(texts))]
    items = [{"id": i, "text": t} for i, t in zip(ids, texts)]
    whole = extract(model, CharTokenizer(), items, config, progress=False)
    parts = [
        extract(model, CharTokenizer(), items[first:stop], config.for_shard(first), progress=False)
        for first, stop in ((0, 2), (2, 4), (4, 5))
    ]
    for name, dataset in whole.items():
        merged = merge_shards([part[name] for part in parts])
        xr.testing.assert_identical(merged, dataset)
        for var in dataset.variables:
            assert merged[var].dtype == dataset[var].dtype, (name, var)


def test_token_max_tokens_keeps_the_first_tokens_of_the_families(model, result) -> None:
    """Causal: the families over the first 3 tokens are the corner of those over all 5."""
    config = ExtractConfig(
        k_max=K_MAX, token_layers=TOKEN_LAYERS, token_prompts=1, token_max_tokens=3
    )
    short = extract(model, CharTokenizer(), PROMPTS, config, progress=False)["tokens"]
    assert short.sizes["token"] == 3 and int(short["n_tokens"][0]) == 3
    corner = result["tokens"].isel(token=slice(0, 3), token_ref=slice(0, 3))
    corner = corner.isel(token_in=slice(0, 3), token_out=slice(0, 3))
    for name in ("singular_values", "self_diag", "fixed_in_corner", "fixed_out_diag"):
        np.testing.assert_allclose(short[name], corner[name], rtol=1e-10, atol=1e-12)
