"""One parse of a GGUF file per model load.

transformers reads a GGUF's whole header once for the config, once for the weights and once for
the tokenizer (each ``load_gguf_checkpoint`` builds its own ``gguf.GGUFReader``); the header
holds the vocabulary, parsed entry by entry: ~17 s per read for Gemma-3's 262,144 tokens on a
2-vCPU Xeon. Inside :func:`one_parse_per_file` the reads of one file share a reader (read-only:
transformers copies what it keeps), and the weights and tokenizer come out the same. The reader
it builds slices a plain ndarray view of the file's memory map, not the ``np.memmap`` itself,
whose per-slice bookkeeping was two thirds of the parse (Gemma-3: 9.8 s -> 3.1 s here; the
same fields and tensor bytes, tested). Inside it, too, ``gguf.get_tensor_name_map`` builds one
map per (architecture, depth): transformers asks for it once per module of the model (710 times
for SmolLM2 and Gemma-3 together, ~14 ms each, 10 s here).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np


class _PlainMaps:
    """numpy, as ``gguf.gguf_reader`` sees it while one reader is built: ``np.memmap`` returns a
    plain ndarray view of the map (the same bytes, still backed by the file).
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(np, name)

    @staticmethod
    def memmap(path: os.PathLike | str, mode: str = "r") -> np.ndarray:
        return np.memmap(path, mode=mode).view(np.ndarray)


@contextlib.contextmanager
def one_parse_per_file() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` returns one reader per ``(path, mode)`` and
    ``gguf.get_tensor_name_map`` one map per arguments (transformers imports both names at each
    use, so it finds these); after it, the library's own again, and the readers (their memory
    maps) are released. The names are the module's, so one load at a time per process (every
    job loads one model).
    """
    import gguf
    import gguf.gguf_reader

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def shared_reader(path: os.PathLike | str, mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            gguf.gguf_reader.np = _PlainMaps()
            try:
                readers[key] = original(path, mode)
            finally:
                gguf.gguf_reader.np = np
        return readers[key]

    gguf.GGUFReader = shared_reader
    original_map = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original_map)  # transformers only reads a map
    try:
        yield
    finally:
        gguf.GGUFReader = original
        gguf.get_tensor_name_map = original_map
        readers.clear()
