"""How a config's names (models, training runs) become parts of Snakemake rule names."""

from __future__ import annotations


def rule_suffix(name: str) -> str:
    """A model or run name as part of a rule name."""
    return name.replace("-", "_").replace(".", "_")
