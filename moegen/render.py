"""Stage 5, render: a plan to the source of a formatted, lint-clean Python module.

Templates read plan values only (StrictUndefined: a missing value is an error, never an
empty string). The output goes through `ruff format` and `ruff check` with moegen's own
fixed settings, so the bytes depend on the plan and the pinned ruff alone.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from ruff.__main__ import find_ruff_bin

from moegen.plan import Plan
from moegen.render_variants import render_with_variants

LINE_LENGTH = 100
# Lint rules every generated module must pass: pyflakes, pycodestyle, imports, bugbear, pyupgrade.
# Line length is the formatter's job; only data (a long spec path in the header comment,
# a long description) may exceed it, and splitting those would not make them clearer.
LINT_RULES = "E,F,W,I,B,UP"
LINT_IGNORE = "E501"


# The macro contracts of the interchangeable templates: every kernel (templates/kernels/) and
# every expert strategy (templates/strategies/) provides exactly these, and the other
# templates call nothing else of them (tests/render/test_template_contracts.py). A template may keep
# further macros as private helpers that only it calls.
KERNEL_MACROS = {
    "imports": "the kernel's import lines",
    "constants": "module constants the kernel needs (tilings, TE alignment)",
    "kernel_doc": "the docstring sentence naming the kernel",
    "functions": "helper functions the kernel's calls use",
    "pad_rows": "rows padded to the kernel's row tiles before the FFN",
    "unpad_rows": "the padding rows dropped after it",
    "grouped_matmul": "rows x per-expert weights; dtype: the result's (COMPUTE_DTYPE, or "
    "jnp.float32 where FFN slices and ring chunks sum their products)",
    "accumulate_matmul": "total + rows x per-expert weights in float32: the overlapped ring's "
    "partial sums over embedding chunks (a kernel may add inside itself, in place)",
}
STRATEGY_MACROS = {
    "doc": "the docstring paragraph on how tokens reach their experts",
    "functions": "the per-device functions of the strategy",
    "shard_call": "the shard_map call of the layer",
    "aux_fields": "the Aux fields the strategy adds",
    "aux_values": "their values in the returned Aux",
}


class RenderError(Exception):
    """The rendered source could not be formatted or failed lint: a moegen bug."""


def templates_dir() -> Path:
    """Templates ship inside the installed package; in a source checkout they sit beside it."""
    packaged = Path(str(resources.files("moegen"))) / "templates"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "templates"


def _pspec(partition: tuple[Any, ...]) -> str:
    """('data', 'fsdp') style partition tuple -> PartitionSpec source, trailing Nones kept."""
    entries = []
    for entry in partition:
        if isinstance(entry, tuple):
            entry = entry[0] if len(entry) == 1 else entry
        entries.append(repr(entry))
    return "P(" + ", ".join(entries) + ")"


def _pyrepr(value: Any) -> str:
    """A Python literal; the only way free text from a spec reaches generated code."""
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, str | int | float | bool | tuple | type(None)):
        raise RenderError(f"refusing to emit non-literal {type(value).__name__} into code")
    return repr(value)


def _pystr_block(text: str, width: int = 72) -> str:
    """A str literal for free text, split at spaces into implicitly joined lines."""
    if len(repr(text)) <= width:
        return repr(text)
    pieces, current = [], ""
    for token in re.split(r"(?<= )", text):  # each token keeps its trailing space
        if current and len(repr(current + token)) > width:
            pieces.append(current)
            current = ""
        current += token
    pieces.append(current)
    assert "".join(pieces) == text
    return "(\n" + "\n".join(f"    {_pyrepr(piece)}" for piece in pieces) + "\n)"


# Python reads an encoding declaration (PEP 263) from a comment on line 1 or 2, and linters
# read directives (noqa, type-ignore, fmt-off) after a '#' in any comment: user text
# in a comment must never form either. `comment_text` keeps printable ASCII other than
# '#' and '\\' and escapes everything else, so the comment's only '#' is the template's own;
# the ':' or '=' after "coding" is escaped too, and the header keeps user text off lines 1-2.
_COMMENT_SAFE = re.compile(r"[ !\"$-\[\]-~]")
_CODING = re.compile(r"(coding)([:=])", re.IGNORECASE)


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def comment_text(text: str) -> str:
    """User text made inert for one line of a Python comment (see _COMMENT_SAFE above)."""
    safe = "".join(char if _COMMENT_SAFE.fullmatch(char) else _escape_char(char) for char in text)
    return _CODING.sub(lambda m: m.group(1) + _escape_char(m.group(2)), safe)


_JNP_DTYPES = {"float32": "jnp.float32", "bfloat16": "jnp.bfloat16"}


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates_dir()),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["pspec"] = _pspec
    env.filters["pyrepr"] = _pyrepr
    env.filters["pystr_block"] = _pystr_block
    env.filters["comment_text"] = comment_text
    env.filters["jnp_dtype"] = _JNP_DTYPES.__getitem__
    env.filters["tuple"] = tuple
    return env


def render(plan: Plan) -> str:
    """The final, formatted source of the module for `plan` (and its shape variants)."""
    filename = f"{plan.module_name}.py"
    if not plan.variants:
        return _ruff_format_and_check(_template("module.py.jinja", plan), filename)
    raw = render_with_variants(
        plan,
        # each part alone: formatted, linted once put together (the main part names the
        # variants' functions)
        lambda one: _ruff_format_and_check(_template("module.py.jinja", one), filename, lint=False),
        lambda main: _template("shape_variants.py.jinja", main),
    )
    return _ruff_format_and_check(raw, filename)


def _template(name: str, plan: Plan) -> str:
    return _environment().get_template(name).render(p=plan)


def _ruff(args: list[str], source: str, filename: str) -> subprocess.CompletedProcess[str]:
    command = [find_ruff_bin(), *args, "--isolated", "--stdin-filename", filename, "-"]
    return subprocess.run(command, input=source, capture_output=True, text=True, check=False)


def _ruff_format_and_check(source: str, filename: str, *, lint: bool = True) -> str:
    settings = [f"--line-length={LINE_LENGTH}", "--target-version=py312"]
    # Imports are laid out by ruff (isort rules), so templates may add them anywhere.
    sorted_imports = _ruff(
        ["check", *settings, "--select=I", "--fix-only", "--exit-zero"], source, filename
    )
    if sorted_imports.returncode != 0:
        raise RenderError(f"ruff could not sort imports of {filename}:\n{sorted_imports.stderr}")
    formatted = _ruff(["format", *settings], sorted_imports.stdout, filename)
    if formatted.returncode != 0:
        raise RenderError(f"ruff format failed on rendered {filename}:\n{formatted.stderr}")
    if not lint:
        return formatted.stdout
    lint = _ruff(
        [
            "check",
            *settings,
            f"--select={LINT_RULES}",
            f"--ignore={LINT_IGNORE}",
            "--output-format=concise",
            "--no-fix",
        ],
        formatted.stdout,
        filename,
    )
    if lint.returncode != 0:
        raise RenderError(f"rendered {filename} fails ruff check:\n{lint.stdout}{lint.stderr}")
    return formatted.stdout
