"""A small hub-compatible HTTP server on 127.0.0.1 for offline tests of the fetch stage.

It serves folders ``root/{models,datasets}/<repo>/<revision>/...`` through the routes
huggingface_hub calls: repo info (``/api/{models,datasets}/<repo>/revision/<revision>``, with
each file's size, blob id and LFS SHA-256 when asked ``?blobs=True``), the
recursive file tree (``/api/.../tree/<revision>``) and file downloads (HEAD and GET of
``[/datasets]/<repo>/resolve/<revision>/<file>`` with ``X-Repo-Commit`` and ``ETag`` = the git
blob id). A revision's commit is the SHA-1 of ``<repo>@<revision>``; commits resolve too. Every
request is logged; the server shuts itself down after ``lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


def commit_of(repo: str, revision: str) -> str:
    """The 40-hex commit id the server gives a repo's revision."""
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


def blob_id(data: bytes) -> str:
    """Git's blob id of a file (what the hub sends as the ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# the suffixes stored with Git LFS (as a hub repo's .gitattributes has them)
LFS = (".safetensors", ".bin", ".parquet", ".pt", ".gguf")


def sibling(path: Path, folder: Path, blobs: bool) -> dict[str, object]:
    """A file of a repo info's ``siblings``; with ``blobs`` (``files_metadata=True``) its size,
    git blob id and, for an LFS file, its SHA-256 (the blob id then the pointer file's)."""
    entry: dict[str, object] = {"rfilename": str(path.relative_to(folder))}
    if not blobs:
        return entry
    data = path.read_bytes()
    entry.update(size=len(data), blobId=blob_id(data))
    if path.suffix in LFS:
        sha = hashlib.sha256(data).hexdigest()
        pointer = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {len(data)}\n"
        )
        entry["blobId"] = blob_id(pointer.encode())
        entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": len(pointer)}
    return entry


class LocalHub:
    """Serve ``root`` on 127.0.0.1 (``endpoint``) until ``stop()`` or ``lifetime`` seconds."""

    def __init__(self, root: Path, lifetime: float = 600.0, log: Path | None = None) -> None:
        self.root = root
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.log = log
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.timer = threading.Timer(lifetime, self.stop)
        self.timer.daemon = True

    def __enter__(self) -> LocalHub:
        self.thread.start()
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop serving (idempotent)."""
        self.timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def _revision_folder(self, kind: str, repo: str, revision: str) -> Path | None:
        base = self.root / kind / repo
        if not base.is_dir():
            return None
        for folder in base.iterdir():
            if revision in (folder.name, commit_of(repo, folder.name)):
                return folder
        return None

    def _route(self, path: str) -> tuple[str, str, str, str, str] | None:
        """(action, kind, repo, revision, file) of a request path, None if not a hub route."""
        parts = unquote(urlsplit(path).path).strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in ("models", "datasets"):
            action = parts[4]
            if action in ("revision", "tree"):
                return action, parts[1], "/".join(parts[2:4]), parts[5], "/".join(parts[6:])
            return None
        kind = "models"
        if parts[0] == "datasets":
            kind, parts = "datasets", parts[1:]
        if len(parts) >= 5 and parts[2] == "resolve":
            return "resolve", kind, "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        return None

    def handle(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        self.requests.append((request.command, request.path))
        if self.log is not None:
            with open(self.log, "a") as handle:
                handle.write(f"{request.command} {request.path}\n")
        route = self._route(request.path)
        folder = self._revision_folder(*route[1:4]) if route else None
        if route is None or folder is None:
            return self._send(request, 404, b'{"error": "not found"}', {}, body)
        action, kind, repo, _, name = route
        commit = commit_of(repo, folder.name)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        headers = {"X-Repo-Commit": commit}
        if action == "revision":
            blobs = "blobs=" in urlsplit(request.path).query  # files_metadata=True
            info = {
                "id": repo,
                "sha": commit,
                "private": False,
                "siblings": [sibling(p, folder, blobs) for p in files],
            }
            return self._send(request, 200, json.dumps(info).encode(), headers, body)
        if action == "tree":
            tree = [
                {
                    "type": "file",
                    "path": str(p.relative_to(folder)),
                    "size": p.stat().st_size,
                    "oid": blob_id(p.read_bytes()),
                }
                for p in files
                if str(p.relative_to(folder)).startswith(name)
            ]
            return self._send(request, 200, json.dumps(tree).encode(), headers, body)
        target = folder / name
        if not target.is_file():
            return self._send(request, 404, b"", {**headers, "X-Error-Code": "EntryNotFound"}, body)
        data = target.read_bytes()
        return self._send(request, 200, data, {**headers, "ETag": f'"{blob_id(data)}"'}, body)

    @staticmethod
    def _send(
        request: BaseHTTPRequestHandler,
        status: int,
        data: bytes,
        headers: dict[str, str],
        body: bool,
    ) -> None:
        request.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            request.send_header(key, value)
        request.end_headers()
        if body:
            request.wfile.write(data)


# --- what it serves in the tests: a tiny model at three revisions, a tiny ARC set ---------


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
SPLITS = {"test": 5, "validation": 2}  # rows of ARC-Challenge
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


def save_arc(folder: Path, tag: str = "") -> None:
    """A leaderboard-style ARC set: two configs, the challenge one with test and validation;
    ``tag`` ends every question (another revision of the same set)."""
    import datasets

    folder.mkdir(parents=True)
    (folder / "README.md").write_text(ARC_CARD)
    for split, n in SPLITS.items():
        rows = {
            "question": [f"which planet is closest to the sun {i}{tag}" for i in range(n)],
            "choices": [{"text": ["mercury", "mars"], "label": ["A", "B"]}] * n,
            "answerKey": ["A"] * n,
        }
        path = folder / "ARC-Challenge" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(rows).to_parquet(path)
    (folder / "ARC-Easy").mkdir()
    (folder / "ARC-Easy" / "test-00000-of-00001.parquet").write_bytes(b"not fetched")


def build(root: Path) -> None:
    """The local hub's repos: the model at step0, step16 and main (= step16's weights), ARC at
    main and at v1 (its questions end in " v1")."""
    for revision, seed in [("step0", 0), ("step16", 16), ("main", 16)]:
        save_revision(root / "models" / MODEL / revision, seed)
    save_arc(root / "datasets" / ARC / "main")
    save_arc(root / "datasets" / ARC / "v1", tag=" v1")


# A workflow config on that hub: a checkpoint suite at steps 0 and 16 (revision_template), the
# final revision, the ARC prompts; one checkpoint revision on disk at a time.
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
        "neox": {"source": {"hub": MODEL}, "meta": {"n_layers": 2, "d_model": 16, "score": 1.0}},
    },
    "evaluate": {"enabled": False, "score": "score"},  # no held-out text: a (dummy) table score
    "hub": {"cache_dir": "cache", "max_revisions": 1},
}
TARGETS = [
    f"results/extract/{m}/{s}/depth.nc"
    for m, s in [("neox-steps", "0"), ("neox-steps", "16"), ("neox", "final")]
]


def main_job_spec(folder: Path) -> dict:
    """The job spec of the served model's main revision fetched into ``folder``, on the CPU
    (``lm.model_jobs.load_for_job``)."""
    return {
        "name": "neox",
        "source": {"hub": MODEL},
        "load": {"device": "cpu"},
        "random_twin": False,
        "twin_seed": 0,
        "fetched": str(folder),
    }


def check_run(workdir: Path, requests: list[tuple[str, str]]) -> list[str]:
    """What is wrong with a finished run of CONFIG in ``workdir`` whose hub got ``requests``
    (empty: nothing): the manifests of the four fetches (commits, only the files loading
    needs), at most max_revisions checkpoint revisions on disk at each fetch and none left,
    no hub request but the fetches' downloads (compute jobs offline), the right revision behind
    each step (main and step16 hold the same weights, step0 others), the hub prompts."""
    import xarray as xr

    from blockcoupling.lm.hub.cache import checkpoints_on_disk

    problems = []
    cache = workdir / CONFIG["hub"]["cache_dir"]
    manifests = {
        path.relative_to(cache / "manifests").as_posix(): json.loads(path.read_text())
        for path in (cache / "manifests").rglob("*.json")
    }
    expected = [
        f"checkpoint/{MODEL}/step0.json",
        f"checkpoint/{MODEL}/step16.json",
        f"dataset/{ARC}/main.json",
        f"model/{MODEL}/main.json",
    ]
    if sorted(manifests) != expected:
        return [f"manifests {sorted(manifests)}, expected {expected}"]
    for name, manifest in manifests.items():
        if manifest["commit"] != commit_of(manifest["repo"], manifest["revision"]):
            problems.append(f"{name}: commit {manifest['commit']} is not the served one")
    model_files = set(manifests[f"checkpoint/{MODEL}/step0.json"]["files"])
    needed = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    if not needed <= model_files or "training_args.bin" in model_files:
        problems.append(f"model files fetched: {sorted(model_files)}")
    data_files = set(manifests[f"dataset/{ARC}/main.json"]["files"])
    arc = {"README.md", *(f"ARC-Challenge/{s}-00000-of-00001.parquet" for s in SPLITS)}
    if data_files != arc:
        problems.append(f"dataset files fetched: {sorted(data_files)}")
    bound = CONFIG["hub"]["max_revisions"]
    for step in ("step0", "step16"):
        on_disk = manifests[f"checkpoint/{MODEL}/{step}.json"]["checkpoints_on_disk"]
        if on_disk > bound:
            problems.append(f"{step}: {on_disk} checkpoint revisions on disk, bound {bound}")
    if checkpoints_on_disk(cache):
        problems.append(f"{checkpoints_on_disk(cache)} checkpoint revisions left in the cache")
    if not (cache / "models" / MODEL / "main" / "model.safetensors").is_file():
        problems.append("the main revision was not kept")
    downloads = [path for method, path in requests if method == "GET" and "/resolve/" in path]
    fetched = sum(len(m["files"]) for m in manifests.values())
    if len(downloads) != fetched + 1:  # + the dataset card read to choose its files
        problems.append(f"{len(downloads)} downloads from the hub, {fetched} + 1 fetched")
    depth = {
        (m, s): xr.load_dataset(workdir / f"results/extract/{m}/{s}/depth.nc")
        for m, s in [("neox-steps", "0"), ("neox-steps", "16"), ("neox", "final")]
    }
    if depth[("neox-steps", "16")].attrs["source"] != f"hub:{MODEL}@step16":
        problems.append(f"step 16 source {depth[('neox-steps', '16')].attrs['source']}")
    if not depth[("neox-steps", "16")].equals(depth[("neox", "final")]):
        problems.append("step 16 and main (the same weights) differ")
    if depth[("neox-steps", "0")].equals(depth[("neox-steps", "16")]):
        problems.append("step 0 and step 16 (different weights) are equal")
    lines = (workdir / "results/prompts/board.jsonl").read_text().splitlines()
    if [json.loads(line)["source"] for line in lines] != ["arc", "arc"]:
        problems.append(f"prompts {lines}")
    return problems


def main(argv: list[str]) -> int:
    """``build ROOT WORKDIR``: the hub's repos in ROOT, CONFIG in WORKDIR/config.yaml, TARGETS
    printed. ``serve ROOT ENDPOINT_FILE LOG``: serve ROOT (the endpoint written to a file, each
    request appended to LOG) until killed or ``--lifetime`` seconds. ``check WORKDIR LOG``: one
    line per problem of check_run, exit status 1 if any."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "serve", "check"])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--lifetime", type=float, default=900.0)
    args = parser.parse_args(argv)
    if args.command == "build":
        import yaml

        root, workdir = args.paths
        build(root)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        print(" ".join(TARGETS))
    elif args.command == "serve":
        root, endpoint_file, log = args.paths
        with LocalHub(root, args.lifetime, log) as server:
            endpoint_file.write_text(server.endpoint)
            server.thread.join()
    else:
        workdir, log = args.paths
        lines = log.read_text().splitlines() if log.is_file() else []
        problems = check_run(workdir, [tuple(line.split(" ", 1)) for line in lines])
        for problem in problems:
            print(f"hub run: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
