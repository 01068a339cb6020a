"""Every rule has a one-line docstring, so `snakemake --list-rules` reads like a table of
contents."""

from __future__ import annotations

import re

from conftest import REPO


def test_every_rule_opens_with_a_one_line_docstring() -> None:
    files = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]
    rules, bare = 0, []
    for path in files:
        lines = path.read_text("utf-8").splitlines()
        for number, line in enumerate(lines):
            if not re.match(r"^\s*rule(\s+\w+)?:\s*$", line):
                continue
            rules += 1
            following = lines[number + 1].strip() if number + 1 < len(lines) else ""
            if not re.fullmatch(r'"""[^"]{10,100}"""', following):
                bare.append(f"{path.name}:{number + 1}: {line.strip()}")
    assert rules >= 25, rules  # every rule definition was seen
    assert not bare, "rules without a one-line docstring: " + "; ".join(bare)
