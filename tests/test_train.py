"""The Shakespeare corpus split and the small GPT-NeoX training loop (tiny configs, seconds
each)."""

from __future__ import annotations

import csv
import logging
import os
import runpy
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from blockcoupling.files import manifest
from blockcoupling.lm.text import corpus
from blockcoupling.lm.training.checkpoints import damage
from blockcoupling.lm.training.data import (
    generator,
    passages,
    split_texts,
    training_subset,
    windows,
)
from blockcoupling.lm.training.schedule import TrainConfig, checkpoint_schedule
from blockcoupling.lm.training.train import train

TINY = TrainConfig(
    n_layers=2,
    d_model=32,
    n_heads=2,
    context_length=32,
    batch_size=8,
    learning_rate=3e-3,
    total_steps=16,
    vocab_size=300,
    n_even_checkpoints=4,
    n_val_windows=16,
    max_train_chars=150_000,
)


def _weights(step_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(step_dir / "model.safetensors")


def _history(run: Path) -> list[dict[str, float]]:
    with (run / "history.csv").open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "run"
    train(TINY, out, progress=False, threads=1)
    return out


def test_split_is_by_play_and_seeded() -> None:
    train_a, val_a = corpus.split_plays(0)
    assert not set(train_a) & set(val_a)
    assert sorted(train_a + val_a) == sorted(corpus.plays()) and len(val_a) == 4
    assert corpus.split_plays(0) == (train_a, val_a)
    assert corpus.split_plays(1)[1] != val_a
    with pytest.raises(ValueError, match=r"validation_fraction must be in \(0, 1\), got 1.0"):
        corpus.split_plays(0, validation_fraction=1.0)


def test_plays_are_plain_text() -> None:
    texts = corpus.plays()
    assert len(texts) == 38
    hamlet = texts["hamlet"]
    assert "HAMLET\nTo be, or not to be" in hamlet
    assert not any(mark in hamlet for mark in ("**", "#", "\\[", "_"))


@pytest.mark.parametrize("total,n_even", [(1, 1), (16, 4), (1000, 10), (143000, 143), (37, 5)])
def test_checkpoint_schedule(total: int, n_even: int) -> None:
    steps = checkpoint_schedule(total, n_even)
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == total
    spacing = total / n_even
    evens = [round(k * spacing) for k in range(1, n_even + 1)]
    assert set(evens) <= set(steps)
    assert all(
        s & (s - 1) == 0 for s in steps if 0 < s < evens[0]
    )  # powers of two before the even part
    assert 1 in steps


def test_checkpoint_schedule_like_pythia() -> None:
    steps = checkpoint_schedule(143000, 143)
    assert steps[:12] == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000] and len(steps) == 154
    with pytest.raises(ValueError, match="need total_steps >= 1 and n_even >= 1, got 0, 3"):
        checkpoint_schedule(0, 3)


def test_checkpoints_load_and_loss_drops(run: Path) -> None:
    assert sorted(int(p.name[4:]) for p in run.glob("step*")) == TINY.steps
    assert not list(run.glob("*.tmp"))
    model = AutoModelForCausalLM.from_pretrained(run / f"step{TINY.total_steps}")
    tokenizer = AutoTokenizer.from_pretrained(run / f"step{TINY.total_steps}")
    assert model.config.model_type == "gpt_neox" and model.config.num_hidden_layers == 2
    assert model.dtype == torch.float32 and model.config.use_parallel_residual
    assert (
        tokenizer.eos_token == tokenizer.bos_token == "<|endoftext|>"
        and tokenizer.pad_token is not None
    )
    text = "To be, or not to be: that is the question."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    hist = _history(run)
    assert [int(r["step"]) for r in hist] == TINY.steps
    assert hist[-1]["val_loss"] < hist[0]["val_loss"] - 0.3
    assert hist[-1]["train_loss"] < hist[0]["train_loss"]
    assert hist[-1]["tokens_seen"] == TINY.total_steps * TINY.batch_size * TINY.context_length
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in hist)
    assert (run / "step0" / "trainer_state.pt").is_file()
    assert [p.parent.name for p in run.glob("step*/optimizer.pt")] == [f"step{TINY.total_steps}"]


def test_same_seed_same_weights_other_seed_differs(run: Path, tmp_path: Path) -> None:
    train(TINY, tmp_path / "again", progress=False, threads=1)
    final = f"step{TINY.total_steps}"
    a, b = _weights(run / final), _weights(tmp_path / "again" / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = TrainConfig(**{**TINY.__dict__, "seed": 1, "total_steps": 1, "checkpoint_steps": None})
    train(other, tmp_path / "other", progress=False, threads=1)
    c = _weights(tmp_path / "other" / "step0")
    assert not torch.equal(
        c["gpt_neox.embed_in.weight"], _weights(run / "step0")["gpt_neox.embed_in.weight"]
    )


def test_resume_gives_the_uninterrupted_weights(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    last = train(TINY, out, progress=False, threads=1, stop_after=5)
    assert last.name == "step8" and not (out / "step12").exists()
    assert [int(r["step"]) for r in _history(out)] == [0, 1, 2, 4, 8]
    shutil.copytree(out / "step8", out / "step12.tmp")  # debris of a kill during a checkpoint write
    last = train(TINY, out, progress=False, threads=1)
    assert last.name == f"step{TINY.total_steps}" and not list(out.glob("*.tmp"))
    a, b = _weights(run / last.name), _weights(last)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["val_loss"] for r in _history(out)] == [r["val_loss"] for r in _history(run)]
    with pytest.raises(ValueError, match="different TrainConfig"):
        train(TrainConfig(**{**TINY.__dict__, "learning_rate": 1e-3}), out, progress=False)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="checkpoint_steps"):
        TrainConfig(total_steps=10, checkpoint_steps=[20])


def test_a_truncated_checkpoint_is_found_and_retrained(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "damaged"
    shutil.copytree(run, out)
    final = out / f"step{TINY.total_steps}" / "model.safetensors"
    before = final.stat()
    final.write_bytes(final.read_bytes()[: before.st_size // 2])  # a kill during a copy, say
    os.utime(final, ns=(before.st_atime_ns, before.st_mtime_ns))
    with caplog.at_level(logging.WARNING):
        last = train(TINY, out, progress=False, threads=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith(f"{final} is damaged")
    a, b = _weights(run / last.name), _weights(last)  # retrained: the same weights again
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert damage(last) is None
    assert [r["val_loss"] for r in _history(out)] == [r["val_loss"] for r in _history(run)]


def test_a_damaged_older_checkpoint_is_retrained_with_every_later_one(
    run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "damaged"
    shutil.copytree(run, out)
    (out / "step2" / "tokenizer.json").write_text("{}")
    assert damage(out / "step2") == f"{out / 'step2' / 'tokenizer.json'} is damaged " + (
        "(its SHA-256 differs from the one written with it)"
    )
    assert damage(out / "step4") is None  # intact, though its optimizer state was dropped
    train(TINY, out, progress=False, threads=1)
    assert all(damage(out / f"step{s}") is None for s in TINY.steps)
    a, b = _weights(run / "step2"), _weights(out / "step2")
    assert all(torch.equal(a[k], b[k]) for k in a)


class _Outputs(list):
    """Snakemake's output list: every path, and the named ones as attributes."""


def test_published_checkpoints_are_recorded_copies_following_the_umask(tmp_path: Path) -> None:
    one = TrainConfig(**{**TINY.__dict__, "total_steps": 1, "checkpoint_steps": None})
    run_dir = tmp_path / "results" / "train" / "one"
    checkpoints = [str(run_dir / f"step{s}" / "model.safetensors") for s in one.steps]
    output = _Outputs([*checkpoints, str(run_dir / "history.csv")])
    output.checkpoints, output.history = checkpoints, output[-1]
    sm = SimpleNamespace(
        params=SimpleNamespace(spec=one.__dict__, code="test"),
        output=output,
        log=[],
        rule="train_one",
        threads=1,
    )
    script = Path(__file__).parents[1] / "scripts" / "train.py"
    previous = os.umask(0o027)
    try:
        runpy.run_path(str(script), init_globals={"snakemake": sm})
    finally:
        os.umask(previous)
    (work,) = run_dir.glob("work-*")
    for step in one.steps:
        published = run_dir / f"step{step}" / "model.safetensors"
        assert published.stat().st_nlink == 1  # a copy: damage to one is not damage to both
        assert published.read_bytes() == (work / f"step{step}" / "model.safetensors").read_bytes()
        files = [*(work / f"step{step}").iterdir(), *published.parent.iterdir()]
        assert {p.stat().st_mode & 0o777 for p in files if p.is_file()} == {0o640}
    assert manifest.verify(tmp_path / "results") == []
    published.write_bytes(b"garbage")
    assert manifest.verify(tmp_path / "results") == [
        f"{published}: differs from its record (changed since its job wrote it)"
    ]

    for fraction in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="data_fraction"):
            TrainConfig(data_fraction=fraction)


def test_passages_cut_at_line_ends_and_rebuild_the_text() -> None:
    text = corpus.plays()["hamlet"][:20_000]
    pieces = passages(text, 500)
    assert "".join(pieces) == text
    assert all(p.endswith("\n") and len(p) >= 500 for p in pieces[:-1])
    assert all(p.count("\n") == 1 or len(p[: p[:-1].rfind("\n") + 1]) < 500 for p in pieces[:-1])


def test_training_subset_is_seeded_nested_and_the_right_size() -> None:
    texts = [corpus.plays()[s][:30_000] for s in ("hamlet", "macbeth", "othello")]
    total = sum(map(len, texts))
    assert training_subset(texts, 1.0, 0) == texts
    small, large = (training_subset(texts, f, 0, passage_chars=1000) for f in (0.1, 0.5))
    for fraction, part in ((0.1, small), (0.5, large)):
        size = sum(map(len, part))
        assert fraction * total <= size < fraction * total + 2_000  # one passage more at most
        assert all(any(p in t for t in texts) for p in part)  # pieces of the text, in order
    # nested: every line of the 10% text is in the 50% text at the same place of its play
    positions = {(i, t.find(p)) for p in small for i, t in enumerate(texts) if p in t}
    big = [(i, t.find(p), len(p)) for p in large for i, t in enumerate(texts) if p in t]
    assert all(any(i == j and a <= s < a + n for j, a, n in big) for i, s in positions)
    assert training_subset(texts, 0.1, 0, 1000) == small
    assert training_subset(texts, 0.1, 1, 1000) != small
    with pytest.raises(ValueError, match="data_fraction"):
        training_subset(texts, 0.0, 0)


@pytest.fixture(scope="module")
def small_data_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainConfig, Path]:
    cfg = TrainConfig(**{**TINY.__dict__, "data_fraction": 0.05, "total_steps": 48})
    out = tmp_path_factory.mktemp("small") / "run"
    train(cfg, out, progress=False, threads=1)
    return cfg, out


def test_train_loss_is_the_checkpoint_loss_on_fixed_training_windows(small_data_run) -> None:
    cfg, out = small_data_run
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    texts = training_subset(split_texts(cfg)[0], cfg.data_fraction, cfg.seed)
    ids = [t for text in texts for t in tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]]
    stream = torch.tensor(ids)
    drawn = windows(stream, cfg.n_val_windows, cfg.context_length, generator(cfg.seed, 2, 0))
    joined = " ".join(map(str, ids))
    assert all(" ".join(map(str, w.tolist())) in joined for w in drawn)  # from the subset
    for row in _history(out):
        model = AutoModelForCausalLM.from_pretrained(out / f"step{int(row['step'])}").eval()
        with torch.no_grad():  # HF's own shifted loss, per window, averaged (equal lengths)
            losses = [model(input_ids=w[None], labels=w[None]).loss.item() for w in drawn]
        assert row["train_loss"] == pytest.approx(float(np.mean(losses)), rel=1e-5)


def test_less_data_gives_a_larger_generalization_gap(run: Path, small_data_run) -> None:
    _, small = small_data_run
    full = TrainConfig(**{**TINY.__dict__, "total_steps": 48})
    train(full, run.parent / "full48", progress=False, threads=1)
    gap = {
        name: _history(path)[-1]["val_loss"] - _history(path)[-1]["train_loss"]
        for name, path in (("small", small), ("full", run.parent / "full48"))
    }
    assert gap["small"] > gap["full"] + 0.1  # measured: 0.18 vs 0.02
    assert _history(small)[0]["val_loss"] == pytest.approx(
        _history(small)[0]["train_loss"], abs=0.2
    )
