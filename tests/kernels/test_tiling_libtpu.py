"""libtpu against `moegen.kernels.tiling`'s VMEM model: each megablox kernel the plan runs (forward gmm,
input-gradient gmm, weight-gradient tgmm), compiled for a compile-only TPU chip (no TPU needed),
allocates no more scoped VMEM than `kernel_vmem` says; a tile the model refuses for its VMEM is
refused by the compiler too (CompileTimeScopedVmemOom), and the tiles the plan chooses compile.

The compiled module names the scoped VMEM of each kernel in its backend config
(`used_scoped_memory_configs`); compiled under a raised limit (`--xla_tpu_scoped_vmem_limit_kib`),
a kernel that would not fit the default one reports it too. Measured this way over 1,000 tiles
(rows 128 to 1024, lanes 128 to 2048, ragged widths, both compute dtypes, every result dtype) on
v5e, v5p, v6e and tpu7x, the model is an upper bound by 0.15 MiB or more; the cases below are
the tiles the example specs and the layers of issue 17 run, and the edges of the model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from buildable_cases import LAYERS
from conftest import REPO_ROOT
from tiling_cases import MIB

from moegen.hardware import CATALOGUE
from moegen.kernels.pallas import cast_vmem_limit
from moegen.kernels.tiling import Tile, kernel_vmem, projection_out_dtypes, tile_problems
from moegen.load import LoadedSpec, load_spec
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("libtpu") is None,
        reason="libtpu is not installed (pip install 'moegen[tpu]')",
    ),
]

_PROBE = r"""
import importlib, importlib.util, json, re, sys
import jax, jax.numpy as jnp
from jax.experimental import topologies
from jax.sharding import SingleDeviceSharding

kernels = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
topology, bounds, cases = json.loads(sys.argv[1])
device = topologies.get_topology_desc(
    platform="tpu", topology_name=topology, chip_config_name="default",
    chips_per_host_bounds=tuple(bounds), num_slices=1,
).devices[0]
on_device = SingleDeviceSharding(device)
dtypes = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
USED = re.compile(r'"used_scoped_memory_configs":\[\{"memory_space":"1","offset":"0","size":"(\d+)"')
OOM = re.compile(r"Scoped allocation with size ([0-9.]+)M and limit ([0-9.]+)M")
results = []
for kernel, (m, k, n, groups), tiling, lhs, rhs, out, module in cases:
    tiling = tuple(tiling)
    gmm = kernels.gmm
    if module:  # the module's own gmm, casting float32 weight blocks in VMEM
        spec = importlib.util.spec_from_file_location("generated", module)
        generated = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(generated)
        gmm = lambda a, b, s, o, t, transpose_rhs=False: generated._gmm_cast(
            a, b, s, t, o, transpose_rhs=transpose_rhs)
    if kernel == "forward gmm":  # rows [m, k] x weights [g, k, n] -> [m, n]
        shapes = ((m, k), (groups, k, n))
        call = lambda a, b, s: gmm(a, b, s, dtypes[out], tiling)
    elif kernel == "input-gradient gmm":  # gradient [m, n] x weights [g, k, n]^T -> [m, k]
        shapes = ((m, n), (groups, k, n))
        call = lambda a, b, s: gmm(a, b, s, dtypes[out], tiling, transpose_rhs=True)
    else:  # weight-gradient tgmm: rows^T [k, m] x gradient [m, n] -> [g, k, n]
        shapes = ((k, m), (m, n))
        call = lambda a, b, s: kernels.tgmm(a, b, s, dtypes[out], tiling, num_actual_groups=groups)
    args = (
        jax.ShapeDtypeStruct(shapes[0], dtypes[lhs], sharding=on_device),
        jax.ShapeDtypeStruct(shapes[1], dtypes[rhs], sharding=on_device),
        jax.ShapeDtypeStruct((groups,), jnp.int32, sharding=on_device),
    )
    try:
        text = jax.jit(call).lower(*args).compile().as_text()
        used = [int(USED.search(line).group(1)) for line in text.splitlines()
                if "tpu_custom_call" in line and USED.search(line)]
        results.append({"used": max(used)})
    except Exception as error:
        found = OOM.search(str(error))
        if "CompileTimeScopedVmemOom" not in str(error) or not found:
            raise
        results.append({"oom": [float(found.group(1)), float(found.group(2))]})
print("MOEGEN-VMEM " + json.dumps(results))
"""

CHIPS = {  # one compile-only chip of each generation: libtpu's topology name, host bounds
    "tpu-v5e": ("v5e:1x1", [1, 1, 1]),
    "tpu-v6e": ("v6e:1x1", [1, 1, 1]),
    "tpu-v5p": ("v5p:2x2x1", [2, 2, 1]),
    "tpu7x": ("tpu7x:2x2x1", [2, 2, 1]),
}
# The compile limit raised past every case: each kernel reports what it allocates.
RAISED_KIB = 120000


def compiled(hw: str, cases: list[list], raised: bool) -> list[dict]:
    """Compile each case (kernel, problem, tile, lhs, rhs, out dtypes) for one chip."""
    topology, bounds = CHIPS[hw]
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only TPU devices need no TPU backend
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # share libtpu with a concurrent verify
    if raised:
        env["LIBTPU_INIT_ARGS"] = f"--xla_tpu_scoped_vmem_limit_kib={RAISED_KIB}"
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([topology, bounds, cases])],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOEGEN-VMEM ")]
    assert result.returncode == 0 and len(lines) == 1, result.stdout + result.stderr[-4000:]
    return json.loads(lines[0].removeprefix("MOEGEN-VMEM "))


def projection_kernels(
    rows: int,
    k: int,
    n: int,
    groups: int,
    tiles: Tile | tuple[Tile, ...],
    dtype: str,
    out: str,
    cast_module: str = "",
) -> list[tuple[list, int]]:
    """The three kernels of one projection [rows, k] -> [rows, n] as the module's VJP runs
    them, each with its own tile (one Tile: the same for all three) and the dtypes it reads
    and writes, beside what kernel_vmem says it needs. With `cast_module` (a generated
    module's path), the gmm calls are its _gmm_cast reading float32 weights, and tgmm writes
    their gradient in float32."""
    forward, input_gradient, weight_gradient = tiles if isinstance(tiles, tuple) else [tiles] * 3
    problem = [rows, k, n, groups]
    weights = "float32" if cast_module else dtype
    cases = [
        (
            ["forward gmm", problem, list(forward.as_tuple()), dtype, weights, out, cast_module],
            forward,
        ),
        (
            ["input-gradient gmm", problem, list(input_gradient.as_tuple()), out, weights, dtype]
            + [cast_module],
            input_gradient,
        ),
        (
            ["weight-gradient tgmm", problem, list(weight_gradient.as_tuple()), dtype, out]
            + [weights, ""],
            weight_gradient,
        ),
    ]
    return [
        (case, kernel_vmem(tile, dtype, out, weights)[i]) for i, (case, tile) in enumerate(cases)
    ]


def plan_kernels(loaded: LoadedSpec, folder: Path) -> tuple[str, list[tuple[list, int]]]:
    """Every kernel a Pallas spec's plan runs, and the VMEM the model gives each (the module
    rendered into `folder` where its own gmm reads float32 weights)."""
    plan = make_plan(loaded)
    cast_module = ""
    if plan.kernel.config.casts_weights:
        path = folder / f"{plan.module_name}.py"
        path.write_text(render(plan), encoding="utf-8")
        cast_module = str(path)
    gate_up_out, down_out = projection_out_dtypes(
        plan.compute_dtype, plan.experts.overlap_chunks, plan.ffn.chunks
    )
    width = plan.ffn.chunk_width * (2 if plan.ffn.fuses_gate_up else 1)
    rows, groups, dtype = plan.kernel.config.padded_rows, plan.local_experts, plan.compute_dtype
    tiles = plan.kernel.config.kernel_tiles  # each kernel's own
    gate_up = tuple(Tile(*tile) for tile in tiles["GATE_UP_TILING"])
    down = tuple(Tile(*tile) for tile in tiles["DOWN_TILING"])
    chunk = plan.experts.chunk_width
    return plan.hardware, [
        *projection_kernels(rows, chunk, width, groups, gate_up, dtype, gate_up_out, cast_module),
        *projection_kernels(
            rows, plan.ffn.chunk_width, plan.embed_dim, groups, down, dtype, down_out, cast_module
        ),
    ]


def assert_bounded(hw: str, cases: list[tuple[list, int]]) -> list[int]:
    """Compile every case under the raised limit: each allocates at most what the model says."""
    measured = compiled(hw, [case for case, _ in cases], raised=True)
    used = []
    for (case, model), result in zip(cases, measured, strict=True):
        assert "used" in result, (case, result)
        assert result["used"] <= model, (case, result["used"] / MIB, model / MIB)
        used.append(result["used"])
    return used


EXAMPLES = [
    "mixtral_8x7b_v5e",
    "mixtral_8x7b_ep_a2a_v5e",  # 8 FFN slices: down writes float32
    "qwen3_30b_a3b_ring_v6e",  # float32 weights read as stored: the module's own gmm
    "ernie45_21b_a3b_v5p",  # the same on v5p
    "qwen3_30b_a3b_ring_overlap_v6e",  # gate/up summed over embedding chunks in float32
    "gpt_oss_120b_v6e",  # widths of 2880: masked last tiles
]


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_tiles_allocate_no_more_than_modelled(name: str, tmp_path: Path) -> None:
    hw, cases = plan_kernels(validate(load_spec(REPO_ROOT / "specs" / f"{name}.yaml")), tmp_path)
    casting = name in ("qwen3_30b_a3b_ring_v6e", "ernie45_21b_a3b_v5p")
    assert {bool(case[-1]) for case, _ in cases if case[0].endswith(" gmm")} == {casting}
    assert_bounded(hw, cases)
    default = CATALOGUE[hw].vmem_bytes_for_tiles
    for case, model in cases:  # the module's own gmm runs under its own limit
        limit = cast_vmem_limit(default) if case[-1] else default
        assert model <= limit, (case, model / MIB, limit / MIB)


@pytest.mark.parametrize("name", ["mixtral_2_slices", "grok1_4_slices", "phi35_split_mesh"])
def test_issue_17_tiles_allocate_no_more_than_modelled(name: str, tmp_path: Path) -> None:
    """The Pallas layers of issue 17 (tests/emit/test_buildable.py builds them end to end)."""
    hw, cases = plan_kernels(LAYERS[name].loaded(), tmp_path)
    assert_bounded(hw, cases)


@pytest.mark.parametrize(
    ("hw", "problem", "tile", "dtype", "out"),
    [
        # 1024 rows: the scratch past 512 rows (5 bytes a [rows, contraction] element)
        ("tpu-v6e", [8192, 4096, 4096, 8], Tile(1024, 2048, 1024), "bfloat16", "float32"),
        ("tpu-v5e", [8192, 4096, 4096, 8], Tile(1024, 1024, 512), "bfloat16", "float32"),
        # ragged widths: the last contraction tile is masked in float32
        ("tpu-v6e", [8192, 2880, 2880, 8], Tile(256, 768, 2944), "bfloat16", "float32"),
        ("tpu-v5e", [8192, 2000, 1000, 8], Tile(512, 1024, 1024), "bfloat16", "bfloat16"),
        # past 1024 contraction lanes: tpu7x's weight gradient (5.5 bytes an element)
        ("tpu7x", [8192, 4096, 4096, 8], Tile(512, 2048, 1024), "bfloat16", "float32"),
        ("tpu-v5p", [8192, 4096, 4096, 8], Tile(512, 1024, 1024), "bfloat16", "float32"),
        # float32 throughout
        ("tpu-v5e", [8192, 4096, 4096, 8], Tile(512, 512, 1024), "float32", "float32"),
    ],
)
def test_model_bounds_the_edges(hw: str, problem: list[int], tile: Tile, dtype, out) -> None:
    assert_bounded(hw, projection_kernels(*problem[:3], problem[3], tile, dtype, out))


def test_a_tile_the_model_refuses_the_compiler_refuses() -> None:
    """Mixtral's down projection in 2 FFN slices ([rows, 7168] -> 4096, writing float32) on
    v5e: megablox's default tile is refused by the model (16.5 MiB in the weight gradient) and
    by the compiler under v5e's own limit (16.12 MiB of 16: CompileTimeScopedVmemOom); the
    plan gives the weight gradient a narrower tile of its own, and every kernel compiles."""
    default = Tile(512, 1024, 1024)
    chosen = tuple(
        Tile(*tile)
        for tile in LAYERS["mixtral_2_slices"].plan().kernel.config.kernel_tiles["DOWN_TILING"]
    )
    assert [t.as_tuple() for t in chosen] == [
        (512, 1024, 1024),
        (512, 1024, 1024),
        (512, 896, 1024),
    ]
    assert tile_problems(default, "bfloat16", 16 * MIB, "float32")
    assert tile_problems(chosen[2], "bfloat16", 16 * MIB, "float32") == []
    cases = [
        case
        for tiles in (default, chosen)
        for case, _ in projection_kernels(32768, 7168, 4096, 2, tiles, "bfloat16", "float32")
    ]
    results = compiled("tpu-v5e", cases, raised=False)
    assert results[2]["oom"][1] == 16.0 and results[2]["oom"][0] > 16.0, results[2]
    assert [("used" in r) for r in results] == [True, True, False, True, True, True], results
