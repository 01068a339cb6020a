"""Prompt files, sampling, round trips, bad input, and the hub row converters."""

import json
from collections import Counter
from pathlib import Path

import pytest

from blockcoupling.lm.text.prompts import (
    SOURCES,
    Prompt,
    load_prompt_file,
    read_jsonl,
    sample_prompts,
    write_jsonl,
)

DEFAULT = Path(__file__).resolve().parents[1] / "resources" / "prompts" / "default.jsonl"
STYLES = {"arc", "gsm8k", "hellaswag", "mmlu", "truthfulqa", "winogrande"}


@pytest.fixture(scope="module")
def default_prompts():
    return load_prompt_file(DEFAULT)


def test_default_file_contents(default_prompts):
    counts = Counter(p.source for p in default_prompts)
    assert set(counts) == STYLES and min(counts.values()) >= 6 and len(default_prompts) >= 36
    for p in default_prompts:
        assert 8 <= len(p.text.split()) <= 25, p.id
        assert p.id.startswith(f"{p.source}-")
        if p.source == "gsm8k":
            assert p.choices is None and p.answer.isdigit(), p.id
        else:
            assert 2 <= len(p.choices) <= 4 and 0 <= p.answer < len(p.choices), p.id
        if p.source == "winogrande":
            assert p.text.count("_") == 1, p.id
    # The datasets loader and the plain JSON reader agree, types included.
    assert read_jsonl(DEFAULT) == default_prompts


def test_sample_prompts_is_seeded_balanced_and_ordered(default_prompts):
    extra = [Prompt(id="tiny-0001", source="tiny", text="only one prompt here in this source")]
    pool = default_prompts + extra
    a = sample_prompts(pool, n_per_source=3, seed=7)
    assert a == sample_prompts(list(reversed(pool)), n_per_source=3, seed=7)
    assert Counter(p.source for p in a) == {**{s: 3 for s in STYLES}, "tiny": 1}
    assert a == sorted(a, key=lambda p: (p.source, p.id))
    seeds = {tuple(p.id for p in sample_prompts(pool, 3, seed)) for seed in range(5)}
    assert len(seeds) > 1  # the seed matters
    assert sample_prompts(pool, 100, seed=0) == sorted(pool, key=lambda p: (p.source, p.id))


def test_write_read_round_trip(tmp_path, default_prompts):
    out = tmp_path / "prompts.jsonl"
    write_jsonl(default_prompts, out)
    assert read_jsonl(out) == default_prompts
    assert load_prompt_file(out) == default_prompts
    assert [f.name for f in tmp_path.iterdir()] == ["prompts.jsonl"]  # no temp file left
    gsm = next(json.loads(line) for line in out.read_text().splitlines() if '"gsm8k"' in line)
    assert "choices" not in gsm and isinstance(gsm["answer"], str)


def test_csv_input_and_default_ids(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text(
        "text,source,choices,answer\n"
        'Which gas do plants take in from the air?,arc,"[""oxygen"", ""carbon dioxide""]",1\n'
        "How many legs do three spiders have in total?,gsm8k,,24\n"
        "A line of text with no source column value,,,\n"
    )
    got = load_prompt_file(path)
    assert got == [
        Prompt(
            "arc-0001",
            "arc",
            "Which gas do plants take in from the air?",
            ("oxygen", "carbon dioxide"),
            1,
        ),
        Prompt("gsm8k-0002", "gsm8k", "How many legs do three spiders have in total?", None, "24"),
        Prompt("mine-0003", "mine", "A line of text with no source column value", None, None),
    ]


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("empty.jsonl", "  \n", "empty"),
        (
            "notext.jsonl",
            '{"id": "a-1", "prompt": "hello there"}\n',
            r"notext.jsonl line 1 \(id 'a-1'\): empty or missing text",
        ),
        (
            "blank.jsonl",
            '{"id": "a-1", "text": "fine text"}\n{"id": "a-2", "text": "   "}\n',
            r"blank.jsonl line 2 \(id 'a-2'\): empty",
        ),
        ("blank.csv", "id,text\nb-1,fine text\nb-2,\n", r"row 2 \(id 'b-2'\): empty"),
        (
            "dup.jsonl",
            '{"id": "a-1", "text": "x y"}\n{"id": "a-1", "text": "z w"}\n',
            "duplicate prompt id 'a-1'",
        ),
        (
            "badans.jsonl",
            '{"text": "pick one", "choices": ["a", "b"], "answer": 2}\n',
            "out of range",
        ),
        ("prompts.txt", "some text\n", r"\.jsonl or \.csv"),
        ("header.csv", "id,text\n", "header but no rows"),
        ("broken.jsonl", '{"text": "ok fine"}\n{bad}\n', r"broken.jsonl line 2: invalid JSON"),
    ],
)
def test_bad_prompt_files(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_prompt_file(path)


def test_non_utf8_file_names_the_file(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"text": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.jsonl is not UTF-8 text \(byte 13\)"):
        load_prompt_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        load_prompt_file(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="not found"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "good prompt"}\n{not json}\n')
    with pytest.raises(ValueError, match="line 2: invalid JSON"):
        read_jsonl(path)


# Hand-built rows shaped like the real hub datasets.
HUB_ROWS = {
    "arc": (
        {
            "id": "x",
            "question": "Q?",
            "choices": {"text": ["a", "b", "c"], "label": ["1", "2", "3"]},
            "answerKey": "3",
        },
        ("Q?", ["a", "b", "c"], 2),
    ),
    "gsm8k": (
        {"question": "How much?", "answer": "She pays 2 * 600 = <<2*600=1200>>1200.\n#### 1,200"},
        ("How much?", None, "1200"),
    ),
    "hellaswag": (
        {
            "ctx": "[header] How to tie a knot [title] Hold the rope.",
            "endings": ["Loop it [step] twice.", "Eat it."],
            "label": "0",
            "activity_label": "Knots",
        },
        ("How to tie a knot. Hold the rope.", ["Loop it twice.", "Eat it."], 0),
    ),
    "mmlu": (
        {"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1},
        ("2+2?", ["3", "4", "5", "6"], 1),
    ),
    "truthfulqa": (
        {
            "question": "Is it?",
            "mc1_targets": {"choices": ["no", "yes", "maybe"], "labels": [0, 1, 0]},
            "mc2_targets": {"choices": ["no"], "labels": [1]},
        },
        ("Is it?", ["no", "yes", "maybe"], 1),
    ),
    "winogrande": (
        {
            "sentence": "Ann thanked Bo because _ helped.",
            "option1": "Ann",
            "option2": "Bo",
            "answer": "2",
        },
        ("Ann thanked Bo because _ helped.", ["Ann", "Bo"], 1),
    ),
}


@pytest.mark.parametrize("source", sorted(HUB_ROWS))
def test_row_converters(source):
    row, expected = HUB_ROWS[source]
    assert SOURCES[source]["convert"](row) == expected


def test_sources_table():
    assert set(SOURCES) == STYLES
    for spec in SOURCES.values():
        assert {"hub", "config", "split", "convert"} <= set(spec) and "/" in spec["hub"]


def test_heldout_prompts_are_held_out_text_after_the_scored_part():
    from blockcoupling.lm.text import corpus
    from blockcoupling.lm.text.corpus import heldout_text
    from blockcoupling.lm.text.prompts import heldout_prompts

    text = corpus.validation_text(0)
    scored = heldout_text(10_000)
    passages = heldout_prompts(10_000, chars=200)
    assert len(passages) > 100 and {p.source for p in passages} == {"shakespeare"}
    assert all(p.choices is None and p.answer is None for p in passages)
    offsets = [int(p.id.split("-")[1]) for p in passages]
    assert offsets == sorted(offsets) and offsets[0] >= len(scored)  # after the bpb text
    for p, start in zip(passages, offsets):
        assert start == 0 or text[start - 1] == "\n"  # at a line start
        assert (
            text[start:].lstrip().startswith(p.text) and len(p.text) >= 150
        )  # 200 characters, less the stripped spaces
    train_slugs, _ = corpus.split_plays(0)
    training = "\n".join(corpus.plays()[s] for s in train_slugs)
    assert not [p.id for p in passages[::10] if p.text in training]  # never training text
    assert heldout_prompts(len(text) + 5) == []


def test_heldout_passages_are_sampled_seeded_and_merged_in_source_order(default_prompts):
    from blockcoupling.lm.text.prompts import heldout_prompts, merge_sources

    passages = heldout_prompts(10_000)
    leaderboard = sample_prompts(default_prompts, 2, seed=0)
    chosen = merge_sources(leaderboard, sample_prompts(passages, 6, seed=0))
    counts = Counter(p.source for p in chosen)
    assert counts["shakespeare"] == 6 and len(counts) == 7 and len(chosen) == 18
    assert [p for p in chosen if p.source != "shakespeare"] == leaderboard
    assert chosen == sorted(chosen, key=lambda p: (p.source, p.id))
    assert sample_prompts(passages, 6, seed=0) != sample_prompts(passages, 6, seed=1)
    with pytest.raises(ValueError, match="more than one sample"):
        merge_sources(leaderboard, leaderboard[:1])


def test_a_shakespeare_set_counts_its_passages_and_refuses_another_split():
    import copy

    import yaml
    from snakemake.utils import validate

    from blockcoupling.pipeline.checks import check_config
    from blockcoupling.pipeline.errors import ConfigError

    repo = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((repo / "config" / "smoke.yaml").read_text())
    config["prompts"]["sets"]["default"]["shakespeare"] = 0
    validate(config, str(repo / "schemas" / "config.schema.yaml"))
    without = check_config(copy.deepcopy(config), repo, check_memory=False).n_prompts
    config["prompts"]["sets"]["default"]["shakespeare"] = 5
    with_heldout = check_config(copy.deepcopy(config), repo, check_memory=False).n_prompts
    assert with_heldout == without + 5
    config["prompts"]["sets"]["default"]["shakespeare"] = 10**6
    with pytest.raises(ConfigError, match=r"shakespeare=1000000 exceeds the \d+ held-out"):
        check_config(copy.deepcopy(config), repo, check_memory=False)
    config["prompts"]["sets"]["default"]["shakespeare"] = 5
    config["train"]["runs"]["other"] = {"split_seed": 3}
    with pytest.raises(ConfigError, match=r"prompts\.sets\.default\.shakespeare: .*split_seed"):
        check_config(config, repo, check_memory=False)
