"""Loading a model from its source (``lm.sources``): options, the GGUF conversion, a rule's
load, and the random-init twin (the adapter table: jacobians.adapters).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockcoupling.files.io import permissions
from blockcoupling.jacobians.adapters import UnknownArchitectureError
from blockcoupling.lm import hub
from blockcoupling.lm.gguf_once import one_parse_per_file
from blockcoupling.lm.sources import ModelSource, ModelSourceError, Resolved, parse_source, resolve
from blockcoupling.runtime.device import resolve_device
from blockcoupling.runtime.progress import on_terminal

if TYPE_CHECKING:  # torch is imported where weights are touched: parsing sources stays light
    import torch
    from torch import nn


def convert_gguf(source: ModelSource, target: Path) -> Path:
    """Write the model of a GGUF ``source`` (de-quantized to float32, as every job loads it) and
    its tokenizer as a ``save_pretrained`` folder ``target`` (safetensors, tokenizer.json, and
    ``source.json`` naming the GGUF), atomically; loading the folder gives the same weights and
    tokenization as loading the GGUF.
    """
    model, tokenizer = load_model(source, LoadOptions(device="cpu"))
    return write_converted(model, tokenizer, source, target)


def write_converted(model: nn.Module, tokenizer: Any, source: ModelSource, target: Path) -> Path:
    """``convert_gguf``'s folder from the GGUF ``source`` already loaded on the CPU by
    ``load_model`` as ``(model, tokenizer)``; the model's quantization records are dropped.
    """
    # the weights are de-quantized float32 tensors: nothing of the GGUF's quantization is left
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / "source.json").write_text(json.dumps({"source": source.describe()}) + "\n")
    for path in partial.rglob("*"):  # safetensors writes 0600: the umask's, as every result
        if path.is_file():
            permissions(path)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def load_for_job(spec: dict[str, Any]) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Load a rule's model from its spec (name, source, load options, twin, twin seed, and for
    a hub source ``fetched``: its folder in the hub cache, read offline):
    ``(model, tokenizer, attrs)`` with the provenance attrs of its files.
    """
    import logging

    from transformers.utils import logging as hf_logging

    if not on_terminal():  # no carriage-return frames of loading bars in a rule's log
        hf_logging.disable_progress_bar()
    source = parse_source(spec["source"])
    where = source
    if spec.get("fetched"):  # a hub revision: read offline from its folder in the hub cache
        fetched = hub.require(
            spec["fetched"], f"models.{spec['name']}", source.location, source.revision or "main"
        )
        where = ModelSource("path", str(fetched))
    if spec.get("converted"):  # a GGUF source: its folder written once by convert_gguf
        where = ModelSource("path", spec["converted"])
    load = dict(spec.get("load", {}))
    load["device"] = resolve_device(load.get("device", "auto"))
    options = LoadOptions(**load)
    if spec.get("random_twin"):
        logging.info(
            "random-init twin of %s (%s), seed %s",
            spec["name"],
            source.describe(),
            spec["twin_seed"],
        )
        model, tokenizer = load_random_twin(where, spec["twin_seed"], options)
    else:
        logging.info("loading %s (%s) on %s", spec["name"], source.describe(), options.device)
        model, tokenizer = load_model(where, options)
    attrs = {
        "model": spec["name"],
        "model_id": source.location,
        "revision": source.revision,
        "source": source.describe(),
        "init": "random" if spec.get("random_twin") else "trained",
        "twin_seed": spec["twin_seed"] if spec.get("random_twin") else None,
        "dtype": options.dtype,
        "device": options.device,
        "quantization": options.quantization,
        **({"quant_4bit": options.quant_4bit()} if options.quantization == "4bit" else {}),
    }
    return model, tokenizer, attrs


DTYPES = ("float32", "float64", "float16", "bfloat16")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a DTYPES name."""
    import torch

    return getattr(torch, name)


TASKS = ("causal-lm", "encoder")


# bitsandbytes 4-bit settings when a model's load options leave them out: NF4 (the 4-bit
# NormalFloat of QLoRA, Dettmers et al. 2023: quantiles of a normal distribution, which trained
# weights follow; lower error than FP4 at the same size), double quantization (the blocks'
# scales quantized too: about 0.4 bits per parameter saved, no measurable loss in QLoRA), and
# float32 compute (the recorded block inputs then come from the same float32 arithmetic as the
# Jacobians, which are always taken in float32 on the dequantized weights). bitsandbytes' own
# defaults are FP4, no double quantization and float32 compute.
QUANT_4BIT_DEFAULTS = {"quant_type": "nf4", "double_quant": True, "compute_dtype": "float32"}
QUANT_TYPES = ("nf4", "fp4")


@dataclass(frozen=True)
class LoadOptions:
    """How ``load_model`` and ``load_random_twin`` load a model.

    Parameters
    ----------
    dtype : str
        Storage dtype of the weights, one of ``DTYPES``.
    device : str
        ``auto`` (the default everywhere: CUDA when a GPU is visible, else the CPU), ``cpu``,
        ``cuda[:N]`` or ``mps``; resolved when the model is loaded.
    quantization : str or None
        None, ``4bit`` or ``8bit`` (bitsandbytes).
    task : str
        ``causal-lm`` or ``encoder`` (no tokenizer is loaded for an encoder).
    device_map : str or None
        ``auto``: accelerate spreads the blocks over every visible GPU, for models larger than
        one; each block's Jacobians are then taken on its own device.
    quant_type, double_quant, compute_dtype : optional
        4-bit loading only (nf4/fp4, double quantization, compute dtype); None:
        ``QUANT_4BIT_DEFAULTS``.
    extra : dict
        Further keyword arguments of ``from_pretrained``.

    Examples
    --------
    >>> from blockcoupling.lm.models import LoadOptions
    >>> LoadOptions(dtype="float64").device
    'auto'
    """

    dtype: str = "float32"
    device: str = "auto"
    quantization: str | None = None
    task: str = "causal-lm"
    device_map: str | None = None
    quant_type: str | None = None
    double_quant: bool | None = None
    compute_dtype: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.device_map not in (None, "auto"):
            raise ValueError(f"device_map {self.device_map!r} is not one of null, auto")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.quantization not in (None, "4bit", "8bit"):
            raise ValueError(f"quantization {self.quantization!r} is not one of null, 4bit, 8bit")
        if self.task not in TASKS:
            raise ValueError(f"task {self.task!r} is not one of {', '.join(TASKS)}")
        if self.quant_type not in (None, *QUANT_TYPES):
            raise ValueError(f"quant_type {self.quant_type!r} is not one of nf4, fp4")
        if self.compute_dtype not in (None, *DTYPES):
            raise ValueError(f"compute_dtype {self.compute_dtype!r} is not one of {DTYPES}")
        given = [key for key in QUANT_4BIT_DEFAULTS if getattr(self, key) is not None]
        if given and self.quantization != "4bit":
            raise ValueError(
                f"{', '.join(given)} set only 4-bit loading; add quantization: 4bit or remove them"
            )

    def quant_4bit(self) -> dict[str, Any]:
        """The 4-bit settings in force: the given ones over ``QUANT_4BIT_DEFAULTS``."""
        return {
            key: default if getattr(self, key) is None else getattr(self, key)
            for key, default in QUANT_4BIT_DEFAULTS.items()
        }


def _auto_class(task: str) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM if task == "causal-lm" else transformers.AutoModel


def _quantization_config(options: LoadOptions) -> Any:
    if options.quantization is None:
        return None
    from transformers import BitsAndBytesConfig

    if options.quantization == "4bit":
        settings = options.quant_4bit()
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=settings["quant_type"],
            bnb_4bit_use_double_quant=settings["double_quant"],
            bnb_4bit_compute_dtype=torch_dtype(settings["compute_dtype"]),
        )
    return BitsAndBytesConfig(load_in_8bit=True)


def load_model(source: ModelSource, options: LoadOptions = LoadOptions()) -> tuple[nn.Module, Any]:
    """A trained model and its tokenizer from a parsed source.

    In eval mode with eager attention (needed for batched VJPs and forward-mode AD; sdpa has
    neither on CPU) and eager mixture-of-experts layers (grouped_mm has no float64 kernel and
    no vmap rule). ``blockcoupling.load_model`` is the same from a source string.

    Parameters
    ----------
    source : ModelSource
        Where the model is (``lm.sources.parse_source``).
    options : LoadOptions
        dtype, device (default ``auto``), quantization, task.

    Returns
    -------
    model : torch.nn.Module
        The model, on ``options.device`` (resolved) or spread by ``device_map``.
    tokenizer : Any
        Its tokenizer; None for non-text models.

    Examples
    --------
    >>> from blockcoupling.lm.models import LoadOptions, load_model
    >>> from blockcoupling.lm.sources import parse_source
    >>> source = parse_source({"hub": "gpt2"})
    >>> model, tokenizer = load_model(source, LoadOptions(dtype="float64"))  # doctest: +SKIP
    """
    options = _resolved(options)
    where = resolve(source)
    kwargs = _pretrained_kwargs(where, options)
    quantization = _quantization_config(options)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
    if quantization is not None or options.device_map:  # weights straight to their devices
        kwargs["device_map"] = options.device_map or options.device
    with _reads(where), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Detected pickle protocol")  # a .bin refused below
        try:
            model = _auto_class(options.task).from_pretrained(where.name_or_path, **kwargs)
        except pickle.UnpicklingError:
            raise ModelSourceError(
                f"cannot load {source.describe()}: its PyTorch .bin weights hold more than "
                "tensors (torch.load with weights_only=True refused to unpickle them; nothing "
                "ran); blockcoupling never unpickles code: use the model's .safetensors weights"
            ) from None
        except (OSError, ValueError) as error:
            raise ModelSourceError(
                f"cannot load {source.describe()}: {str(error).splitlines()[0]}"
            ) from None
        tokenizer = _tokenizer(where, options)
    if "device_map" not in kwargs:
        model = model.to(options.device)
    model.eval()
    return model, tokenizer


def _resolved(options: LoadOptions) -> LoadOptions:
    """``options`` with its device resolved (``auto``: CUDA when a GPU is visible, else CPU)."""
    from dataclasses import replace

    device = resolve_device(options.device)
    return options if device == options.device else replace(options, device=device)


def _reads(where: Resolved) -> AbstractContextManager[None]:
    """A GGUF's config, weights and tokenizer from one parse of its header (gguf_once)."""
    return one_parse_per_file() if where.gguf_file else nullcontext()


def load_random_twin(
    source: ModelSource, seed: int, options: LoadOptions = LoadOptions()
) -> tuple[nn.Module, Any]:
    """The random-init twin of a parsed source, and its tokenizer, without reading its weights.

    ``blockcoupling.load_random_twin`` is the same from a source string.

    Parameters
    ----------
    source : ModelSource
        Where the model is (its config and tokenizer are read).
    seed : int
        Seed of the initialisation: the same seed gives the same weights on the same kind of
        device.
    options : LoadOptions
        dtype, device (default ``auto``), task.

    Returns
    -------
    twin : torch.nn.Module
        The source's architecture and config with a seeded random initialisation, in eval
        mode; equal to ``random_twin_of(load_model(source, options)[0], seed)``.
    tokenizer : Any
        Its tokenizer; None for non-text models.

    Examples
    --------
    >>> from blockcoupling.lm.models import load_random_twin
    >>> from blockcoupling.lm.sources import parse_source
    >>> twin, tokenizer = load_random_twin(parse_source({"hub": "gpt2"}), seed=0)  # doctest: +SKIP
    """
    import transformers

    options = _resolved(options)
    where = resolve(source)
    kwargs = {
        k: v
        for k, v in _pretrained_kwargs(where, options).items()
        if k in ("gguf_file", "revision", "trust_remote_code")
    }
    with _reads(where):
        try:
            config = transformers.AutoConfig.from_pretrained(where.name_or_path, **kwargs)
        except (OSError, ValueError) as error:
            raise ModelSourceError(
                f"cannot load the config of {source.describe()}: {str(error).splitlines()[0]}"
            ) from None
        mapping = _auto_class(options.task)._model_mapping
        if type(config) not in mapping:
            raise UnknownArchitectureError(
                f"{source.describe()}: no {options.task} model class for config "
                f"{type(config).__name__} (model_type {getattr(config, 'model_type', None)!r})"
            )
        tokenizer = _tokenizer(where, options)
    dtype = torch_dtype(options.dtype)
    if options.device_map:  # larger than one device: built on the CPU, then spread
        import accelerate

        twin = _seeded_init(mapping[type(config)], config, dtype, seed, "cpu")
        device_map = accelerate.infer_auto_device_map(
            twin, no_split_module_classes=twin._no_split_modules, dtype=dtype
        )
        twin = accelerate.dispatch_model(twin, device_map)
    else:
        twin = _seeded_init(mapping[type(config)], config, dtype, seed, options.device)
    return twin, tokenizer


def _pretrained_kwargs(where: Resolved, options: LoadOptions) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "attn_implementation": "eager",
        "experts_implementation": "eager",
        "dtype": torch_dtype(options.dtype),
        **options.extra,
        "trust_remote_code": False,  # never a model's own code (resolve refuses auto_map)
    }
    if where.gguf_file:
        kwargs["gguf_file"] = where.gguf_file
    if where.revision:
        kwargs["revision"] = where.revision
    return kwargs


def _tokenizer(where: Resolved, options: LoadOptions) -> Any:
    if options.task != "causal-lm":
        return None
    import transformers

    kwargs = {k: v for k, v in (("gguf_file", where.gguf_file), ("revision", where.revision)) if v}
    return transformers.AutoTokenizer.from_pretrained(
        where.name_or_path, trust_remote_code=False, **kwargs
    )


def _seeded_init(
    cls: type, config: Any, dtype: torch.dtype, seed: int, device: str | torch.device = "cpu"
) -> nn.Module:
    """A seeded random initialisation, created directly in the storage ``dtype`` on ``device``
    (no float32 or host copy of a half-precision twin). The same seed gives the same weights on
    the same kind of device (CPU and CUDA generators differ).
    """
    import torch

    device = torch.device(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(seed)
        model = cls._from_config(
            config, dtype=dtype, attn_implementation="eager", experts_implementation="eager"
        )
    return model.eval()


def random_twin_of(model: nn.Module, seed: int) -> nn.Module:
    """The random-init twin of a model already loaded.

    Parameters
    ----------
    model : torch.nn.Module
        A loaded model (its config and the storage dtype and device of its weights are read).
    seed : int
        Seed of the initialisation.

    Returns
    -------
    torch.nn.Module
        The same architecture and config with a fresh, seeded random initialisation, in eval
        mode, same storage dtype and device (quantized models get a float32 twin).

    Examples
    --------
    >>> from blockcoupling.lm.models import random_twin_of
    >>> twin = random_twin_of(model, seed=0)  # doctest: +SKIP
    """
    parameter = next(model.parameters())
    dtype = parameter.dtype if parameter.is_floating_point() else torch_dtype("float32")
    return _seeded_init(type(model), model.config, dtype, seed, parameter.device)


def __getattr__(name: str) -> Any:
    """``random_twin(model, seed)``, the name before the rename (``random_twin_of``: a loaded
    model's twin; ``load_random_twin``: a source's), with a DeprecationWarning.
    """
    if name == "random_twin":
        warnings.warn(
            "blockcoupling.lm.models.random_twin is renamed random_twin_of; "
            "the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return random_twin_of
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
