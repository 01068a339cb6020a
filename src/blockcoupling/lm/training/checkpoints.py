"""A trained-here run's checkpoints on disk: ``step{N}`` folders written atomically with the
SHA-256 of every file (a damaged one is found and trained again), the optimizer state in the
newest only (the resume point), and history.csv.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
from pathlib import Path

import pandas as pd
import torch
from safetensors import SafetensorError
from transformers import GPTNeoXForCausalLM, PreTrainedTokenizerFast

from blockcoupling.files.io import atomic_write, permissions, write_text
from blockcoupling.files.manifest import sha256
from blockcoupling.lm.training.schedule import TrainConfig

HISTORY_COLUMNS = ("step", "train_loss", "val_loss", "val_accuracy", "tokens_seen", "elapsed_s")
CHECKSUMS, RESUME = "checksums.json", "optimizer.pt"


def disk_full(error: Exception, folder: Path, needed: int) -> OSError | None:
    """An ``ENOSPC`` OSError naming ``folder`` (its partial files removed) when writing it failed
    for want of space: safetensors says "os error 28", torch's writer only "unexpected pos", so
    the free space is also compared with ``needed`` bytes; None for any other failure.
    """
    said = isinstance(error, OSError) and error.errno == errno.ENOSPC
    said = said or "os error 28" in str(error) or "No space left" in str(error)
    shutil.rmtree(folder, ignore_errors=True)
    free = shutil.disk_usage(folder.parent).free
    if not said and free >= needed + (1 << 20):
        return None
    return OSError(
        errno.ENOSPC,
        f"No space left on device writing a checkpoint ({free:,} bytes free, about {needed:,} "
        f"needed; {type(error).__name__}: {str(error).splitlines()[0][:120]})",
        str(folder),
    )


def write_history(out_dir: Path, history: list[dict[str, float]]) -> None:
    """Rewrite ``out_dir``/history.csv (``HISTORY_COLUMNS``) atomically from ``history``."""
    frame = pd.DataFrame(history, columns=list(HISTORY_COLUMNS))
    atomic_write(out_dir / "history.csv", lambda temp: frame.to_csv(temp, index=False))


def last_checkpoint(cfg: TrainConfig, out_dir: Path) -> int | None:
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


def drop_damaged(cfg: TrainConfig, out_dir: Path) -> None:
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


def save_checkpoint(
    model: GPTNeoXForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: dict,
    cfg: TrainConfig,
    out_dir: Path,
    row: dict[str, float],
) -> Path:
    """Write ``step{N}`` (N = ``state["step"]``) atomically with ``row`` (its scores) as the
    history's last entry, rewrite history.csv, drop the previous optimizer state.
    """
    step = state["step"]
    state["history"] = [r for r in state["history"] if r["step"] < step] + [row]
    state["torch_rng"] = torch.get_rng_state()
    state["python_rng"] = random.getstate()
    final, tmp = out_dir / f"step{step}", out_dir / f"step{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
            tmp / RESUME,
        )
        torch.save(state, tmp / "trainer_state.pt")
    except (SafetensorError, RuntimeError, OSError) as error:
        full = disk_full(error, tmp, 3 * sum(p.nbytes for p in model.state_dict().values()))
        if full is None:
            raise
        raise full from None
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    for path in files:
        permissions(path)  # save_pretrained writes model.safetensors 0600
    checksums = {str(p.relative_to(tmp)): sha256(p) for p in files}
    write_text(tmp / CHECKSUMS, json.dumps(checksums, indent=1, sort_keys=True))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    write_history(out_dir, state["history"])
    for older in cfg.steps:
        if older < step:
            (out_dir / f"step{older}" / RESUME).unlink(missing_ok=True)
    return final
