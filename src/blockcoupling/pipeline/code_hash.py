"""Code hashes: a rule re-runs when any module its script imports changes."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = "blockcoupling"
SOURCE_DIR = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    """Modules of this package that a file imports (anywhere in it, lazily or not)."""
    return {
        name
        for name in _imported_names(path.read_text(encoding="utf-8"), str(path))
        if _module_file(name) is not None
    }


@functools.cache
def _imported_names(source: str, filename: str) -> frozenset[str]:
    """The ``blockcoupling.*`` names a module's source imports (parsed once per source text:
    the Snakefile hashes ~40 scripts, whose imports share most modules).
    """
    found = set()
    for node in _import_statements(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.startswith(f"{PACKAGE}."))
    return frozenset(found)


def _import_statements(tree: ast.Module) -> list[ast.stmt]:
    """Every statement of ``tree`` at any depth (bodies of functions, classes, branches, loops,
    ``with``, ``try`` and ``match``), without walking expressions: an import is a statement, so
    these hold every import ``ast.walk`` finds at a fraction of the nodes.
    """
    statements, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        statements.append(node)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            pending.extend(getattr(node, field, None) or ())
    return statements


def _module_file(module: str) -> Path | None:
    """The source file of ``blockcoupling.x`` in this package, or None if it is not a module."""
    return _module_file_in(SOURCE_DIR, module)


@functools.cache
def _module_file_in(source_dir: Path, module: str) -> Path | None:
    """``_module_file`` under ``source_dir`` (looked up once per process: the Snakefile asks for
    the same ~80 modules ~5,000 times; a file's contents are read afresh on every hash).
    """
    relative = module.split(".", 1)[1].replace(".", "/")
    for candidate in (source_dir / f"{relative}.py", source_dir / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parent_packages(module: str) -> list[str]:
    """The subpackages above ``blockcoupling.a.b.c`` (``blockcoupling.a``, ``blockcoupling.a.b``):
    importing a module runs their ``__init__`` too.
    """
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def script_modules(script: str | Path) -> list[str]:
    """Every module of this package that ``script`` imports, transitively, with the subpackages
    whose ``__init__`` those imports run (sorted).
    """
    pending, seen = list(_imported_modules(Path(script))), set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        pending += _imported_modules(_module_file(module))  # type: ignore[arg-type]
        pending += [p for p in _parent_packages(module) if _module_file(p) is not None]
    return sorted(seen)


def code_hash(script: str | Path) -> str:
    """sha256 (12 hex digits) of the package modules a rule's script imports, transitively.

    A rule takes it as a param, so it re-runs exactly when science code it runs changes
    (Snakemake's own code trigger sees only the script file).
    """
    digest = hashlib.sha256()
    for module in script_modules(script):
        digest.update(module.encode())
        digest.update(_module_file(module).read_bytes())  # type: ignore[union-attr]
    return digest.hexdigest()[:12]
