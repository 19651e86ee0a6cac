"""Do the replicas' weights move once per step, compiled?

A small layer with redundant experts (mesh fsdp 2 x expert 4, two extra slots a device,
token chunks 2) is compiled for v5e 2x4 on compile-only TPU devices (libtpu, no TPU needed),
forward and forward+backward, in one child process. Each replica's weights are one
collective-permute per weight per ppermute round in the forward pass, and one more for
their gradient in the backward pass, all in the ENTRY computation: none inside the scan over
token chunks (that would fetch them again per chunk), none anywhere else; each moves one
expert's weight, gathered over fsdp and cast (bf16[D, F]), not a device's whole shard. The
same layer without replicas has no collective-permute at all.
"""

from __future__ import annotations

import importlib.util
import os
import re
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

EMBED, FFN = 512, 384
PLACEMENT = [
    [{"expert": 4, "share": 0.5}, {"expert": 8, "share": 0.25}],
    [{"expert": 0, "share": 0.5}, {"expert": 12, "share": 0.5}],
    [{"expert": 1, "share": 0.5}, {"expert": 5, "share": 0.5}],
    [{"expert": 2, "share": 0.5}, {"expert": 9, "share": 0.5}],
]
DONE = re.compile(r"= (\S+) collective-permute-done\(")


def plan_for(replicas: bool) -> Plan:
    choices = {
        "experts": 16,
        "embed": EMBED,
        "ffn": FFN,
        "top_k": 2,
        "renormalize": True,
        "batch": 8,
        "seq_len": 512,
        "params_dtype": "float32",
        "compute_dtype": "bfloat16",
        "axes": {"fsdp": 2, "expert": 4},
        "strategy": "ragged_all_to_all",
        "hardware": "tpu-v5e",
        "topology": "2x4",
        "kernel": "pallas",
        "token_chunks": 2,
    }
    if replicas:
        choices |= {"redundant_experts": 8, "placement": PLACEMENT}
    name = "replicas" if replicas else "no_replicas"
    text = spec_yaml(choices)
    return make_plan(validate(load_spec_bytes(text.encode(), f"specs/{name}.yaml", name)))


COMPILE = textwrap.dedent(
    """
    import functools, importlib.util, sys
    import jax, jax.numpy as jnp
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x4", chip_config_name="default",
        chips_per_host_bounds=(2, 4, 1), num_slices=1,
    ).devices
    for path in sys.argv[1:]:
        spec = importlib.util.spec_from_file_location("layer", path)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        mesh = m.make_mesh(devices)

        def loss(params, x):
            y, _ = m.moe_layer(params, x, mesh=mesh)
            return jnp.sum(y.astype(jnp.float32) ** 2)

        programs = {
            "forward": functools.partial(m.moe_layer, mesh=mesh),
            "train": jax.grad(loss, argnums=(0, 1)),
        }
        for name, program in programs.items():
            lowered = jax.jit(program).lower(m.param_shapes(mesh), m.input_shape(mesh))
            with open(f"{path}.{name}.hlo", "w") as f:
                f.write(lowered.compile().as_text())
    """
)


@pytest.fixture(scope="module")
def compiled_hlo(tmp_path_factory) -> dict[tuple[bool, str], str]:
    """(replicas, program) -> the compiled HLO text (one child process)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("compiling for TPU needs libtpu")
    tmp = tmp_path_factory.mktemp("replicas_hlo")
    paths = {}
    for replicas in (True, False):
        plan = plan_for(replicas)
        paths[replicas] = tmp / f"{plan.module_name}.py"
        paths[replicas].write_text(render(plan), encoding="utf-8")
    script = tmp / "compile.py"
    script.write_text(COMPILE, encoding="utf-8")
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    result = subprocess.run(
        [sys.executable, str(script), *map(str, paths.values())],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    return {
        (replicas, program): Path(f"{path}.{program}.hlo").read_text(encoding="utf-8")
        for replicas, path in paths.items()
        for program in ("forward", "train")
    }


def permutes(text: str) -> tuple[list[str], list[str]]:
    """The shapes the collective-permutes of the whole module move, and of ENTRY alone."""
    entry = text[text.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}\n")]
    return DONE.findall(text), DONE.findall(entry)


def test_the_plan_compiled_here_fetches_replicas_in_rounds() -> None:
    replicas = plan_for(True).experts.replicas
    assert (replicas.extra_per_device, replicas.local_slots, replicas.slots) == (2, 6, 24)
    assert replicas.weights == ("w_gate", "w_up", "w_down")
    # each device sends and receives at most one expert a round, every replica once
    received = sorted(pair[1] for _, pairs in replicas.rounds for pair in pairs)
    assert received == sorted([d for d in range(4) for _ in range(2)])
    for _, pairs in replicas.rounds:
        assert len({a for a, _ in pairs}) == len({b for _, b in pairs}) == len(pairs)


@pytest.mark.parametrize(("program", "passes"), [("forward", 1), ("train", 2)])
@pytest.mark.slow
def test_replica_weights_move_once_per_step(compiled_hlo, program, passes) -> None:
    replicas = plan_for(True).experts.replicas
    everywhere, in_entry = permutes(compiled_hlo[True, program])
    expected = passes * len(replicas.rounds) * len(replicas.weights)
    assert len(everywhere) == len(in_entry) == expected, (everywhere, in_entry)
    # one expert's weight each, gathered over fsdp and cast: gate, up and down
    one_expert = {f"bf16[{EMBED},{FFN}]", f"bf16[{FFN},{EMBED}]"}
    assert {shape.split("{")[0] for shape in everywhere} == one_expert


@pytest.mark.parametrize("program", ["forward", "train"])
@pytest.mark.slow
def test_without_replicas_nothing_is_permuted(compiled_hlo, program) -> None:
    assert permutes(compiled_hlo[False, program]) == ([], [])
