"""Training-run configuration and the checkpoint schedule (no torch: the workflow reads these
when it builds the DAG).
"""

from __future__ import annotations

from dataclasses import dataclass

SEED_MAX = 2**63 - 1  # a seed becomes torch's int64 and a NetCDF attribute


@dataclass
class TrainConfig:
    """One model of the suite and its training recipe (AdamW, linear warmup, cosine decay)."""

    n_layers: int = 4
    d_model: int = 128
    n_heads: int = 4
    intermediate_size: int | None = None  # None: 4 * d_model
    context_length: int = 128  # tokens per training window
    batch_size: int = 16  # windows per step
    learning_rate: float = 2e-3  # peak
    warmup_fraction: float = 0.05  # of total_steps, linear from 0
    min_lr_fraction: float = 0.1  # cosine decays to this fraction of the peak
    weight_decay: float = 0.01  # on matrices only
    grad_clip: float = 1.0
    total_steps: int = 1000
    seed: int = 0  # initialisation and data order
    split_seed: int = 0  # train/validation split of the plays (keep equal across a suite)
    vocab_size: int = 4096
    n_even_checkpoints: int = 10
    checkpoint_steps: list[int] | None = (
        None  # None: checkpoint_schedule(total_steps, n_even_checkpoints)
    )
    n_val_windows: int = 64
    max_train_chars: int | None = None  # cap on the training text (tests, quick runs)
    data_fraction: float = 1.0  # share of the training text the model trains on (seeded by seed)

    def __post_init__(self) -> None:
        for name in (
            "n_layers",
            "d_model",
            "n_heads",
            "context_length",
            "batch_size",
            "total_steps",
            "n_even_checkpoints",
            "n_val_windows",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("seed", "split_seed"):
            if not 0 <= getattr(self, name) <= SEED_MAX:
                raise ValueError(
                    f"{name} must be in 0..2**63-1 (torch's and NetCDF's int64), got "
                    f"{getattr(self, name)}"
                )
        if not 0.0 < self.data_fraction <= 1.0:
            raise ValueError(f"data_fraction must be in (0, 1], got {self.data_fraction}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.vocab_size < 258:
            raise ValueError(
                f"vocab_size must be >= 258 (256 bytes + 2 special tokens), got {self.vocab_size}"
            )
        if self.checkpoint_steps is not None:
            steps = sorted(set(int(s) for s in self.checkpoint_steps) | {0, self.total_steps})
            if steps[0] < 0 or steps[-1] > self.total_steps:
                raise ValueError(
                    f"checkpoint_steps must lie in [0, total_steps={self.total_steps}]"
                )
            self.checkpoint_steps = steps

    def n_params(self, vocab_size: int | None = None) -> int:
        """Parameters of the GPT-NeoX model (untied embeddings and head, LayerNorms with bias;
        ``vocab_size``: the trained tokenizer's, at most ``self.vocab_size``).
        """
        d, inter = self.d_model, self.intermediate_size or 4 * self.d_model
        vocab = vocab_size or self.vocab_size
        block = 4 * d * d + 4 * d + 2 * d * inter + inter + d + 4 * d  # attention, MLP, 2 norms
        return self.n_layers * block + 2 * vocab * d + 2 * d

    def twin_key(self) -> tuple:
        """What fixes the saved model config and tokenizer (architecture, context, vocabulary,
        tokenizer text): runs equal in it have byte-identical random-init twins (same twin seed),
        whatever their training recipe, data fraction or seed.
        """
        return (
            self.n_layers,
            self.d_model,
            self.n_heads,
            self.intermediate_size or 4 * self.d_model,
            self.context_length,
            self.vocab_size,
            self.split_seed,
            self.max_train_chars,
        )

    @property
    def train_tokens(self) -> int:
        """Tokens seen in training (steps x batch x context)."""
        return self.total_steps * self.batch_size * self.context_length

    @property
    def steps(self) -> list[int]:
        """The checkpoint steps (sorted, with 0 and total_steps)."""
        if self.checkpoint_steps is not None:
            return list(self.checkpoint_steps)
        return checkpoint_schedule(self.total_steps, self.n_even_checkpoints)


def checkpoint_schedule(total_steps: int, n_even: int) -> list[int]:
    """Pythia-like steps: 0 and the powers of two below the even spacing, then ``n_even`` evenly
    spaced steps ending at ``total_steps``. Sorted, unique, contains 0 and total_steps.
    """
    if total_steps < 1 or n_even < 1:
        raise ValueError(f"need total_steps >= 1 and n_even >= 1, got {total_steps}, {n_even}")
    even = {round(k * total_steps / n_even) for k in range(1, n_even + 1)}
    first_even = min(even)
    powers = {2**i for i in range(total_steps.bit_length()) if 2**i < first_even}
    return sorted({0} | powers | even)
