"""What a trained-here run reads: the byte-level BPE tokenizer, the training and validation
plays as token streams, the ``data_fraction`` subset, and random windows that are a pure
function of (seed, stream, step), so a resumed run sees the same batches.
"""

from __future__ import annotations

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from blockcoupling.lm.text import corpus
from blockcoupling.lm.training.schedule import TrainConfig

EOS = "<|endoftext|>"
PAD = "<|padding|>"
TRAIN_STREAM, VAL_STREAM, TRAIN_EVAL_STREAM, SUBSET_STREAM = 0, 1, 2, 3
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


def generator(seed: int, stream: int, step: int) -> torch.Generator:
    """A torch generator that is a pure function of (seed, stream, step)."""
    state = np.random.SeedSequence([seed, stream, step]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def windows(stream: torch.Tensor, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """(n, length) int64 random contiguous windows of a 1-D token stream."""
    if stream.numel() < length:
        raise ValueError(
            f"token stream of {stream.numel()} tokens is shorter than a window of {length}"
        )
    starts = torch.randint(0, stream.numel() - length + 1, (n,), generator=gen)
    return stream[starts[:, None] + torch.arange(length)]


def token_stream(texts: list[str], tokenizer: PreTrainedTokenizerFast) -> torch.Tensor:
    """1-D int64 stream: each text's tokens followed by ``<|endoftext|>``."""
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]:
        ids.extend(enc)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def split_texts(cfg: TrainConfig) -> tuple[list[str], list[str]]:
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


def passages(text: str, size: int) -> list[str]:
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
    pieces = [(i, p) for i, text in enumerate(texts) for p in passages(text, passage_chars)]
    order = np.random.default_rng([seed, SUBSET_STREAM]).permutation(len(pieces))
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
