"""Code hashes (a rule param: edits re-run the rule): they follow a script's imports transitively
and see every import an AST walk sees."""

from __future__ import annotations

from conftest import REPO

from blockcoupling.pipeline.code_hash import code_hash, script_modules


def test_code_hashes_follow_imports_transitively() -> None:
    modules = script_modules(REPO / "scripts" / "train.py")
    assert (
        "blockcoupling.lm.training.schedule" in modules
    )  # imported by train.py, not by the script
    assert "blockcoupling.stats.core" in script_modules(REPO / "scripts" / "figure.py")
    assert "blockcoupling.pipeline.checks" not in modules
    assert code_hash(REPO / "scripts" / "metrics.py") != code_hash(REPO / "scripts" / "stats.py")


def test_code_hashes_see_every_import_ast_walk_sees() -> None:
    """The hashes read imports from statements only (not expressions): in every Python file of
    the repository, and in imports nested in every kind of block, they are ast.walk's."""
    import ast

    from blockcoupling.pipeline.code_hash import _import_statements

    nested = (
        "def f():\n    class C:\n        import a\n    with x:\n        import b\n"
        "try:\n    import c\nexcept E:\n    import d\nelse:\n    import e\nfinally:\n"
        "    import f\nfor i in x:\n    pass\nelse:\n    import g\nwhile x:\n"
        "    import h\nmatch x:\n    case 1:\n        from i import j\n"
    )
    files = [p for p in REPO.rglob("*.py") if ".venv" not in p.parts and "results" not in p.parts]
    for text in [nested, *(p.read_text(encoding="utf-8") for p in files)]:
        tree = ast.parse(text)
        walked = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        found = [n for n in _import_statements(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert sorted(map(ast.dump, found)) == sorted(map(ast.dump, walked))
    assert len(files) > 100
