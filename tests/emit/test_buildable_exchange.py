"""Types across the ragged all-to-all, where shard_map checks them (kernel xla on TPU targets).

jax.lax.ragged_all_to_all's result takes the type of the buffer it is written into. Received
into a plain jnp.zeros, the rows were typed as the same on every device: the FFN slices' scan
then refused its carry (Qwen3-30B-A3B, expert 8, ffn_chunks 2, 4 or 8: "scan body function
carry input and carry output must have equal types"), and, whole or sliced, the backward pass
summed the rows' gradient over the mesh (a psum that nothing in the layer asks for). The CPU
twin cannot see either: XLA:CPU has no ragged all-to-all, so the twin runs an all_gather
stand-in, whose result varies as it should. So the real exchange is traced here (tracing needs
no backend that runs it), forward and backward, and its gradient's collectives must be those of
the twin's exchange.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from spec_builder import spec_yaml

_TRACE = r"""
import importlib.util, json, sys, tempfile
from pathlib import Path
import jax, jax.numpy as jnp
from moegen.load import load_spec_bytes
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate

loaded = validate(load_spec_bytes(sys.argv[1].encode(), "x.yaml", "x"))
scratch = Path(tempfile.mkdtemp())

def module(emulate):
    name = "twin" if emulate else "real"
    path = scratch / f"{name}.py"
    path.write_text(render(make_plan(loaded, interpret=emulate)))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

def collectives(mod):
    mesh = mod.make_mesh(jax.devices()[: mod.NUM_DEVICES])
    params, x = mod.param_shapes(mesh), mod.input_shape(mesh)

    def loss(p, xs):
        return jnp.sum(mod.moe_layer(p, xs, mesh=mesh)[0].astype(jnp.float32))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x)
    found, exchanged = [], []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if name.startswith("psum"):
                aval = eqn.outvars[0].aval
                found.append([name, list(eqn.params["axes"]), list(aval.shape), str(aval.dtype)])
            if name == "ragged_all_to_all":
                exchanged.append(sorted(str(a) for a in eqn.outvars[0].aval.mat.varying))
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else [value]:
                    inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr.jaxpr)
    return sorted(found), exchanged

real, exchanged = collectives(module(False))
twin, _ = collectives(module(True))
print("MOEGEN-TRACE " + json.dumps({"real": real, "twin": twin, "exchanged": exchanged}))
"""


def traced(text: str) -> dict:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    result = subprocess.run(
        [sys.executable, "-c", _TRACE, text],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOEGEN-TRACE ")]
    assert result.returncode == 0 and len(lines) == 1, result.stdout + result.stderr[-4000:]
    return json.loads(lines[0].removeprefix("MOEGEN-TRACE "))


def small_exchange(**choices) -> str:
    base = {
        "experts": 8,
        "embed": 32,
        "ffn": 48,
        "top_k": 2,
        "batch": 8,
        "seq_len": 8,
        "params_dtype": "float32",
        "compute_dtype": "float32",
        "axes": {"fsdp": 2, "expert": 4},
        "strategy": "ragged_all_to_all",
        "hardware": "tpu-v5e",
        "topology": "2x4",
        "kernel": "xla",
    }
    return spec_yaml(base | choices)


@pytest.mark.parametrize(
    "choices",
    [
        {},
        {"ffn_chunks": 2},  # the scan's carry: refused before the fix
        {"axes": {"expert": 8}, "ffn_chunks": 4},  # the Qwen3 expert-8 mesh
        {"activation": "relu", "ffn_bias": True, "shared_ffn": 24},
    ],
    ids=["whole", "sliced", "expert8_sliced", "relu_bias_shared"],
)
def test_real_exchange_is_typed_like_the_twin(choices: dict) -> None:
    result = traced(small_exchange(**choices))
    # both exchanges, forward and their transposes, vary over every mesh axis
    mesh_axes = sorted(choices.get("axes", {"fsdp": 2, "expert": 4}))
    assert len(result["exchanged"]) == 4
    assert all(vma == mesh_axes for vma in result["exchanged"]), result["exchanged"]
    # the backward pass sums over the mesh what the twin's does, and nothing else
    assert result["real"] == result["twin"]
