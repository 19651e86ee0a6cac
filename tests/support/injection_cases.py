"""What the injection tests share: the payloads, the probe spec and its fields, and the checks
that a payload stays inside a string literal of the generated module."""

from __future__ import annotations

import ast
import json
import os
import runpy
from pathlib import Path

import pytest

from moegen.pipeline import generate

PAYLOADS = {
    "triple_quote": '"""\nimport os\nos.system("touch PWNED")\n"""',
    "close_call": "'); import os #",
    "dunder_import": '\n__import__("os").system("touch PWNED")',
    "line_separator": 'x\u2028import os; os.system("touch PWNED")',
    "paragraph_separator": 'x\u2029import os; os.system("touch PWNED")',
    "vertical_tab": 'x\x0bimport os; os.system("touch PWNED")',
    "form_feed": 'x\x0cimport os; os.system("touch PWNED")',
    "nul": 'x\x00import os; os.system("touch PWNED")',
    "carriage_return": 'x\r__import__("os").system("touch PWNED")',
    "next_line": 'x\x85import os; os.system("touch PWNED")',
    "escape_sequence": "x\x1b[2J\x1b]0;owned\x07",
    "jinja": '{{ p.__class__ }}{% if true %}{{ "x" }}{% endif %}',
    "backslash_quote": '\\"; import os; os.system("touch PWNED"); x = "',
}
NON_PRINTABLE = sorted(name for name, text in PAYLOADS.items() if not text.isprintable())

# One spec with every string-valued field as a placeholder; the defaults make it valid.
TEMPLATE = """\
version: 1
description: {description}
layer:
  num_experts: 4
  embed_dim: 16
  ffn_dim: 24
  activation: {activation}
router:
  top_k: 2
  score: {score}
  renormalize: true
shapes:
  batch: 4
  seq_len: 4
dtypes:
  params: {params}
  compute: {compute}
mesh:
  axes:
    {axis}: 2
    fsdp: 2
  batch_axes: [{batch_axis}, fsdp]
parallelism:
  experts: {experts}
target:
  hardware: {hardware}
  kernel: {kernel}
"""
DEFAULTS = {
    "description": "probe",
    "activation": "swiglu",
    "score": "softmax",
    "params": "float32",
    "compute": "float32",
    "axis": "data",
    "batch_axis": "data",
    "experts": "replicated",
    "hardware": "cpu",
    "kernel": "xla",
}
# placeholder -> the diagnostic's field (a prefix for keys, which are named in the path)
ENUM_FIELDS = {
    "activation": "layer.activation",
    "score": "router.score",
    "params": "dtypes.params",
    "compute": "dtypes.compute",
    "axis": "mesh.axes",
    "batch_axis": "mesh.batch_axes[0]",
    "experts": "parallelism.experts",
    "hardware": "target.hardware",
    "kernel": "target.kernel",
}


def yaml_string(text: str) -> str:
    """A YAML double-quoted scalar for any text (JSON escapes are valid YAML escapes)."""
    return json.dumps(text, ensure_ascii=True)


def spec_text(**values: str) -> str:
    """The template with the given fields replaced by (quoted) hostile values."""
    fields = dict(DEFAULTS)
    fields.update({k: yaml_string(v) for k, v in values.items()})
    return TEMPLATE.format(**fields)


def line_of(placeholder: str) -> int:
    return next(
        i for i, line in enumerate(TEMPLATE.splitlines(), 1) if f"{{{placeholder}}}" in line
    )


def write_spec(directory: Path, text: str, name: str = "probe") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def generate_in(cwd: Path, relative: str | Path):
    """generate() run from `cwd`, so the header names the spec relative to it (short)."""
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return generate(Path(relative))
    finally:
        os.chdir(old)


# ---------------------------------------------------------------------------------------
# What "only inside a string literal" means, checked on the module's syntax tree


def normalised_dump(source: str) -> str:
    """The module's AST with SPEC_DESCRIPTION's value blanked (positions ignored)."""
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
            "SPEC_DESCRIPTION"
        ]:
            node.value = ast.Constant("<description>")
    return ast.dump(tree)


def description_span(source: str) -> tuple[int, int]:
    tree = ast.parse(source)
    node = next(
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "SPEC_DESCRIPTION"
    )
    return node.lineno, node.end_lineno


def assert_only_in_string_literal(source: str, description: str, baseline: str) -> None:
    tree = ast.parse(source)
    # The module is the baseline module but for one constant's value: no new statement,
    # expression, name or import anywhere.
    assert normalised_dump(source) == normalised_dump(baseline)
    assigned = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    value = assigned["SPEC_DESCRIPTION"]
    assert isinstance(value, ast.Constant) and isinstance(value.value, str)
    assert value.value == description
    # No other string constant carries any of it.
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not value:
            assert "PWNED" not in node.value and "import os" not in node.value
    # Textually too: outside the SPEC_DESCRIPTION statement the source is the baseline's,
    # except the spec hash; no raw control or line-separator characters anywhere.
    first, last = description_span(source)
    b_first, b_last = description_span(baseline)
    lines, b_lines = source.splitlines(), baseline.splitlines()
    assert lines[: first - 1][2:] == b_lines[: b_first - 1][2:]
    assert lines[last:] == b_lines[b_last:]
    assert lines[0] == b_lines[0]
    for char in "\x00\x0b\x0c\x1b\x85\u2028\u2029\r":
        assert char not in source, repr(char)


def exec_module(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run the module's top level with tmp_path as cwd; the payload would touch PWNED there."""
    module = tmp_path / "exec_probe.py"
    module.write_text(source, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(module), run_name="exec_probe")
    assert not (tmp_path / "PWNED").exists()
    return namespace


# ---------------------------------------------------------------------------------------
# description: the one free-text field; it must land in SPEC_DESCRIPTION and nowhere else


@pytest.fixture(scope="module", name="baseline")
def baseline_fixture(tmp_path_factory) -> str:
    """The module of the probe spec without any payload."""
    root = tmp_path_factory.mktemp("baseline")
    write_spec(root / "specs", spec_text())
    return generate_in(root, "specs/probe.yaml").source
