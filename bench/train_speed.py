"""Time a few training steps of each default suite size on CPU and project the full run.

Usage: python bench/train_speed.py [--steps 5] [--threads 2] [--batch-size N] [--context-length N]

Uses random tokens (no corpus or tokenizer needed); prints steps/s and the projected wall time of
``total_steps`` updates (checkpoint validation and saving not included; they add a few percent).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch
import yaml
from transformers import GPTNeoXForCausalLM

from blockcoupling.lm.training.schedule import TrainConfig
from blockcoupling.lm.training.train import make_optimizer, model_config, run_settings
from blockcoupling.pipeline.grids import expand_grids


class _VocabOnly:
    """Stand-in tokenizer for model_config: only the vocab size and special ids matter here."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self.bos_token_id, self.eos_token_id, self.pad_token_id = (
            vocab_size,
            0,
            0,
            1,
        )

    def __len__(self) -> int:
        return self.vocab_size


def steps_per_second(cfg: TrainConfig, n_steps: int, seed: int = 0) -> float:
    """Training updates per second of ``cfg`` (forward, backward, clip, AdamW), after one warm-up
    step."""
    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(model_config(cfg, _VocabOnly(cfg.vocab_size)))
    model.train()
    optimizer = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    batches = torch.randint(
        0, cfg.vocab_size, (n_steps + 1, cfg.batch_size, cfg.context_length), generator=gen
    )
    for i, batch in enumerate(batches):
        if i == 1:
            start = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return n_steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config", default="config.yaml", help="workflow config whose train.runs are timed"
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--context-length", type=int)
    args = parser.parse_args()
    overrides = {
        k: v
        for k, v in (("batch_size", args.batch_size), ("context_length", args.context_length))
        if v
    }
    total = 0.0
    runs = expand_grids(yaml.safe_load(open(args.config)))["train"]["runs"]  # grids too
    for name, cfg in ((n, TrainConfig(**spec)) for n, spec in runs.items()):
        cfg = dataclasses.replace(cfg, **overrides)
        n_params = sum(
            p.numel()
            for p in GPTNeoXForCausalLM(model_config(cfg, _VocabOnly(cfg.vocab_size))).parameters()
        )
        with run_settings(args.threads):  # the deterministic settings that train() uses
            rate = steps_per_second(cfg, args.steps)
        projected = cfg.total_steps / rate
        total += projected
        print(
            f"{name}: {n_params / 1e6:.2f} M params, "
            f"batch {cfg.batch_size} x {cfg.context_length} tokens, "
            f"{rate:.2f} steps/s, {rate * cfg.batch_size * cfg.context_length:.0f} tokens/s, "
            f"{cfg.total_steps} steps -> {projected / 60:.1f} min"
        )
    print(f"suite total: {total / 60:.1f} min on {args.threads} threads")


if __name__ == "__main__":
    main()
