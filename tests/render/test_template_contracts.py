"""Declared template contracts (moegen/render.py KERNEL_MACROS, STRATEGY_MACROS): every
kernel and every strategy template provides its kind's macros, and nothing else of theirs is
called from outside, so a kernel or strategy cannot lack what another template calls (issue
16: te.jinja lacked grouped_matmul_f32 and `kernel: te` in FFN slices crashed in render). The
kernels' macros take the same arguments, and the code a kernel emits calls no private function
of another template (issue 17: the ring strategy defined _accumulate, the kernels called it)."""

from __future__ import annotations

import re

import pytest
from jinja2 import nodes

from moegen.kernels import KERNEL_NAMES
from moegen.render import KERNEL_MACROS, STRATEGY_MACROS, _environment, templates_dir

KINDS = {"kernel": ("kernels", KERNEL_MACROS), "strategy": ("strategies", STRATEGY_MACROS)}


def _macro_nodes(relative: str) -> dict[str, nodes.Macro]:
    source = (templates_dir() / relative).read_text(encoding="utf-8")
    return {macro.name: macro for macro in _environment().parse(source).find_all(nodes.Macro)}


def _macros(relative: str) -> set[str]:
    return set(_macro_nodes(relative))


def _signature(macro: nodes.Macro) -> tuple:
    """Argument names, and the defaults of the trailing ones, as source."""
    defaults = tuple(default.as_const() for default in macro.defaults)
    return tuple(arg.name for arg in macro.args), defaults


def _calls_from_outside(alias: str, folder: str) -> set[str]:
    """Names called as `alias.NAME(` in the templates outside `folder`."""
    return {
        name
        for path in templates_dir().rglob("*.jinja")
        if path.parent.name != folder
        for name in re.findall(rf"\b{alias}\.(\w+)\(", path.read_text(encoding="utf-8"))
    }


CASES = [
    pytest.param(alias, path.relative_to(templates_dir()).as_posix(), id=path.stem)
    for alias, (folder, _) in KINDS.items()
    for path in sorted((templates_dir() / folder).glob("*.jinja"))
]


@pytest.mark.parametrize(("alias", "relative"), CASES)
def test_template_provides_its_contract(alias: str, relative: str) -> None:
    _, contract = KINDS[alias]
    missing = set(contract) - _macros(relative)
    assert not missing, f"{relative} lacks the {alias} macros {sorted(missing)}"


@pytest.mark.parametrize("alias", sorted(KINDS))
def test_other_templates_call_only_the_contract(alias: str) -> None:
    folder, contract = KINDS[alias]
    called = _calls_from_outside(alias, folder)
    assert called, f"no template calls a {alias} macro: the scan is broken"
    assert called <= set(contract), f"called but not declared: {sorted(called - set(contract))}"


def test_every_kind_has_its_templates() -> None:
    kernels = {c.values[1] for c in CASES if c.values[0] == "kernel"}
    assert kernels == {f"kernels/{name}.jinja" for name in KERNEL_NAMES}
    assert len([c for c in CASES if c.values[0] == "strategy"]) == 3


def test_every_kernel_takes_the_same_arguments() -> None:
    kernels = {c.values[1]: _macro_nodes(c.values[1]) for c in CASES if c.values[0] == "kernel"}
    for name in KERNEL_MACROS:
        signatures = {relative: _signature(macros[name]) for relative, macros in kernels.items()}
        assert len(set(signatures.values())) == 1, f"{name}: {signatures}"


@pytest.mark.parametrize("relative", [c.values[1] for c in CASES if c.values[0] == "kernel"])
def test_kernel_code_calls_only_its_own_private_functions(relative: str) -> None:
    """A private function (`_name(`) in the code a kernel emits is one the kernel defines."""
    source = (templates_dir() / relative).read_text(encoding="utf-8")
    called = set(re.findall(r"(?<![\w.])(_\w+)\(", source))
    # and the kernels of the kernel's own that a template it imports defines
    for imported in re.findall(r'{%-? import "([\w.]+)" as', source):
        source += (templates_dir() / imported).read_text(encoding="utf-8")
    # defined: a def at any depth (a kernel's nested Pallas steps) or a module-level
    # assignment (a custom_vjp wrapping a def)
    defined = set(re.findall(r"^\s*def (_\w+)\(", source, flags=re.MULTILINE))
    defined |= set(re.findall(r"^(_\w+) = ", source, flags=re.MULTILINE))
    defined |= set(re.findall(r"{%-? macro (_\w+)\(", source))  # the template's own helper
    assert called <= defined, f"{relative} calls {sorted(called - defined)}, defined elsewhere"
