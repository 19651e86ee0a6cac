"""Render, shape variants: one module for the main shape and each of `shapes.variants`.

The main shape's module is rendered as for a spec without variants (its `moe_layer` also
dispatches on x.shape); each variant's module is rendered from its own plan, and what in it
differs from the main module, or uses what differs (its constants, its per-device
functions, its moe_layer), is added with the variant's name as a suffix: LOCAL_TOKENS_EVAL,
_moe_shard_eval, moe_layer_eval. The rest is the main module's, shared by construction:
init_params, PARAM_SHAPES, PARAM_SPECS, the mesh. A variant whose plan would change one of
those is refused (it cannot share the parameters); no template does arithmetic for this,
each module comes from its own plan.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable

from moegen.plan import Plan, VariantPlan

# The module's parts every shape shares: a variant may not change them.
SHARED = frozenset(
    {
        "PARAM_SHAPES", "PARAM_SPECS", "INIT_SCALES", "PARAM_DTYPE", "COMPUTE_DTYPE", "Params",
        "Aux", "make_mesh", "param_shapes", "init_params", "input_sharding", "INPUT_SPEC",
        "MESH_AXES", "MESH_SHAPE", "NUM_DEVICES",
    }
)  # fmt: skip


class VariantConflict(Exception):
    """A shape variant's plan changes what the shapes share (a moegen bug or a missing rule)."""


def compose(main: str, variants: list[tuple[VariantPlan, str]], tail: str) -> str:
    """The main module's source, each variant's own statements after it, then `tail`."""
    taken = set(_statements(main))
    sections = [main.rstrip("\n")]
    for variant, source in variants:
        sections.append(_section(variant, _statements(main), source, taken))
    return "\n\n\n".join([*sections, tail.strip("\n")]) + "\n"


def _section(variant: VariantPlan, main: dict[str, str], source: str, taken: set[str]) -> str:
    own = _statements(source)
    uses = {name: _names(text) for name, text in own.items()}
    renamed = {name for name, text in own.items() if main.get(name) != text}
    grown = True
    while grown:
        more = {name for name in own if name not in renamed and uses[name] & renamed}
        renamed |= more
        grown = bool(more)
    conflict = sorted(renamed & SHARED)
    if conflict:
        raise VariantConflict(
            f"shape variant {variant.name} changes {', '.join(conflict)}, which every shape shares"
        )
    new_names = {name: _suffixed(name, variant) for name in renamed}
    clash = sorted(set(new_names.values()) & taken)
    if clash:
        raise VariantConflict(f"shape variant {variant.name}: {', '.join(clash)} already exists")
    taken |= set(new_names.values())
    header = (
        f"# Shape variant {variant.name}: x {list(variant.input_shape)}, through "
        f"{variant.function}. What differs from\n# the main shape, and what uses it, "
        f"suffixed {variant.suffix} or {variant.constant_suffix}\n# (docstrings and comments "
        "say the main names):"
    )
    body = [_renamed(text, new_names) for name, text in own.items() if name in renamed]
    return "\n".join([header, *body])  # ruff lays out the blank lines


def _suffixed(name: str, variant: VariantPlan) -> str:
    return name + (variant.constant_suffix if name.isupper() else variant.suffix)


def _statements(source: str) -> dict[str, str]:
    """Top-level named statements (defs, classes, constants) -> their lines, in order."""
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        name = _defined(node)
        if name is None:
            continue
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        out[name] = "\n".join(lines[start - 1 : node.end_lineno])
    return out


def _defined(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.ClassDef):
        return node.name
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.TypeAlias) and len(targets) == 1:
        target = node.name if isinstance(node, ast.TypeAlias) else targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def _names(text: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}


def _renamed(text: str, new_names: dict[str, str]) -> str:
    """`text` with every name of `new_names` replaced where the code names it (not as an
    attribute); docstrings and comments keep the main shape's names (the section header
    says so), so that their lines keep their widths."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, str]] = []
    previous = None
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        replacement = _replacement(token, previous, new_names)
        if replacement is not None:
            (row, col), (end_row, end_col) = token.start, token.end
            edits.append((starts[row - 1] + col, starts[end_row - 1] + end_col, replacement))
        if token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = token
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _replacement(
    token: tokenize.TokenInfo, previous: tokenize.TokenInfo | None, new_names: dict[str, str]
) -> str | None:
    if token.type != tokenize.NAME or token.string not in new_names:
        return None
    after_dot = previous is not None and previous.string == "."
    return None if after_dot else new_names[token.string]


def render_with_variants(
    plan: Plan, render_one: Callable[[Plan], str], tail: Callable[[Plan], str]
) -> str:
    """The composed module of a plan with shape variants (before the final format)."""
    variants = [(variant, render_one(variant.plan)) for variant in plan.variants]
    return compose(render_one(plan), variants, tail(plan))
