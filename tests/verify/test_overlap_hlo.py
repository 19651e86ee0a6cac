"""Does ring_of_experts with overlap_chunks > 1 overlap transfer and compute once compiled?

The module's claim: while the gate and up grouped matmuls run on the block one device holds,
the next block is in flight, so the scheduled TPU HLO has collective-permute-start ...
grouped-matmul custom call(s) ... collective-permute-done. A small layer (mesh fsdp 2 x
expert 4) is compiled chunked (overlap_chunks: 4) for v5e 2x4 and v6e 2x4 and unchunked
(overlap_chunks: 1) for v5e 2x4, on compile-only TPU devices (libtpu, no TPU needed), in one
child process; the ENTRY computation of each scheduled module is parsed and every
collective-permute-start is matched with its collective-permute-done by the done's operand.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from spec_builder import spec_yaml

from moegen.load import load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify.hlo.overlap import is_grouped_matmul, overlapped, permute_windows
from moegen.verify.hlo.parse import entry_instructions

# name -> (hardware, overlap chunks): the same small layer on a 2x4 slice, mesh fsdp 2 x expert 4
VARIANTS = {
    "v5e-chunks4": ("tpu-v5e", 4),
    "v6e-chunks4": ("tpu-v6e", 4),
    "v5e-chunks1": ("tpu-v5e", 1),
}
SHARDS = 4


def spec_text(hardware: str, chunks: int) -> str:
    return spec_yaml(
        {
            "description": f"ring of experts overlap, compiled HLO ({chunks} chunks)",
            "experts": 16,
            "embed": 1024,
            "ffn": 1024,
            "top_k": 2,
            "score": "softmax",
            "renormalize": True,
            "batch": 8,
            "seq_len": 512,
            "params_dtype": "float32",
            "compute_dtype": "bfloat16",
            "axes": {"fsdp": 2, "expert": SHARDS},
            "strategy": "ring_of_experts",
            "overlap_chunks": chunks,
            "hardware": hardware,
            "topology": "2x4",
            "kernel": "pallas",
        }
    )


def plan_for(variant: str) -> Plan:
    hardware, chunks = VARIANTS[variant]
    name = "ring_" + variant.replace("-", "_")
    text = spec_text(hardware, chunks)
    return make_plan(validate(load_spec_bytes(text.encode(), f"specs/{name}.yaml", name)))


COMPILE = textwrap.dedent(
    """
    import functools, importlib.util, sys
    import jax
    from jax.experimental import topologies

    slices = {}
    for topology, path in zip(sys.argv[1::2], sys.argv[2::2]):
        if topology not in slices:
            slices[topology] = topologies.get_topology_desc(
                platform="tpu", topology_name=topology, chip_config_name="default",
                chips_per_host_bounds=(2, 4, 1), num_slices=1,
            ).devices
        spec = importlib.util.spec_from_file_location("layer_" + str(len(slices)), path)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        mesh = m.make_mesh(slices[topology])
        lowered = jax.jit(functools.partial(m.moe_layer, mesh=mesh)).lower(
            m.param_shapes(mesh), m.input_shape(mesh)
        )
        with open(path + ".hlo", "w") as f:
            f.write(lowered.compile().as_text())
        print("compiled", path, flush=True)
    """
)


@pytest.fixture(scope="module")
def compiled_hlo(tmp_path_factory) -> dict[str, str]:
    """variant -> the scheduled HLO text of its compiled forward (one child process)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("compiling for TPU needs libtpu")
    tmp = tmp_path_factory.mktemp("overlap_hlo")
    args, paths = [], {}
    for variant in VARIANTS:
        plan = plan_for(variant)
        path = tmp / f"{plan.module_name}.py"
        path.write_text(render(plan), encoding="utf-8")
        paths[variant] = path
        args += [plan.mesh.tpu_topology_name, str(path)]
    script = tmp / "compile.py"
    script.write_text(COMPILE, encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    result = subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    return {
        variant: Path(f"{path}.hlo").read_text(encoding="utf-8") for variant, path in paths.items()
    }


def test_plans_compiled_here() -> None:
    chunked, whole = plan_for("v5e-chunks4"), plan_for("v5e-chunks1")
    assert (chunked.experts.overlap_chunks, chunked.experts.chunk_width) == (4, 256)
    assert chunked.experts.ffn_calls == SHARDS and whole.experts.ffn_calls == 1
    assert chunked.mesh.tpu_topology_name == whole.mesh.tpu_topology_name == "v5e:2x4"
    assert plan_for("v6e-chunks4").mesh.tpu_topology_name == "v6e:2x4"
    assert chunked.mesh.chips_per_host_bounds == (2, 4, 1)


@pytest.mark.parametrize("variant", ["v5e-chunks4", "v6e-chunks4"])
@pytest.mark.slow
def test_chunked_ring_compiles_to_ring_steps_and_grouped_matmuls(compiled_hlo, variant) -> None:
    text = compiled_hlo[variant]
    assert "is_scheduled=true" in text.splitlines()[0]
    instructions = entry_instructions(text)
    windows = permute_windows(text)
    chunks = VARIANTS[variant][1]
    # (shards - 1) ring steps per chunk, each a start/done pair.
    assert len(windows) == (SHARDS - 1) * chunks
    assert len({w.start for w in windows}) == len(windows)
    gmms = [x for x in instructions if is_grouped_matmul(x)]
    # gate and up per chunk and ring step, down once per ring step.
    assert len(gmms) == 2 * chunks * SHARDS + SHARDS


@pytest.mark.slow
def test_chunked_ring_overlaps_a_grouped_matmul_with_a_transfer_on_v6e(compiled_hlo) -> None:
    text = compiled_hlo["v6e-chunks4"]
    assert len(overlapped(text)) == len(permute_windows(text)) == 12


@pytest.mark.slow
def test_chunked_ring_overlaps_a_grouped_matmul_with_a_transfer_on_v5e(compiled_hlo) -> None:
    """Left free, XLA's scheduler ran all 12 transfers before the first grouped matmul here;
    the module sends each block on only after the previous block's product (a barrier)."""
    text = compiled_hlo["v5e-chunks4"]
    windows = permute_windows(text)
    assert len(windows) == (SHARDS - 1) * VARIANTS["v5e-chunks4"][1]
    assert len(overlapped(text)) == len(windows), "a ring transfer with no grouped matmul under it"


@pytest.mark.parametrize("variant", ["v5e-chunks4", "v6e-chunks4"])
@pytest.mark.slow
def test_later_chunks_add_into_the_sums_in_place(compiled_hlo, variant) -> None:
    """Chunks 2.. of gate and up run _gmm_add, whose result is its last operand's buffer (6:
    the sums, after the grid's dynamic size, the metadata's 3 arrays, the rows and the
    weights), never copied: no chunk's product is a buffer of its own."""
    instructions = entry_instructions(compiled_hlo[variant])
    adds = [x for x in instructions if is_grouped_matmul(x) and x.name.startswith("gmm_add")]
    chunks = VARIANTS[variant][1]
    assert len(adds) == 2 * (chunks - 1) * SHARDS  # gate and up
    assert all("output_to_operand_aliasing={{}: (6, {})}" in x.text for x in adds)
    assert not [
        x
        for x in entry_instructions(compiled_hlo[variant])
        if x.opcode == "copy" and "gmm" in x.text
    ]


@pytest.mark.slow
def test_unchunked_ring_has_no_transfer_under_a_grouped_matmul(compiled_hlo) -> None:
    text = compiled_hlo["v5e-chunks1"]
    instructions = entry_instructions(text)
    assert sum(map(is_grouped_matmul, instructions)) >= 3  # gate, up, down: not vacuous
    assert any(x.opcode.startswith("all-gather") for x in instructions)
    assert overlapped(text) == []
