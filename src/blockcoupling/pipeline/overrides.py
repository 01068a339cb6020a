"""Typed ``--config`` overrides of nested keys.

Snakemake parses a top-level ``--config key=5`` as a number, but the value of a nested override
(``--config 'stats={k: 5}'``) with YAML's BaseLoader, so every leaf arrives as a string and the
schema refuses it ("'5' is not of type 'integer'"). ``coerce_overrides`` gives each string leaf
that came from the command line the type the schema asks for at its key (integer, number,
boolean or null), where the text reads as one; everything else is left to the schema's check.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import yaml

Path = tuple[str | int, ...]


def _leaves(value: Any, path: Path = ()) -> Iterator[Path]:
    """The paths of the string leaves of a parsed override (nested dicts and lists)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    elif isinstance(value, str) and path:
        yield path


def _typed(text: str, wanted: set[str]) -> Any:
    """``text`` read as one of the JSON-schema types in ``wanted`` (a KeyError when it reads as
    none of them).
    """
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = text
    if isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
        try:
            value = float(text)
        except ValueError:
            pass
    if value is None and "null" in wanted:
        return None
    if isinstance(value, bool):
        if "boolean" in wanted:
            return value
    elif isinstance(value, int) and ({"integer", "number"} & wanted):
        return value
    elif isinstance(value, float) and (
        "number" in wanted or ("integer" in wanted and value.is_integer())
    ):
        return value if "number" in wanted else int(value)
    raise KeyError(text)


def _type_errors(errors: Any) -> Iterator[Any]:
    """Every ``type`` error among jsonschema errors and the alternatives of oneOf/anyOf."""
    for error in errors:
        if error.validator == "type":
            yield error
        yield from _type_errors(error.context or [])


def coerce_overrides(config: dict[str, Any], overrides: Mapping[str, Any], schema: dict) -> int:
    """Give the string leaves of ``config`` that came from ``overrides`` (the parsed ``--config``
    values) the type ``schema`` asks for at their key; returns how many changed. Only leaves at
    the paths of ``overrides`` change, so a string a config file quotes stays a string.
    """
    from jsonschema.validators import validator_for

    wanted_paths = set(_leaves(dict(overrides)))
    validator = validator_for(schema)(schema)
    changed = 0
    for _ in range(len(wanted_paths) + 1):  # a fix can expose the next error of a oneOf
        fixes: dict[Path, Any] = {}
        for error in _type_errors(validator.iter_errors(config)):
            path = tuple(error.absolute_path)
            if path not in wanted_paths or not isinstance(error.instance, str):
                continue
            types = error.validator_value
            wanted = {types} if isinstance(types, str) else set(types)
            try:
                fixes[path] = _typed(error.instance, wanted)
            except KeyError:
                continue
        if not fixes:
            break
        for path, value in fixes.items():
            parent = config
            for part in path[:-1]:
                parent = parent[part]
            parent[path[-1]] = value
            wanted_paths.discard(path)
            changed += 1
    return changed
