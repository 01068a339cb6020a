"""The provenance stamp every figure job writes into its PNG's text chunks: the commit, the hash of
the run's config and the hash of the code that draws it (``docs_figures`` reads it). Apart from
``docs_figures`` so that a figure job imports only what it runs (its code hash, ``code_hash``,
counts exactly those modules).
"""

from __future__ import annotations

from pathlib import Path

from blockcoupling.files.io import git_commit

COMMIT, CONFIG, DESIGN = "blockcoupling commit", "blockcoupling config", "blockcoupling design"
# set by the Snakefile in every process it runs in: config_hash of the config as read
CONFIG_HASH_ENV = "BLOCKCOUPLING_CONFIG_HASH"


def stamp_png(png: str | Path, config: str, design: str) -> None:
    """Write the stamp (commit, ``config``: a ``config_hash``, ``design``) into ``png``'s text
    chunks.
    """
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in ((COMMIT, git_commit()), (CONFIG, config), (DESIGN, design)):
        info.add_text(key, value)
    with Image.open(png) as image:
        image.load()
        dpi = {"dpi": image.info["dpi"]} if "dpi" in image.info else {}
        image.save(png, pnginfo=info, **dpi)
