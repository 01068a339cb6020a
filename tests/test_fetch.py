"""The fetch stage against a local hub (tests/hub_server.py on 127.0.0.1, HF_ENDPOINT): hub ids,
revision_template wildcards, snapshot_download and datasets.load_dataset through their real code
paths; compute jobs offline; checkpoint revisions deleted as their jobs finish, within
hub.max_revisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hub_server import LocalHub, commit_of

from blockcoupling import hub
from blockcoupling.workflow import ModelEntry

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny-org/neox"
ARC = "allenai/ai2_arc"
ARC_CARD = """---
configs:
- config_name: ARC-Challenge
  data_files:
  - split: test
    path: ARC-Challenge/test-*
  - split: validation
    path: ARC-Challenge/validation-*
- config_name: ARC-Easy
  data_files:
  - split: test
    path: ARC-Easy/test-*
---
# a tiny ARC-style set
"""
WORDS = "which planet is closest to the sun mercury mars venus what gas do plants take in".split()


def save_revision(folder: Path, seed: int) -> None:
    """A tiny GPT-NeoX (2 layers, width 16) with a word-level tokenizer, as a hub repo holds it
    (config, safetensors weights, tokenizer files)."""
    import tokenizers
    import torch
    import transformers

    config = transformers.GPTNeoXConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    transformers.GPTNeoXForCausalLM(config).save_pretrained(folder)
    vocab = {word: i for i, word in enumerate(["[UNK]", "<s>", "</s>", *WORDS])}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", bos_token="<s>", eos_token="</s>"
    ).save_pretrained(folder)
    (folder / "training_args.bin").write_bytes(b"not needed to load")


def save_arc(folder: Path) -> None:
    """A leaderboard-style ARC set: two configs, the challenge one with test and validation."""
    import datasets

    folder.mkdir(parents=True)
    (folder / "README.md").write_text(ARC_CARD)
    for config, split, n in [("ARC-Challenge", "test", 5), ("ARC-Challenge", "validation", 2)]:
        rows = {
            "question": [f"which planet is closest to the sun {i}" for i in range(n)],
            "choices": [{"text": ["mercury", "mars"], "label": ["A", "B"]}] * n,
            "answerKey": ["A"] * n,
        }
        path = folder / config / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows).to_parquet(path)
    (folder / "ARC-Easy").mkdir()
    (folder / "ARC-Easy" / "test-00000-of-00001.parquet").write_bytes(b"not fetched")


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    for revision, seed in [("step0", 0), ("step16", 16), ("main", 16)]:
        save_revision(root / "models" / MODEL / revision, seed)
    save_arc(root / "datasets" / ARC / "main")
    return root


# --- the planning of revisions and lanes (no server) ---------------------------------------


def entry(name: str, source: dict, steps: tuple[str, ...]) -> ModelEntry:
    return ModelEntry(name, source, steps)


def test_revisions_lanes_keep_at_most_the_bound_on_disk() -> None:
    models = {
        "a-steps": entry("a-steps", {"hub": "o/a"}, ("0", "1", "2", "3", "4")),
        "b-steps": entry("b-steps", {"hub": "o/b"}, ("0", "8")),
        "a": entry("a", {"hub": "o/a"}, ("final", "random")),
        "c": entry("c", {"hub": "o/c", "revision": "v1"}, ("final",)),
        "t": entry("t", {"train": "run"}, ("final",)),
    }
    revisions = hub.hub_revisions(models)
    kept = [(r.repo, r.revision) for r in revisions if not r.checkpoint]
    assert kept == [("o/a", "main"), ("o/c", "v1")]
    main = next(r for r in revisions if r.revision == "main")
    assert main.consumers == (("a", "final"), ("a", "random"))
    checkpoints = [r for r in revisions if r.checkpoint]
    assert len(checkpoints) == 7
    for bound in (1, 2, 3, 7, 9):
        # Simulate the scheduler: a fetch may start once its predecessor's jobs are done; jobs
        # finish in any order that respects that. On disk: fetched, jobs not yet done.
        fetched: list[hub.Revision] = []
        done: set[int] = set()
        peak = 0
        pending = list(checkpoints)
        while pending or len(done) < len(fetched):
            ready = [
                r
                for r in pending
                if (before := hub.predecessor(revisions, r, bound)) is None or id(before) in done
            ]
            if ready:
                fetched.append(ready[0])
                pending.remove(ready[0])
            else:  # finish the oldest revision on disk
                done.add(next(id(r) for r in fetched if id(r) not in done))
            peak = max(peak, len(fetched) - len(done))
        assert peak == min(bound, len(checkpoints))


def test_dataset_patterns_follow_the_card() -> None:
    assert hub.dataset_patterns(ARC_CARD, "ARC-Challenge") == [
        "ARC-Challenge/test-*",
        "ARC-Challenge/validation-*",
    ]
    assert hub.dataset_patterns(ARC_CARD, "ARC-Easy") == ["ARC-Easy/test-*"]
    with pytest.raises(hub.HubCacheError, match="no config 'other'"):
        hub.dataset_patterns(ARC_CARD, "other")


def test_a_missing_revision_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    from blockcoupling.models import load_for_job

    spec = {
        "name": "neox-steps",
        "source": {"hub": MODEL, "revision": "step16"},
        "load": {"device": "cpu"},
        "random_twin": False,
        "twin_seed": 0,
        "fetched": str(tmp_path / "checkpoints" / MODEL / "step16"),
    }
    with pytest.raises(hub.HubCacheError) as error:
        load_for_job(spec)
    message = str(error.value)
    assert "\n" not in message
    assert f"models.neox-steps: revision step16 of {MODEL} is not in the hub cache" in message


# --- the workflow from an empty cache, against the local hub ----------------------------------


CONFIG = {
    "prompts": {"sets": {"board": {"hub": ["arc"]}}, "n_per_source": 2, "seed": 0},
    "extract": {
        "prompt_set": "board",
        "k_max": 4,
        "max_tokens": 6,
        "token_layers": [-1],
        "token_prompts": 1,
        "threads": 1,
        "device": "cpu",
    },
    "metrics": {"ks": [2, 4]},
    "random_init": {"enabled": True, "seed": 0},
    "models": {
        "neox-steps": {
            "source": {"hub": MODEL},
            "steps": [0, 16],
            "revision_template": "step{step}",
            "token_families": False,
            "meta": {"n_layers": 2, "d_model": 16},
        },
        "neox": {"source": {"hub": MODEL}, "meta": {"n_layers": 2, "d_model": 16}},
    },
    "evaluate": {"enabled": False},
    "hub": {"cache_dir": "cache", "max_revisions": 1},
}
TARGETS = [
    f"results/extract/{m}/{s}/depth.nc"
    for m, s in [("neox-steps", "0"), ("neox-steps", "16"), ("neox", "final")]
]


@pytest.mark.slow
def test_the_workflow_fetches_then_runs_offline_within_the_revision_bound(
    hub_root: Path, tmp_path: Path
) -> None:
    import xarray as xr

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile")]
    command += ["--directory", str(tmp_path), "--configfile", str(tmp_path / "config.yaml")]
    with LocalHub(hub_root, lifetime=600) as server:
        env = dict(os.environ, HF_ENDPOINT=server.endpoint, HF_HOME=str(tmp_path / "hf_home"))
        env.pop("HF_HUB_OFFLINE", None)
        run = subprocess.run(
            [*command, "--cores", "1", *TARGETS],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert run.returncode == 0, run.stderr[-4000:]
    cache = tmp_path / "cache"
    manifests = {
        path.relative_to(cache / "manifests").as_posix(): json.loads(path.read_text())
        for path in (cache / "manifests").rglob("*.json")
    }
    assert sorted(manifests) == [
        f"checkpoint/{MODEL}/step0.json",
        f"checkpoint/{MODEL}/step16.json",
        f"dataset/{ARC}/main.json",
        f"model/{MODEL}/main.json",
    ]
    for name, manifest in manifests.items():
        assert manifest["commit"] == commit_of(manifest["repo"], manifest["revision"]), name
    weights = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert weights <= set(manifests[f"checkpoint/{MODEL}/step0.json"]["files"])
    assert "training_args.bin" not in manifests[f"checkpoint/{MODEL}/step0.json"]["files"]
    assert set(manifests[f"dataset/{ARC}/main.json"]["files"]) == {
        "README.md",
        "ARC-Challenge/test-00000-of-00001.parquet",
        "ARC-Challenge/validation-00000-of-00001.parquet",
    }
    # max_revisions 1: step16 was fetched only after step0's jobs were done and its folder gone.
    for step in ("step0", "step16"):
        assert manifests[f"checkpoint/{MODEL}/{step}.json"]["checkpoints_on_disk"] == 1
    assert hub.checkpoints_on_disk(cache) == 0  # both deleted once their jobs were done
    assert (cache / "models" / MODEL / "main" / "model.safetensors").is_file()  # kept
    # Compute jobs made no request: each file downloaded once, by its fetch (plus the card
    # read to choose the dataset's files).
    downloads = [
        path for method, path in server.requests if method == "GET" and "/resolve/" in path
    ]
    fetched = sum(len(m["files"]) for m in manifests.values())
    assert len(downloads) == fetched + 1
    # The right revision behind each step: main and step16 hold the same weights, step0 others.
    depth = {
        (m, s): xr.load_dataset(tmp_path / f"results/extract/{m}/{s}/depth.nc")
        for m, s in [("neox-steps", "0"), ("neox-steps", "16"), ("neox", "final")]
    }
    assert depth[("neox-steps", "16")].attrs["source"] == f"hub:{MODEL}@step16"
    assert depth[("neox-steps", "0")].attrs["revision"] == "step0"
    xr.testing.assert_equal(depth[("neox-steps", "16")], depth[("neox", "final")])
    assert not depth[("neox-steps", "0")].equals(depth[("neox-steps", "16")])
    prompts = (tmp_path / "results/prompts/board.jsonl").read_text().splitlines()
    assert [json.loads(line)["source"] for line in prompts] == ["arc", "arc"]
