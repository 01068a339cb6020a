"""Train a small Pythia-architecture (GPT-NeoX) suite from scratch on Shakespeare, on CPU.

Layout of ``out_dir`` (see :func:`train`)::

    train_config.json        the TrainConfig (a resumed run must match it)
    tokenizer/               the byte-level BPE (trained on the training plays only)
    step{N}/                 save_pretrained model + tokenizer, trainer_state.pt (+ optimizer.pt
                             in the newest checkpoint only: the resume point), checksums.json
                             (SHA-256 of each file: a damaged checkpoint is found and retrained)
    history.csv              step, train_loss, val_loss, val_accuracy, tokens_seen, elapsed_s

The model trains on ``data_fraction`` of the training plays' text
(``train_data.training_subset``); the tokenizer is trained on all of it, so runs that differ in
the fraction share one tokenizer (and size), and their per-token losses are comparable. The data
and its windows: ``train_data``; the checkpoints on disk: ``train_checkpoints``.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from blockcoupling.files.io import write_text
from blockcoupling.lm.training import data as train_data
from blockcoupling.lm.training.checkpoints import drop_damaged, last_checkpoint, save_checkpoint
from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.runtime.determinism import adamw, deterministic
from blockcoupling.runtime.progress import track
from blockcoupling.runtime.workdir import keyed_work_dir


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
        tokenizer = train_data.train_tokenizer(train_data.split_texts(cfg)[0], cfg.vocab_size)
        tokenizer.model_max_length = cfg.context_length
        tmp = out_dir / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, tok_dir)
    return PreTrainedTokenizerFast.from_pretrained(tok_dir, trust_remote_code=False)


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
        drop_damaged(cfg, out_dir)
        start = last_checkpoint(cfg, out_dir)
        if start is not None and (
            start == cfg.total_steps or stop_after is not None and start >= stop_after
        ):
            return out_dir / f"step{start}"
        train_texts, val_texts = train_data.split_texts(cfg)
        subset = train_data.training_subset(train_texts, cfg.data_fraction, cfg.seed)
        train_stream = train_data.token_stream(subset, tokenizer)
        eval_windows = {  # fixed windows, one protocol: their losses give the generalization gap
            name: train_data.windows(
                stream,
                cfg.n_val_windows,
                cfg.context_length,
                train_data.generator(cfg.seed, stream_id, 0),
            )
            for name, stream, stream_id in (
                ("train", train_stream, train_data.TRAIN_EVAL_STREAM),
                ("val", train_data.token_stream(val_texts, tokenizer), train_data.VAL_STREAM),
            )
        }
        model, optimizer, scheduler, state = _init_or_resume(cfg, out_dir, tokenizer, start)

        def checkpoint() -> Path:
            """Score the fixed windows and write the checkpoint of ``state["step"]``."""
            row = _scores(model, eval_windows, state, cfg)
            return save_checkpoint(model, tokenizer, optimizer, scheduler, state, cfg, out_dir, row)

        if start is None:
            start = 0
            last = checkpoint()
            if stop_after is not None and stop_after <= 0:
                return last
        steps, last_loss = set(cfg.steps), [math.nan]
        t0 = time.perf_counter() - state["elapsed_s"]

        def label(step: int) -> str:
            return f"step {step + 1}, loss {last_loss[0]:.3f}"

        steps_left = range(start, cfg.total_steps)
        desc = f"train L{cfg.n_layers} d{cfg.d_model}"
        for step in track(steps_left, len(steps_left), desc, label, progress):
            batch = train_data.windows(
                train_stream,
                cfg.batch_size,
                cfg.context_length,
                train_data.generator(cfg.seed, train_data.TRAIN_STREAM, step),
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
                last = checkpoint()
                if stop_after is not None and step + 1 >= stop_after:
                    break
        return last


def _scores(
    model: GPTNeoXForCausalLM,
    eval_windows: dict[str, torch.Tensor],
    state: dict,
    cfg: TrainConfig,
) -> dict[str, float]:
    """The history row of the checkpoint at ``state["step"]``: loss on the fixed ``train`` and
    ``val`` windows, validation accuracy, tokens seen and elapsed seconds.
    """
    step = state["step"]
    train_loss = _loss_and_accuracy(model, eval_windows["train"], cfg.batch_size)[0]
    val_loss, val_acc = _loss_and_accuracy(model, eval_windows["val"], cfg.batch_size)
    return {
        "step": step,
        "train_loss": train_loss,
        "val_loss": val_loss,
        "val_accuracy": val_acc,
        "tokens_seen": step * cfg.batch_size * cfg.context_length,
        "elapsed_s": state["elapsed_s"],
    }


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
