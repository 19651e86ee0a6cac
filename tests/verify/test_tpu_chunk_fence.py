"""Token chunks on TPU: the chunks' reshapes kept out of the matmuls beside them.

libtpu 0.0.51 crashed (a failed check in code generation, SIGABRT) compiling drawn layers in
token chunks: DeepSeek-V3 in 2 and 4 chunks on tpu7x (bench.defaults_fit, s0_015 made too
big), where it fused the [TOKEN_CHUNKS, CHUNK_TOKENS, D] -> [LOCAL_TOKENS, D] reshape of the
chunks' output into the shared expert's down projection, and OLMoE's ring of experts in 4
chunks (s1_029 made too big), where it fused the reshape of the chunks' input gradient into
the router's input-gradient matmul. Both had been recorded as "no figure" and put down to the
host's memory. Measured on the layer below with the barrier taken out: forward and
forward+backward crash, with pallas and with xla; with a 1024-wide shared expert, or at 64,
96 or 128 sequences, it compiles. No rule of sizes says when libtpu fuses that way, so the
plan puts `jax.lax.optimization_barrier` on the flat side of both reshapes of every chunked
layer on TPU (ExpertPlan.fences_chunks). Compiled again with it, 122 population programs
kept their peaks within 0.05% in 96 cases, fell in 16 (to -20%), rose in 10 (at most +5.0%).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from spec_builder import spec_yaml, validated

from moegen.plan import make_plan
from moegen.render import render
from moegen.verify.memory.compiler_errors import compiler_crash
from moegen.verify.verification import tpu_target
from moegen.verify.worker.pool import worker_env

# The smallest layer found that crashed without the barrier (13 s a forward compile here).
CRASHED = {
    "experts": 16,
    "embed": 7168,
    "ffn": 256,
    "shared_ffn": 2048,
    "top_k": 2,
    "batch": 152,
    "seq_len": 1024,
    "params_dtype": "float32",
    "compute_dtype": "bfloat16",
    "axes": {"expert": 8, "tensor": 2},
    "strategy": "ragged_all_to_all",
    "hardware": "tpu7x",
    "topology": "2x2x2",
    "kernel": "xla",
    "token_chunks": 2,
}


def _plan(**changes: object):
    """The plan of CRASHED with `changes` (None: the field left out)."""
    choices = {key: value for key, value in (CRASHED | changes).items() if value is not None}
    loaded = validated(spec_yaml(choices), "fence.yaml", "fence")
    assert not isinstance(loaded, Exception), loaded
    return make_plan(loaded)


@pytest.mark.parametrize(
    "changes, fenced",
    [
        ({}, True),
        ({"kernel": "pallas"}, True),
        ({"shared_ffn": None, "latent": 1024}, True),  # a latent projection's matmul
        ({"token_chunks": 1}, False),  # no chunks, no reshape
        ({"shared_ffn": None}, True),  # the router's input gradient still meets them
        ({"hardware": "gpu-h100", "topology": "2x8", "kernel": "xla"}, False),  # libtpu only
    ],
    ids=["xla", "pallas", "latent", "whole", "no-shared", "gpu"],
)
def test_the_plan_fences_every_chunked_layer_on_tpu_alone(changes, fenced) -> None:
    assert _plan(**changes).experts.fences_chunks is fenced


def test_the_fence_is_a_barrier_on_both_flat_sides_and_nothing_else() -> None:
    fenced = render(_plan())
    assert fenced.count("jax.lax.optimization_barrier(") == 2
    assert "inputs = jax.lax.optimization_barrier(inputs)" in fenced
    assert "return jax.lax.optimization_barrier(y.reshape(LOCAL_TOKENS, EMBED_DIM))" in fenced
    assert "optimization_barrier" not in render(_plan(kernel="pallas", token_chunks=1))


@pytest.mark.slow
def test_the_layer_libtpu_crashed_on_compiles_its_forward(tmp_path) -> None:
    """The full-size forward, compiled for tpu7x 2x2x2 (compile-only devices)."""
    pytest.importorskip("libtpu")
    plan = _plan()
    layer = tmp_path / "layer.py"
    layer.write_text(render(plan), encoding="utf-8")
    tpu = json.dumps(tpu_target(plan).to_json())
    compile_forward = "import sys; from moegen.verify.memory.assigned_worker import main; sys.exit(main(*sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", compile_forward, str(layer), tpu, "forward"],
        env=worker_env(plan.mesh.num_devices, tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, compiler_crash(done.stderr) or done.stderr[-2000:]
