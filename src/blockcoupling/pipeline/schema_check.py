"""The config's schema check: Snakemake's ``validate`` with the schema's defaults filled in, its
violations as one-line ``ConfigError``s (the cross-field checks that follow are ``checks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from blockcoupling.pipeline.errors import ConfigError


def validate_config(
    config: dict[str, Any], schema: str | Path, overrides: dict[str, Any] | None = None
) -> None:
    """Snakemake's ``validate`` (which also fills the schema's defaults into ``config``); a
    violation is a one-line ConfigError naming the key path and the problem, not the schema dump.
    ``overrides``: the parsed ``--config`` values, whose nested string leaves first get the type
    the schema asks for (``overrides.coerce_overrides``).
    """
    import yaml
    from jsonschema.exceptions import ValidationError, best_match
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    from blockcoupling.pipeline.overrides import coerce_overrides

    if overrides:
        coerce_overrides(config, overrides, yaml.safe_load(Path(schema).read_text("utf-8")))
    try:
        validate(config, str(schema))
    except WorkflowError as error:
        cause = error.__cause__ or error.__context__
        if not isinstance(cause, ValidationError):
            raise ConfigError(str(error).splitlines()[0]) from None
        if cause.context:  # oneOf/anyOf: the alternative that came closest, one whose type
            # the value has (hub.max_revisions: 0 breaks the bound of the integer alternative,
            # not the 'all' one)
            typed = [e for e in cause.context if e.validator not in ("type", "const", "enum")]
            cause = best_match(typed or cause.context)
        key = ".".join(str(part) for part in cause.absolute_path) or "top level"
        message = " ".join(cause.message.split())
        message = message if len(message) <= 200 else message[:197] + "..."
        raise ConfigError(f"{key}: {message} (see {Path(schema).name})") from None
