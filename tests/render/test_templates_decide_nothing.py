"""Templates lay out plan values; they decide and compute nothing (issue 17).

Every template is tokenised by Jinja's own lexer. Inside `{{ }}` and `{% %}` no arithmetic
operator may appear, no ordering comparison, no comparison with a number, and no filter that
computes (min, max, sum, round, int, length...): a number a module needs, or a choice between
two paths, is a plan value or a plan flag. What stays allowed is layout: string joins (`~`),
equality tests of plan strings and flags, and the filters that write a value as code or text.
"""

from __future__ import annotations

import pytest

from moegen.render import _environment, templates_dir

TEMPLATES = sorted(
    p.relative_to(templates_dir()).as_posix() for p in templates_dir().rglob("*.jinja")
)
ARITHMETIC = {"+", "-", "*", "/", "//", "%", "**"}
ORDERING = {"<", ">", "<=", ">="}
LAYOUT_FILTERS = {
    "pyrepr", "pystr_block", "comment_text", "pspec", "jnp_dtype", "list", "tuple", "join",
    "map", "wordwrap", "format",
}  # fmt: skip


def computations(source: str) -> list[str]:
    """What `source` (template text) computes or decides, one line each, by its line."""
    tokens = [t for t in _environment().lex(source) if t[1] != "whitespace"]
    found = []
    for i, (line, kind, value) in enumerate(tokens):
        previous = tokens[i - 1][2] if i else ""
        following = tokens[i + 1][2] if i + 1 < len(tokens) else ""
        if kind == "operator" and value in ARITHMETIC:
            found.append(f"{line}: arithmetic {value!r}")
        elif kind == "operator" and value in ORDERING:
            found.append(f"{line}: ordering comparison {value!r}")
        elif kind in ("integer", "float") and "==" in (previous, following):
            found.append(f"{line}: comparison with the number {value}")
        elif kind in ("integer", "float") and "!=" in (previous, following):
            found.append(f"{line}: comparison with the number {value}")
        elif kind == "name" and previous == "|" and value not in LAYOUT_FILTERS:
            found.append(f"{line}: filter {value!r} computes")
    return found


@pytest.mark.parametrize("name", TEMPLATES)
def test_template_computes_nothing(name: str) -> None:
    assert computations((templates_dir() / name).read_text(encoding="utf-8")) == []


def test_the_scan_finds_each_kind_of_computation() -> None:
    text = (
        "{{ a // 2 }}\n{% if b > 1 %}{% endif %}\n{% if c != 1.0 %}{% endif %}\n"
        "{{ [d, e] | min }}\n{{ 'x-y' ~ f | pyrepr }}{%- if g == 'h' -%}{% endif %}"
    )
    assert computations(text) == [
        "1: arithmetic '//'",
        "2: ordering comparison '>'",
        "3: comparison with the number 1.0",
        "4: filter 'min' computes",
    ]
