"""Train a small Pythia-architecture (GPT-NeoX) suite from scratch on Shakespeare, on CPU.

Layout of ``out_dir`` (see :func:`train`)::

    train_config.json        the TrainConfig (a resumed run must match it)
    tokenizer/               the byte-level BPE (trained on the training plays only)
    step{N}/                 save_pretrained model + tokenizer, trainer_state.pt (+ optimizer.pt
                             in the newest checkpoint only: the resume point), checksums.json
                             (SHA-256 of each file: a damaged checkpoint is found and retrained)
    history.csv              step, train_loss, val_loss, val_accuracy, tokens_seen, elapsed_s

The model trains on ``data_fraction`` of the training plays' text (``training_subset``); the
tokenizer is trained on all of it, so runs that differ in the fraction share one tokenizer (and
size), and their per-token losses are comparable.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from blockcoupling.files.io import atomic_write, permissions, write_text
from blockcoupling.files.manifest import sha256
from blockcoupling.lm import corpus
from blockcoupling.lm.schedule import TrainConfig
from blockcoupling.runtime.determinism import adamw, deterministic
from blockcoupling.runtime.progress import track
from blockcoupling.runtime.workdir import keyed_work_dir

EOS = "<|endoftext|>"
PAD = "<|padding|>"
HISTORY_COLUMNS = ("step", "train_loss", "val_loss", "val_accuracy", "tokens_seen", "elapsed_s")
_TRAIN_STREAM, _VAL_STREAM, _TRAIN_EVAL_STREAM, _SUBSET_STREAM = 0, 1, 2, 3
PASSAGE_CHARS = 2000  # data_fraction draws passages of about this many characters


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style, no BOS added) with ``<|endoftext|>`` as bos/eos and a pad
    token.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD
    )


def model_config(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast) -> GPTNeoXConfig:
    """GPT-NeoX (Pythia) config: rotary on 25% of the head dims, parallel residual, no dropout,
    float32.
    """
    return GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.intermediate_size or 4 * cfg.d_model,
        max_position_embeddings=cfg.context_length,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def learning_rate_factor(step: int, cfg: TrainConfig) -> float:
    """LR multiplier of update ``step`` (0-based): linear warmup, then cosine to min_lr_fraction."""
    warmup = max(1, round(cfg.warmup_fraction * cfg.total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, cfg.total_steps - warmup)
    return cfg.min_lr_fraction + (1 - cfg.min_lr_fraction) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, progress))
    )


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    """A torch generator that is a pure function of (seed, stream, step)."""
    state = np.random.SeedSequence([seed, stream, step]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(n, length) int64 random contiguous windows of a 1-D token stream."""
    if stream.numel() < length:
        raise ValueError(
            f"token stream of {stream.numel()} tokens is shorter than a window of {length}"
        )
    starts = torch.randint(0, stream.numel() - length + 1, (n,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)]


def _token_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """1-D int64 stream: each text's tokens followed by ``<|endoftext|>``."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def _texts(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(training texts, validation texts) of the split; training text capped at max_train_chars
    (all of it: the tokenizer's text; the model trains on ``training_subset`` of it).
    """
    train_slugs, val_slugs = corpus.split_plays(cfg.split_seed)
    texts = corpus.plays()
    train = [texts[s] for s in train_slugs]
    if cfg.max_train_chars is not None:
        joined = "\n".join(train)[: cfg.max_train_chars]
        train = [joined]
    return train, [texts[s] for s in val_slugs]


def _passages(text: str, size: int) -> list[str]:
    """``text`` cut at line ends into consecutive passages of at least ``size`` characters (the
    last may be shorter); their concatenation is ``text``.
    """
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size - 1)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def training_subset(
    texts: list[str], fraction: float, seed: int, passage_chars: int = PASSAGE_CHARS
) -> list[str]:
    """The part of ``texts`` a run with ``data_fraction=fraction`` trains on.

    Every text is cut into passages of about ``passage_chars`` characters at line ends; a
    permutation of all passages, a function of ``seed`` alone, is taken up to the first prefix
    holding at least ``fraction`` of the characters; the chosen passages are returned in corpus
    order, adjacent ones of a text joined. For one seed a smaller fraction's text is a part of a
    larger one's; ``fraction=1`` returns ``texts`` unchanged.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"data_fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return list(texts)
    pieces = [(i, p) for i, text in enumerate(texts) for p in _passages(text, passage_chars)]
    order = np.random.default_rng([seed, _SUBSET_STREAM]).permutation(len(pieces))
    chosen_chars = np.cumsum([len(pieces[j][1]) for j in order])
    n = int(np.searchsorted(chosen_chars, fraction * chosen_chars[-1])) + 1
    out: list[str] = []
    previous = (-1, -2)  # (text, passage index) of the last chosen passage
    for j in sorted(order[:n].tolist()):
        text = pieces[j][0]
        if previous == (text, j - 1):
            out[-1] += pieces[j][1]
        else:
            out.append(pieces[j][1])
        previous = (text, j)
    return out


@torch.no_grad()
def _loss_and_accuracy(
    model: GPTNeoXForCausalLM, windows: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Mean next-token cross-entropy (nats) and accuracy over (n, T) windows."""
    model.eval()
    nll, correct, count = 0.0, 0, 0
    for chunk in windows.split(batch_size):
        logits = model(input_ids=chunk).logits[:, :-1].float()
        target = chunk[:, 1:]
        nll += torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), target.flatten(), reduction="sum"
        ).item()
        correct += int((logits.argmax(-1) == target).sum())
        count += target.numel()
    model.train()
    return nll / count, correct / count


@contextmanager
def run_settings(threads: int | None) -> Iterator[None]:
    """``determinism.deterministic(threads)`` and no transformers save/load bars for the
    duration; restored afterwards.
    """
    old_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with deterministic(threads):
            yield
    finally:
        if old_bars:
            hf_logging.enable_progress_bar()


def _write_history(out_dir: Path, history: list[dict[str, float]]) -> None:
    frame = pd.DataFrame(history, columns=list(HISTORY_COLUMNS))
    atomic_write(out_dir / "history.csv", lambda temp: frame.to_csv(temp, index=False))


def work_dir(run_dir: str | Path, cfg: TrainConfig, code: str) -> Path:
    """The folder a run trains in, ``run_dir/work-<key>``, keyed to the exact config and training
    code (``code``: a hash of it): an interrupted job resumes there; after any change the key
    differs, so the run starts afresh and the stale folders of the run are removed.
    """
    return keyed_work_dir(run_dir, _config_json(cfg), code)


def _config_json(cfg: TrainConfig) -> str:
    return json.dumps(asdict(cfg), indent=2, sort_keys=True)


def _prepare(cfg: TrainConfig, out_dir: Path) -> PreTrainedTokenizerFast:
    """Create or check ``out_dir`` and return its tokenizer (trained once, then reloaded)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = out_dir / "train_config.json"
    if cfg_path.exists():
        if json.loads(cfg_path.read_text()) != json.loads(_config_json(cfg)):
            raise ValueError(
                f"{out_dir} holds a run with a different TrainConfig; use another out_dir"
            )
    else:
        write_text(cfg_path, _config_json(cfg))
    tok_dir = out_dir / "tokenizer"
    if not tok_dir.is_dir():
        tokenizer = train_tokenizer(_texts(cfg)[0], cfg.vocab_size)
        tokenizer.model_max_length = cfg.context_length
        tmp = out_dir / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, tok_dir)
    return PreTrainedTokenizerFast.from_pretrained(tok_dir, trust_remote_code=False)


CHECKSUMS, RESUME = "checksums.json", "optimizer.pt"


def _last_checkpoint(cfg: TrainConfig, out_dir: Path) -> int | None:
    """Newest checkpoint step of ``out_dir`` a run can resume from (None when there is none)."""
    done = [
        s
        for s in cfg.steps
        if all((out_dir / f"step{s}" / name).is_file() for name in ("trainer_state.pt", RESUME))
    ]
    return max(done) if done else None


def damage(step_dir: Path) -> str | None:
    """What is wrong with checkpoint ``step_dir`` against its ``checksums.json`` (the file and
    how), or None when it is intact; ``optimizer.pt`` may have been dropped (older checkpoints).
    """
    try:
        checksums = json.loads((step_dir / CHECKSUMS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{step_dir / CHECKSUMS} is missing or unreadable"
    for name, digest in checksums.items():
        path = step_dir / name
        if not path.is_file():
            if name == RESUME:
                continue
            return f"{path} is missing"
        if sha256(path) != digest:
            return f"{path} is damaged (its SHA-256 differs from the one written with it)"
    return None


def _drop_damaged(cfg: TrainConfig, out_dir: Path) -> None:
    """Remove the first damaged checkpoint of ``out_dir`` and every later one (training resumes
    from the newest intact one holding the optimizer state, or afresh: the data order is a
    function of the step, so the same weights come back); one warning line names the file.
    """
    present = [s for s in cfg.steps if (out_dir / f"step{s}").is_dir()]
    for step in present:
        problem = damage(out_dir / f"step{step}")
        if problem is None:
            continue
        later = [s for s in present if s >= step]
        logging.warning(
            "%s: removing checkpoint(s) %s and training them again",
            problem,
            ", ".join(f"step{s}" for s in later),
        )
        for s in later:
            shutil.rmtree(out_dir / f"step{s}")
        return


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    progress: bool = True,
    threads: int | None = None,
    stop_after: int | None = None,
) -> Path:
    """Train ``cfg`` from scratch (or resume it) and return the newest checkpoint dir
    ``out_dir/step{N}``.

    Checkpoints at ``cfg.steps`` (step 0 = the initialisation) are ``save_pretrained`` dirs of model
    and tokenizer, written to ``step{N}.tmp`` and renamed. At each, val_loss (nats/token) and
    next-token accuracy are scored on ``n_val_windows`` fixed seeded windows of the validation
    plays, and train_loss the same way on as many fixed windows of the text the model trains on,
    so val_loss - train_loss is the generalization gap.
    Data order is a function of (seed, step), so a killed run resumes from its newest checkpoint to
    the same final weights. ``stop_after``: return after the first checkpoint at or past that step.
    ``threads``: torch intra-op threads for the run.
    """
    out_dir = Path(out_dir)
    with run_settings(threads):
        tokenizer = _prepare(cfg, out_dir)
        _drop_damaged(cfg, out_dir)
        start = _last_checkpoint(cfg, out_dir)
        if start is not None and (
            start == cfg.total_steps or stop_after is not None and start >= stop_after
        ):
            return out_dir / f"step{start}"
        train_texts, val_texts = _texts(cfg)
        train_stream = _token_stream(
            training_subset(train_texts, cfg.data_fraction, cfg.seed), tokenizer
        )
        eval_windows = {  # fixed windows, one protocol: their losses give the generalization gap
            name: _windows(
                stream, cfg.n_val_windows, cfg.context_length, _generator(cfg.seed, stream_id, 0)
            )
            for name, stream, stream_id in (
                ("train", train_stream, _TRAIN_EVAL_STREAM),
                ("val", _token_stream(val_texts, tokenizer), _VAL_STREAM),
            )
        }
        model, optimizer, scheduler, state = _init_or_resume(cfg, out_dir, tokenizer, start)
        if start is None:
            start = 0
            last = _checkpoint(
                model,
                tokenizer,
                optimizer,
                scheduler,
                state,
                cfg,
                out_dir,
                eval_windows,
            )
            if stop_after is not None and stop_after <= 0:
                return last
        steps, last_loss = set(cfg.steps), [math.nan]
        t0 = time.perf_counter() - state["elapsed_s"]

        def label(step: int) -> str:
            return f"step {step + 1}, loss {last_loss[0]:.3f}"

        steps_left = range(start, cfg.total_steps)
        desc = f"train L{cfg.n_layers} d{cfg.d_model}"
        for step in track(steps_left, len(steps_left), desc, label, progress):
            batch = _windows(
                train_stream,
                cfg.batch_size,
                cfg.context_length,
                _generator(cfg.seed, _TRAIN_STREAM, step),
            )
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            last_loss[0] = loss.item()
            if step + 1 in steps:
                state.update(step=step + 1, elapsed_s=time.perf_counter() - t0)
                last = _checkpoint(
                    model,
                    tokenizer,
                    optimizer,
                    scheduler,
                    state,
                    cfg,
                    out_dir,
                    eval_windows,
                )
                if stop_after is not None and step + 1 >= stop_after:
                    break
        return last


def _init_or_resume(
    cfg: TrainConfig, out_dir: Path, tokenizer: PreTrainedTokenizerFast, start: int | None
) -> tuple[GPTNeoXForCausalLM, torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR, dict]:
    """Model, optimizer, scheduler and trainer state: seeded initialisation when ``start`` is None,
    else exactly as saved in ``out_dir/step{start}``.
    """
    if start is None:
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        model = GPTNeoXForCausalLM(model_config(cfg, tokenizer))
        state: dict = {"step": 0, "history": [], "elapsed_s": 0.0}
    else:
        ckpt = out_dir / f"step{start}"
        model = GPTNeoXForCausalLM.from_pretrained(
            ckpt, dtype=torch.float32, trust_remote_code=False
        )
        state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
    model.train()
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: learning_rate_factor(s, cfg))
    if start is not None:
        saved = torch.load(out_dir / f"step{start}" / "optimizer.pt", weights_only=True)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
    return model, optimizer, scheduler, state


def make_optimizer(model: GPTNeoXForCausalLM, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (betas 0.9, 0.95) with weight decay on matrices only, as in Pythia."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return adamw(groups, lr=cfg.learning_rate, betas=(0.9, 0.95), eps=1e-8)


def _checkpoint(
    model: GPTNeoXForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict,
    cfg: TrainConfig,
    out_dir: Path,
    eval_windows: dict[str, torch.Tensor],
) -> Path:
    """Score the fixed ``train`` and ``val`` windows, write ``step{N}`` atomically, rewrite
    history.csv, drop the previous optimizer state.
    """
    step = state["step"]
    train_loss = _loss_and_accuracy(model, eval_windows["train"], cfg.batch_size)[0]
    val_loss, val_acc = _loss_and_accuracy(model, eval_windows["val"], cfg.batch_size)
    state["history"] = [r for r in state["history"] if r["step"] < step] + [
        {
            "step": step,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "tokens_seen": step * cfg.batch_size * cfg.context_length,
            "elapsed_s": state["elapsed_s"],
        }
    ]
    state["torch_rng"] = torch.get_rng_state()
    state["python_rng"] = random.getstate()
    final, tmp = out_dir / f"step{step}", out_dir / f"step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        tmp / RESUME,
    )
    torch.save(state, tmp / "trainer_state.pt")
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:
        permissions(path)  # save_pretrained writes model.safetensors 0600
    checksums = {str(p.relative_to(tmp)): sha256(p) for p in files}
    write_text(tmp / CHECKSUMS, json.dumps(checksums, indent=1, sort_keys=True))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_history(out_dir, state["history"])
    for older in cfg.steps:
        if older < step:
            (out_dir / f"step{older}" / RESUME).unlink(missing_ok=True)
    return final
