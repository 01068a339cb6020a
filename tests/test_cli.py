"""The blockcoupling CLI: check-config, measure, power; one config flag, every flag with help."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO

from blockcoupling import cli
from blockcoupling.cli.parser import build_parser, configfiles


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def test_cli_check_config(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["check-config", "--configfile", str(REPO / "config" / "smoke.yaml")]) == 0
    assert "ok." in capsys.readouterr().out
    bad = load("config/smoke.yaml")
    bad["stats"]["k"] = 7
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["check-config", "--configfile", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert "stats.k=7 is not in metrics.ks" in err and "Traceback" not in err
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump({**load("config/smoke.yaml"), "extrct": {}}))
    assert cli.main(["check-config", "--configfile", str(tmp_path / "typo.yaml")]) == 2
    assert "extrct" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A three-block tiny llama (d = 16) with a one-letter word-level tokenizer, saved."""
    import tiny_models
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny") / "m"
    tiny_models.llama(layers=3).to(dtype=torch.float32).save_pretrained(folder)
    vocab = {chr(97 + i): i for i in range(26)} | {"[UNK]": 26}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(folder)
    return folder


def test_cli_measure_prints_the_coupling_summary(
    tiny_folder: Path, capsys: pytest.CaptureFixture
) -> None:
    # in this process: the worker has torch loaded (the command line's entry point runs in
    # tests/test_fetch.py and CI)
    assert cli.main(["measure", str(tiny_folder), "hello there", "--k", "4"]) == 0
    out = capsys.readouterr()
    assert "3 blocks" in out.out and "p0000" in out.out and "mean" in out.out, out.err[-2000:]
    # a missing model: one line, checked in this process (an exception escaping main fails the
    # test as a traceback would fail the command line)
    assert cli.main(["measure", "no/such/model", "x"]) == 2
    assert "no such path" in capsys.readouterr().err
    assert cli.main(["measure", str(tiny_folder), "x", "--out", "no/such/folder/m.nc"]) == 2
    assert "--out no/such/folder/m.nc: name a .nc file" in capsys.readouterr().err


def independent_summary(
    folder: Path, prompts: list[str], k: int
) -> tuple[dict[str, np.ndarray], float]:
    """The quick command's numbers per prompt, and the median effective rank over prompts and
    blocks, from the library's datasets: each summary
    recomputed from the per-pair values (the m_K matrix, the per-block null, the overlaps, the
    stored spectra's sums), not read from the summaries the command prints.
    """
    from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset
    from blockcoupling.jacobians.extract import ExtractConfig, extract
    from blockcoupling.lm.models import load_model
    from blockcoupling.lm.sources import parse_source

    model, tokenizer = load_model(parse_source({"path": str(folder)}))
    depth = extract(model, tokenizer, prompts, ExtractConfig(k_max=k, variants=("ujv",)))["depth"]
    data = coupling_dataset(depth, MetricConfig(ks=(k,), readings=("authors",)))
    at = {"k": k, "reading": "authors", "norm": "p"}
    mis = data["depth_mis"].sel({**at, "variant": "ujv"}).transpose("prompt", "layer", "layer_ref")
    off = ~np.eye(mis.sizes["layer"], dtype=bool)
    overlap = data["depth_overlap_u"].sel(k=k).transpose("prompt", "layer", "layer_ref").values
    rank = (depth["sv_sum2"] ** 2 / depth["sv_sum4"]).transpose("prompt", "layer").values
    coupling = -mis.values[:, off].mean(axis=1)
    chance = -data["depth_null"].sel(at).transpose("prompt", "layer").values.mean(axis=1)
    return {
        "coupling": coupling,
        "coupling_null": chance,
        "coupling_excess": coupling - chance,
        "overlap_u": overlap[:, off].mean(axis=1),
        "overlap_null": np.full(len(prompts), k / depth.attrs["hidden_size"]),
        "effective_rank": np.median(rank, axis=1),
        "tokens": depth["n_tokens"].values,
    }, float(np.median(rank))


def test_cli_measure_json_and_out_equal_the_library_s_values(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import json

    import xarray as xr

    prompts = ["hello there", "abc def gh"]
    out = tmp_path / "m.nc"
    args = ["measure", str(tiny_folder), *prompts, "--k", "4"]
    assert cli.main([*args, "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    expected, rank = independent_summary(tiny_folder, prompts, 4)
    assert summary["blocks"] == 3 and summary["d_model"] == 16 and summary["k"] == 4
    assert [p["text"] for p in summary["prompts"]] == prompts
    for name, values in expected.items():
        got = [p[name] for p in summary["prompts"]]
        assert np.allclose(got, values, rtol=1e-6, atol=1e-9), (name, got, values)
        if name not in ("effective_rank", "tokens"):
            assert np.isclose(summary["mean"][name], values.mean(), rtol=1e-6), name
    assert summary["mean"]["effective_rank"] == pytest.approx(rank, rel=1e-6)
    # --out: the coupling dataset, CF-labelled, reads back with the same values
    written = xr.open_dataset(out)
    assert written.attrs["Conventions"].startswith("CF-")
    assert all("long_name" in v.attrs and "units" in v.attrs for v in written.data_vars.values())
    excess = written["coupling_excess"].sel(k=4, reading="authors", norm="p", variant="ujv")
    assert np.allclose(excess.values, expected["coupling_excess"], rtol=1e-6)
    # the table: raw coupling beside its chance level and the excess, one line on reading them
    assert cli.main(args) == 0
    table = capsys.readouterr().out
    header = next(line for line in table.splitlines() if line.startswith("prompt"))
    assert header.split() == ["prompt", "tokens", "coupling", "chance", "excess"] + [
        "overlap",
        "K/d",
        "eff.rank",
    ]
    mean = next(line for line in table.splitlines() if line.startswith("mean")).split()
    assert float(mean[2]) == pytest.approx(summary["mean"]["coupling_null"], abs=1e-4)
    assert float(mean[3]) == pytest.approx(summary["mean"]["coupling_excess"], abs=1e-4)
    assert "how to read:" in table


def test_cli_power_writes_the_pilot_s_power_and_keeps_other_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``blockcoupling power``: the table written is the pilot's power at the declared effects
    (the noncentral t, scipy's), the design's n taken from --n, and --only keeps the other rows.
    """
    import pandas as pd
    from scipy import stats as sps

    se = 0.1 / sps.t.ppf(0.975, 9)
    rows = [
        dict(analysis=a, estimate=0.1, ci_low=0.0, ci_high=0.2, n=10, note="x; t(9)")
        for a in ("a", "b")
    ]
    pilot = tmp_path / "analyses.csv"
    pd.DataFrame(rows).to_csv(pilot, index=False)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"stats": {"primary": {"a": {"effect": 0.1}, "b": {"effect": 0.2}}}})
    )
    out = tmp_path / "power.csv"
    args = ["power", str(pilot), "--configfile", str(config), "--out", str(out)]
    assert cli.main([*args, "--n", "b=20"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    table = pd.read_csv(out).set_index("analysis")
    alpha = 0.05 / 2  # Holm's first threshold over the two
    for analysis, effect, n in (("a", 0.1, 10), ("b", 0.2, 20)):
        df, scale = 9 + n - 10, se * np.sqrt(10 / n)
        crit = sps.t.ppf(1 - alpha / 2, df)
        exact = sps.nct.sf(crit, df, effect / scale) + sps.nct.cdf(-crit, df, effect / scale)
        assert table.loc[analysis, "n"] == n
        assert table.loc[analysis, "power"] == pytest.approx(exact, abs=0.012), analysis
    pd.DataFrame([{**rows[0], "ci_high": 0.4}, rows[1]]).to_csv(pilot, index=False)
    assert cli.main([*args, "--only", "a"]) == 0
    again = pd.read_csv(out).set_index("analysis")
    assert again.loc["a", "power"] < table.loc["a", "power"]  # a wider interval: less power
    assert again.loc["b"].equals(table.loc["b"])  # kept as --n b=20 wrote it
    capsys.readouterr()
    assert cli.main([*args, "--n", "c=5"]) == 2
    assert "--n c=5: give ID=N, a test of stats.primary" in capsys.readouterr().err
    capsys.readouterr()
    refused = ["power", str(pilot), "--configfile", str(config), "--out", "resources/power.csv"]
    assert cli.main(refused) == 2  # the config's stats.power_file: pilot power's alone
    assert "which blockcoupling pilot power writes" in capsys.readouterr().err


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_flag_of_every_subcommand_has_help() -> None:
    missing = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in subcommands().items()
        for action in sub._actions
        if not action.help  # SUPPRESS (a deprecated spelling, hidden) is a help string
    ]
    assert not missing, missing


def test_every_command_that_reads_a_config_takes_configfile() -> None:
    """One flag, Snakemake's, on every command that reads a config file."""
    for name, sub in subcommands().items():
        flags = {flag for action in sub._actions for flag in action.option_strings}
        reads = name in ("check-config", "plan", "power", "pilot")
        assert ("--configfile" in flags) == reads, name


def test_maintainer_commands_are_listed_apart_in_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    users, maintainers = text.split("maintainer commands")
    for name in ("measure", "check-config", "plan", "fetch", "verify"):
        assert f"\n    {name}" in users, name
    for name in ("claims", "docs", "pilot", "power"):
        assert f"\n    {name} " not in users and f"\n  {name} " in maintainers, name


def test_older_config_flags_still_work_with_a_deprecation_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    smoke = str(REPO / "config" / "smoke.yaml")
    assert cli.main(["check-config", smoke]) == 0
    captured = capsys.readouterr()
    assert "ok." in captured.out
    assert "FILE is deprecated; use --configfile FILE" in captured.err
    assert cli.main(["check-config", smoke, "--configfile", smoke]) == 2
    assert "give the config once" in capsys.readouterr().err
    args = build_parser().parse_args(["pilot", "power", "--config", smoke])
    assert configfiles(args) == [Path(smoke)]
    assert "--config FILE is deprecated" in capsys.readouterr().err
    args = build_parser().parse_args(["pilot", "power"])
    assert configfiles(args) == [Path("config.yaml")]  # the default, no line
    assert capsys.readouterr().err == ""


def test_configfile_layers_files_as_snakemake_does(tmp_path: Path) -> None:
    """Later files win, nested sections merged: the layered config is Snakemake's own."""
    from snakemake.utils import update_config

    from blockcoupling.cli.config_commands import layered

    base, top = load("config/smoke.yaml"), {"stats": {"k": 2}}
    (tmp_path / "top.yaml").write_text(yaml.safe_dump(top))
    merged = layered([REPO / "config" / "smoke.yaml", tmp_path / "top.yaml"])
    expected = load("config/smoke.yaml")
    update_config(expected, top)
    assert merged == expected and merged["stats"]["k"] == 2
    assert merged["stats"]["n_boot"] == base["stats"]["n_boot"]
