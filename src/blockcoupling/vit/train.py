"""Train one ViT of the sweep with the DeiT recipe, deterministically and resumably.

Recipe: AdamW (betas 0.9/0.999, eps 1e-8; decay on weight matrices only, not on biases, norms,
the class token or the position embedding), learning rate per update from
``vit.config.learning_rate`` (linear warmup, cosine), label-smoothed cross-entropy on soft
targets, optional mixup (``lam ~ Beta(alpha, alpha)``, each batch mixed with itself reversed, as
timm's ``Mixup``), optional random crops (zero padding) and horizontal flips.

Every random draw is a pure function of ``(seed, stream, update)``: the epoch's order, the
augmentation, mixup and, by seeding torch's generator before each update, the drop-path masks.
So a run resumed from its last epoch ends with the same weights as one never stopped. The work
folder holds ``run_config.json``, ``state.pt`` (after every epoch), ``history.csv`` and, at
the end, ``model.safetensors``; each written atomically.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from blockcoupling.files.io import atomic_write, write_text
from blockcoupling.runtime.determinism import adamw, deterministic
from blockcoupling.runtime.progress import track
from blockcoupling.runtime.workdir import keyed_work_dir
from blockcoupling.vit.config import ViTRunConfig, learning_rate
from blockcoupling.vit.data import Prepared
from blockcoupling.vit.model import VisionTransformer, build_vit

HISTORY_COLUMNS = ("epoch", "lr", "train_loss", "test_loss", "test_accuracy", "elapsed_s")
_ORDER, _AUGMENT, _MIXUP, _DROP_PATH, _INIT = range(5)
EVAL_BATCH = 512


def _seed(seed: int, stream: int, step: int) -> int:
    """A 64-bit seed that is a pure function of (seed, stream, step)."""
    state = np.random.SeedSequence([seed, stream, step]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 32 | int(state[1])


def work_dir(run_dir: str | Path, cfg: ViTRunConfig, code: str) -> Path:
    """The run's work folder, keyed to its config and training code (``workdir``)."""
    return keyed_work_dir(run_dir, _config_json(cfg), code)


def _config_json(cfg: ViTRunConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, sort_keys=True)


def make_optimizer(model: VisionTransformer, cfg: ViTRunConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only (timm's ``param_groups_weight_decay``)."""
    skip = model.no_weight_decay()
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (no_decay if parameter.ndim <= 1 or name in skip else decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return adamw(groups, lr=cfg.warmup_lr, betas=(0.9, 0.999), eps=1e-8)


def soft_targets(labels: torch.Tensor, classes: int, smoothing: float) -> torch.Tensor:
    """One-hot ``(batch, classes)`` with ``smoothing`` spread evenly over all classes."""
    off = smoothing / classes
    full = torch.full((labels.shape[0], classes), off, device=labels.device)
    return full.scatter_(1, labels[:, None], 1 - smoothing + off)


def mixup(
    images: torch.Tensor, targets: torch.Tensor, alpha: float, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mix each sample with the batch reversed: ``lam x + (1 - lam) x.flip(0)`` for images and
    soft targets alike, ``lam ~ Beta(alpha, alpha)`` (alpha 0: unchanged).
    """
    if alpha <= 0:
        return images, targets
    lam = float(rng.beta(alpha, alpha))
    return (
        images * lam + images.flip(0) * (1 - lam),
        targets * lam + targets.flip(0) * (1 - lam),
    )


def augment(images: torch.Tensor, cfg: ViTRunConfig, gen: torch.Generator) -> torch.Tensor:
    """Random crops of the zero-padded images (``random_crop_padding`` pixels) and horizontal
    flips (``horizontal_flip``), one draw per sample from ``gen`` (a CPU generator; the images
    stay on their device).
    """
    pad = cfg.random_crop_padding
    n, _, h, w = images.shape
    if pad:
        padded = F.pad(images, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
        dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen).tolist()
        images = torch.stack(
            [padded[i, :, y : y + h, x : x + w] for i, (y, x) in enumerate(zip(dy, dx))]
        )
    if cfg.horizontal_flip:
        flip = (torch.rand(n, generator=gen) < 0.5).to(images.device)
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    return images


@torch.no_grad()
def evaluate(
    model: VisionTransformer, images: torch.Tensor, labels: torch.Tensor
) -> tuple[float, float]:
    """Mean cross-entropy (nats) and accuracy of ``model`` in eval mode on ``images``."""
    was_training = model.training
    model.eval()
    loss, correct = 0.0, 0
    for x, y in zip(images.split(EVAL_BATCH), labels.split(EVAL_BATCH)):
        logits = model(x)
        loss += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(-1) == y).sum())
    model.train(was_training)
    return loss / len(labels), correct / len(labels)


def _save_state(
    work: Path,
    model: VisionTransformer,
    optimizer: torch.optim.Optimizer,
    epoch: int,
    history: list[dict],
) -> None:
    state = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "history": history,
    }
    atomic_write(work / "state.pt", lambda temp: torch.save(state, temp))
    frame = pd.DataFrame(history, columns=list(HISTORY_COLUMNS))
    atomic_write(work / "history.csv", lambda temp: frame.to_csv(temp, index=False))


def _prepare_work(cfg: ViTRunConfig, work: Path) -> None:
    """Create ``work`` with its run config, or check that it holds this run."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "run_config.json"
    if path.exists():
        if json.loads(path.read_text()) != cfg.to_dict():
            raise ValueError(f"{work} holds a run with a different config; use another folder")
    else:
        write_text(path, _config_json(cfg))


def train_vit(
    cfg: ViTRunConfig,
    data: Prepared,
    work: str | Path,
    threads: int | None = None,
    device: str = "cpu",
    progress: bool = True,
    stop_after: int | None = None,
) -> Path:
    """Train (or resume) ``cfg`` on ``data`` in ``work``; return ``work/model.safetensors``
    (written once all epochs are done). ``stop_after``: return after that many epochs (tests).
    History: per epoch, the last learning rate, the mean training loss (on the soft targets),
    test loss and accuracy (eval mode, the whole test split).
    """
    work = Path(work)
    final = work / "model.safetensors"
    with deterministic(threads), torch.random.fork_rng(devices=[]):  # the caller's draws stay
        _prepare_work(cfg, work)
        if final.is_file():
            return final
        x_train = torch.from_numpy(data.normalized(data.x_train)).to(device)
        y_train = torch.from_numpy(data.y_train).to(device)
        x_test = torch.from_numpy(data.normalized(data.x_test)).to(device)
        y_test = torch.from_numpy(data.y_test).to(device)
        n = len(y_train)
        batch = min(cfg.batch_size, n)
        per_epoch = n // batch  # the last incomplete batch is dropped, as in DeiT
        torch.manual_seed(_seed(cfg.seed, _INIT, 0))
        model = build_vit(cfg).to(device).train()
        optimizer = make_optimizer(model, cfg)
        start, history = 0, []
        if (work / "state.pt").is_file():
            state = torch.load(work / "state.pt", weights_only=True, map_location=device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start, history = int(state["epoch"]), list(state["history"])
        elapsed0 = history[-1]["elapsed_s"] if history else 0.0
        t0 = time.perf_counter()
        epochs = range(start, cfg.epochs if stop_after is None else min(cfg.epochs, stop_after))
        desc = f"train ViT sd={cfg.drop_path_rate} wd={cfg.weight_decay} seed={cfg.seed}"
        for epoch in track(epochs, len(epochs), desc, lambda e: f"epoch {e + 1}", progress):
            order = torch.randperm(
                n, generator=torch.Generator().manual_seed(_seed(cfg.seed, _ORDER, epoch))
            )
            losses = []
            for i in range(per_epoch):
                step = epoch * per_epoch + i
                lr = learning_rate(step, per_epoch, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                index = order[i * batch : (i + 1) * batch].to(device)
                gen = torch.Generator().manual_seed(_seed(cfg.seed, _AUGMENT, step))
                images = augment(x_train[index], cfg, gen)
                targets = soft_targets(y_train[index], cfg.num_classes, cfg.label_smoothing)
                rng = np.random.default_rng(_seed(cfg.seed, _MIXUP, step))
                images, targets = mixup(images, targets, cfg.mixup_alpha, rng)
                torch.manual_seed(_seed(cfg.seed, _DROP_PATH, step))
                logits = model(images)
                loss = torch.sum(-targets * F.log_softmax(logits, dim=-1), dim=-1).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
            test_loss, test_accuracy = evaluate(model, x_test, y_test)
            history.append(
                {
                    "epoch": epoch + 1,
                    "lr": lr,
                    "train_loss": float(np.mean(losses)),
                    "test_loss": test_loss,
                    "test_accuracy": test_accuracy,
                    "elapsed_s": elapsed0 + time.perf_counter() - t0,
                }
            )
            _save_state(work, model, optimizer, epoch + 1, history)
        if len(history) == cfg.epochs:
            weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            atomic_write(final, lambda temp: save_file(weights, temp))
            (work / "state.pt").unlink(missing_ok=True)
    return final
