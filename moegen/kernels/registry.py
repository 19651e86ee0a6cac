"""The table of grouped-matmul kernels, by the name a spec's target.kernel gives.

The stages ask it what a kernel needs instead of comparing names: validation runs
`KERNEL_RULES`, the plan builds `kernel(name).config`, verification reads a kernel's twin
substitute and preflight. A kernel is added by one module beside these, one line below, its
template (templates/kernels/<name>.jinja) and its name and summary in spec.py's Literal (the
schema is stage load, before this registry; tests/test_kernels.py holds the two in step); a
kernel with a config also needs its field in moegen.plan.kernel.KernelPlan.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from moegen.kernels.base import Kernel, KernelRule
from moegen.kernels.pallas import PALLAS
from moegen.kernels.te import TE
from moegen.kernels.tokamax import TOKAMAX
from moegen.kernels.xla import XLA

# in the order the spec's schema lists them (spec.py's Literal, checked by the kernel tests)
KERNELS: Mapping[str, Kernel] = MappingProxyType({k.name: k for k in (XLA, PALLAS, TE, TOKAMAX)})
KERNEL_NAMES: tuple[str, ...] = tuple(KERNELS)
# every kernel's rules, run on every spec: a kernel's rules may refuse fields it owns under
# another kernel (tiles under xla, quantization under pallas)
KERNEL_RULES: tuple[KernelRule, ...] = tuple(rule for k in KERNELS.values() for rule in k.rules)


def kernel(name: str) -> Kernel:
    """The kernel a validated spec names (KeyError for a name the schema would refuse)."""
    return KERNELS[name]


def kernels_on(platform: str) -> tuple[str, ...]:
    """The names of the kernels that run on `platform`, in the table's order."""
    return tuple(name for name, k in KERNELS.items() if platform in k.platforms)
