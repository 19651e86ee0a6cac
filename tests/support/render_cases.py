"""The example modules rendered, the choices of a probe spec (spec_builder) and rendering helpers
shared by the tests of stage 4, render."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from conftest import EXAMPLE_SPECS, REPO_ROOT

from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render


def render_examples() -> dict[str, str]:
    """Each example spec rendered from the repository root (so paths read specs/NAME.yaml)."""
    old = Path.cwd()
    os.chdir(REPO_ROOT)
    try:
        return {
            path.stem: render(make_plan(load_valid(Path("specs") / path.name)))
            for path in EXAMPLE_SPECS
        }
    finally:
        os.chdir(old)


def render_yaml(tmp_path: Path, text: str, name: str = "probe") -> str:
    """Render a spec given as YAML text, from tmp_path, as specs/NAME.yaml."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    spec = tmp_path / "specs" / f"{name}.yaml"
    spec.write_text(text, encoding="utf-8")
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        return render(make_plan(load_valid(Path("specs") / spec.name)))
    finally:
        os.chdir(old)


def code_only(source: str) -> str:
    """The module's code without comments and docstrings (ast.unparse drops comments)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body and isinstance(body[0], ast.Expr) else None
            if (
                first
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


# The spec_builder choices of a small cpu spec whose render the path tests read (they vary the
# router, the compute dtype and the mesh axes).
PROBE = {
    "description": "probe",
    "experts": 8,
    "embed": 64,
    "ffn": 96,
    "top_k": 2,
    "score": "softmax",
    "renormalize": True,
    "batch": 8,
    "seq_len": 16,
    "params_dtype": "float32",
    "compute_dtype": "float32",
    "axes": {"data": 2},
}
