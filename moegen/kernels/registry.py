"""The table of grouped-matmul kernels, by the name a spec's target.kernel gives.

The stages ask it what a kernel needs instead of comparing names: validation asks
`kernel_is_registered` first, then runs `KERNEL_RULES`; the plan builds
`kernel(name).config`, verification reads a kernel's twin substitute, preflight and CUDA
lowering, and `moegen schema` writes the names into the JSON schema. A kernel is added by one
module beside these, one line below, its template (templates/kernels/<name>.jinja) and its
test subclass (tests/kernels/test_kernels.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from moegen.diagnostics import Diagnostic
from moegen.kernels.base import Kernel, KernelRule
from moegen.kernels.pallas import PALLAS
from moegen.kernels.te import TE
from moegen.kernels.tokamax import TOKAMAX
from moegen.kernels.xla import XLA
from moegen.load import LoadedSpec, choice_message

# in the order the spec's schema lists them; the first is the schema's default
KERNELS: Mapping[str, Kernel] = MappingProxyType({k.name: k for k in (XLA, PALLAS, TE, TOKAMAX)})
KERNEL_NAMES: tuple[str, ...] = tuple(KERNELS)
# other tools' names for the kernels -> theirs
KERNEL_ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: k.name for k in KERNELS.values() for alias in k.aliases}
)


def kernel_is_registered(loaded: LoadedSpec) -> list[Diagnostic]:
    """target.kernel names a kernel of the table (validation stops here when it does not:
    every other rule may ask the table about it)."""
    name = loaded.spec.target.kernel
    if name in KERNELS:
        return []
    message = choice_message(name, list(KERNEL_NAMES), spellings=KERNEL_ALIASES)
    return [loaded.diagnostic(("target", "kernel"), message)]


# every kernel's rules, run on every spec: a kernel's rules may refuse fields it owns under
# another kernel (tiles under xla, quantization under pallas)
KERNEL_RULES: tuple[KernelRule, ...] = tuple(rule for k in KERNELS.values() for rule in k.rules)


def kernel(name: str) -> Kernel:
    """The kernel a validated spec names (KeyError for a name kernel_is_registered refuses)."""
    return KERNELS[name]


def kernels_on(platform: str) -> tuple[str, ...]:
    """The names of the kernels that run on `platform`, in the table's order."""
    return tuple(name for name, k in KERNELS.items() if platform in k.platforms)
