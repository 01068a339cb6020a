"""bits per byte and multiple-choice accuracy against hand computations on tiny models."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers.processors import TemplateProcessing
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from blockcoupling.lm.evaluate import (
    bits_per_byte,
    choice_loglikelihoods,
    evaluate,
    multiple_choice_accuracy,
)
from blockcoupling.lm.text import corpus
from blockcoupling.lm.training.data import train_tokenizer

TEXT = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n"
CTX = 64


@pytest.fixture(scope="module")
def byte_tokenizer():
    """Byte-level tokenizer with no merges: every UTF-8 byte is one token."""
    return train_tokenizer([TEXT], vocab_size=258)


@pytest.fixture(scope="module")
def bpe_tokenizer():
    return train_tokenizer([corpus.plays()["macbeth"]], vocab_size=400)


def _neox(vocab: int, seed: int = 0) -> GPTNeoXForCausalLM:
    torch.manual_seed(seed)
    cfg = GPTNeoXConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=CTX,
        initializer_range=0.5,
    )
    return GPTNeoXForCausalLM(cfg).eval()


def _hand_bits(model, ids: list[int]) -> float:
    """NLL in bits of ids[1:] given ids, from one full forward pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].double()
    logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return -float(logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum()) / math.log(2)


def _ids(tokenizer, text: str) -> list[int]:
    return [tokenizer.eos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_bits_per_byte_is_the_hand_computation(bpe_tokenizer) -> None:
    model = _neox(len(bpe_tokenizer))
    texts = [TEXT, "Out, damned spot!", "To-morrow, and to-morrow, and to-morrow,\n"]
    ids = [_ids(bpe_tokenizer, t) for t in texts]
    assert max(map(len, ids)) - 1 <= CTX  # each text fits in one window
    expected = sum(_hand_bits(model, i) for i in ids) / sum(len(t.encode()) for t in texts)
    assert expected > 1.0  # a random model is far from perfect
    for stride in (None, 1, 7, CTX):
        for batch_size in (1, 2):
            got = bits_per_byte(
                model,
                bpe_tokenizer,
                texts,
                context_length=CTX,
                stride=stride,
                batch_size=batch_size,
            )
            assert got == pytest.approx(expected, rel=1e-5)


def test_sliding_windows_condition_on_the_last_context_tokens(bpe_tokenizer) -> None:
    model = _neox(len(bpe_tokenizer), seed=1)
    text = corpus.plays()["macbeth"][:600]
    ids = _ids(bpe_tokenizer, text)
    ctx = 16
    assert len(ids) > 4 * ctx
    bits = 0.0
    for t in range(1, len(ids)):  # stride 1: each token sees exactly the ctx tokens before it
        window = ids[max(0, t - ctx) : t + 1]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([window[:-1]])).logits[0, -1].double()
        bits -= float(torch.log_softmax(logits, -1)[window[-1]]) / math.log(2)
    n_bytes = len(text.encode())
    got = bits_per_byte(model, bpe_tokenizer, [text], context_length=ctx, stride=1, batch_size=8)
    assert got == pytest.approx(bits / n_bytes, rel=1e-5)
    assert bits_per_byte(model, bpe_tokenizer, [text], context_length=ctx) != pytest.approx(
        got, rel=1e-5
    )


def test_tokenizer_that_adds_bos_gives_the_same_number(bpe_tokenizer) -> None:
    model = _neox(len(bpe_tokenizer))
    with_bos = copy.deepcopy(bpe_tokenizer)
    bos = (with_bos.bos_token, with_bos.bos_token_id)
    with_bos.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos[0]} $A", special_tokens=[bos]
    )
    assert with_bos("Out")["input_ids"][0] == bos[1] != bpe_tokenizer("Out")["input_ids"][0]
    a = bits_per_byte(model, bpe_tokenizer, [TEXT], context_length=CTX)
    assert bits_per_byte(model, with_bos, [TEXT], context_length=CTX) == pytest.approx(a, rel=1e-6)


class _BigramModel(torch.nn.Module):
    """Causal LM whose logits put ``margin`` on succ[current token] (0 everywhere when
    margin = 0)."""

    def __init__(self, succ: dict[int, int], vocab: int, margin: float) -> None:
        super().__init__()
        self.table = torch.zeros(vocab, dtype=torch.long)
        for a, b in succ.items():
            self.table[a] = b
        self.vocab, self.margin = vocab, margin
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(max_position_embeddings=8)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> SimpleNamespace:
        return SimpleNamespace(
            logits=self.margin
            * torch.nn.functional.one_hot(self.table[input_ids], self.vocab).float()
        )


def test_perfect_and_uniform_predictors(byte_tokenizer) -> None:
    text = "abc" * 20
    a, b, c = (byte_tokenizer.convert_tokens_to_ids(ch) for ch in "abc")
    eos, vocab = byte_tokenizer.eos_token_id, len(byte_tokenizer)
    assert byte_tokenizer(text, add_special_tokens=False)["input_ids"] == [a, b, c] * 20
    oracle = _BigramModel({eos: a, a: b, b: c, c: a}, vocab, margin=40.0)
    assert bits_per_byte(oracle, byte_tokenizer, [text], stride=3) == pytest.approx(0.0, abs=1e-9)
    uniform = _BigramModel({}, vocab, margin=0.0)
    n_tokens = n_bytes = 60 + 2  # "é" is two bytes, two tokens
    assert bits_per_byte(uniform, byte_tokenizer, [text, "é"]) == pytest.approx(
        math.log2(vocab) * n_tokens / n_bytes
    )
    with pytest.raises(ValueError, match="stride"):
        bits_per_byte(oracle, byte_tokenizer, [text], stride=9)
    with pytest.raises(ValueError, match="empty"):
        bits_per_byte(oracle, byte_tokenizer, [""])


def test_choice_loglikelihoods_are_the_hand_sums(byte_tokenizer) -> None:
    model = _neox(len(byte_tokenizer), seed=2)
    items = [
        {
            "text": "Fair is foul, and ",
            "choices": ["foul is fair", "fair is foul", "x"],
            "answer": 0,
        },
        {"text": "Double, double", "choices": [" toil", " trouble", ""], "answer": 1},
    ]
    got = choice_loglikelihoods(model, byte_tokenizer, items)
    for item, lls in zip(items, got):
        for choice, ll in zip(item["choices"], lls):
            ids = _ids(byte_tokenizer, item["text"] + choice)
            n = (
                len(choice.encode()) + len(item["text"]) - len(item["text"].rstrip())
            )  # trailing space is scored
            if n == 0:
                assert ll == 0.0
                continue
            with torch.no_grad():
                logp = torch.log_softmax(
                    model(input_ids=torch.tensor([ids[:-1]])).logits[0].double(), -1
                )
            hand = float(
                logp[torch.arange(len(ids) - 1 - n, len(ids) - 1), torch.tensor(ids[-n:])].sum()
            )
            assert ll == pytest.approx(hand, rel=1e-5)


def test_mc_accuracy_on_the_models_own_preferences(byte_tokenizer) -> None:
    model = _neox(len(byte_tokenizer), seed=3)
    letters = [byte_tokenizer.convert_tokens_to_ids(ch) for ch in "abcdefghijklmnopqrstuvwxyz"]
    right, wrong = [], []
    for prompt in ("Macbeth shall", "Thou art", "What's done is", "Lay on, Mac"):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([_ids(byte_tokenizer, prompt)])).logits[
                0, -1, letters
            ]
        best, worst = (
            byte_tokenizer.convert_ids_to_tokens(letters[int(i)])
            for i in (logits.argmax(), logits.argmin())
        )
        right.append({"text": prompt, "choices": [worst, best], "answer": 1})
        wrong.append({"text": prompt, "choices": [best, worst], "answer": 1})
    assert multiple_choice_accuracy(model, byte_tokenizer, right) == 1.0
    assert multiple_choice_accuracy(model, byte_tokenizer, wrong) == 0.0
    assert (
        multiple_choice_accuracy(model, byte_tokenizer, right[:2] + wrong[:2], normalize="bytes")
        == 0.5
    )
    assert math.isnan(
        multiple_choice_accuracy(model, byte_tokenizer, [{"text": "x", "choices": [], "answer": 0}])
    )
    with pytest.raises(ValueError, match="answer"):
        multiple_choice_accuracy(
            model, byte_tokenizer, [{"text": "x", "choices": ["a"], "answer": 1}]
        )

    ds = evaluate(
        model,
        byte_tokenizer,
        [TEXT],
        right + [{"text": "x", "choices": [], "answer": 0}],
        progress=False,
    )
    assert float(ds["mc_accuracy"]) == 1.0 and float(ds["mc_accuracy_norm"]) == 1.0
    assert float(ds["bits_per_byte"]) == pytest.approx(
        bits_per_byte(model, byte_tokenizer, [TEXT]), rel=1e-9
    )
    assert (
        ds.attrs["n_bytes"] == len(TEXT.encode())
        and ds.attrs["n_items"] == 4
        and ds.attrs["n_choices"] == 8
    )
    assert np.isnan(
        float(evaluate(model, byte_tokenizer, [TEXT], [], progress=False)["mc_accuracy"])
    )


def test_heldout_text_is_the_validation_plays() -> None:
    train, val = corpus.split_plays(0)
    texts = corpus.plays()
    full = corpus.heldout_text()
    assert full == "\n".join(texts[s] for s in val)
    assert all(texts[s][:200] not in full for s in train)
    short = corpus.heldout_text(max_chars=1000)
    assert len(short) <= 1000 and short.endswith("\n") and full.startswith(short)
