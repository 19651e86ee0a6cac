"""The worker of moegen.verify.memory.assigned: compile one full-size program of a rendered module
for its TPU slice. The parent reads XLA's buffer assignment from the dump and stops this
process before code generation ends; a compile that fails says so on stderr."""

from __future__ import annotations

import json
import sys

import jax

from moegen.verify.messages import TpuTarget
from moegen.verify.worker.child import full_size_programs, import_module, shape_of
from moegen.verify.worker.compiled import target_devices


def main(module_path: str, tpu_json: str, program: str, variant: str = "") -> int:
    """Compile `program` of the main shape, or of the shape variant named `variant`."""
    module = import_module(module_path, "moegen_assigned")
    tpu = TpuTarget.from_json(json.loads(tpu_json))
    shape = shape_of(module, variant or None)
    params, x, programs = full_size_programs(module, target_devices(module, tpu), shape)
    jax.jit(programs[program]).lower(params, x).compile()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
