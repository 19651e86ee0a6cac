"""The TPU target's twin: megablox (Pallas) interpreted on fake CPU devices against the dense reference, on padded, ragged rows.

The twin runs megablox interpreted (ragged groups, padded row tiles, starved experts,
gradients included); the full-size module is compiled for the real slice on libtpu's
compile-only devices, and its per-device memory is judged against the slice's HBM.

Full verifications are expensive (interpreted Pallas twins ~10-20 s, full-size TPU compiles
10-40 s on a shared 2-core machine), so there are exactly three: the two small pallas specs
here and the committed Mixtral v5e example (test_tpu_examples.py). Everything else is checked
at unit level (plan, render, memory verdict) or in a short child process.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tpu_cases import FLOAT32_STEP, fake_cpu_env, last_json, pallas_yaml, write_spec

from moegen.kernels.pallas import TWIN_TILE
from moegen.pipeline import generate, load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import peak_bytes, verify
from moegen.verify.twin import TWIN_SEQ_LEN, TWIN_SEQUENCES_PER_SHARD, twin_of

# Two small pallas layers: an even and an odd top_k, different router options. Both twins
# route 10 tokens per device (20 and 30 rows) against 32-row tiles: ragged, padded.
VARIANTS = {
    "top2_softmax": {"top_k": 2, "score": "softmax", "renormalize": True},
    "top3_sigmoid": {"top_k": 3, "score": "sigmoid", "renormalize": False},
}


@pytest.fixture(params=sorted(VARIANTS))
def small_pallas(request, tmp_path, monkeypatch):
    """(name, Generated) of a small pallas spec written into tmp_path, cwd = tmp_path."""
    name = f"pallas_{request.param}"
    write_spec(tmp_path, name, pallas_yaml(**VARIANTS[request.param]))
    monkeypatch.chdir(tmp_path)
    return request.param, generate(Path("specs") / f"{name}.yaml")


# ---------------------------------------------------------------------------------------
# The twin: interpreted megablox on padded, ragged rows; the full module: compiled


def test_twin_pads_ragged_rows_and_runs_megablox_interpreted(small_pallas):
    variant, generated = small_pallas
    top_k = VARIANTS[variant]["top_k"]
    twin = make_plan(twin_of(generated.loaded), interpret=True)

    pallas = twin.kernel.config
    assert twin.kernel.name == "pallas" and pallas.interpret
    assert pallas.gate_up_tile == pallas.down_tile == tuple(TWIN_TILE)
    assert twin.local_tokens == TWIN_SEQUENCES_PER_SHARD * TWIN_SEQ_LEN
    assert twin.routed_rows == twin.local_tokens * top_k
    # The routed rows are not a whole number of row tiles: the kernel gets padding rows.
    assert twin.routed_rows % TWIN_TILE[0] != 0
    assert pallas.pads_rows and pallas.padded_rows > twin.routed_rows
    assert pallas.padded_rows % pallas.row_alignment == 0
    assert pallas.padded_rows - twin.routed_rows < pallas.row_alignment
    # Contraction and output smaller than one tile: the kernel masks them.
    assert twin.embed_dim < TWIN_TILE[1] and twin.ffn_dim < TWIN_TILE[2]

    twin_source = render(twin)
    # gate, up, down through one custom VJP, whose three megablox kernels (the forward gmm,
    # the input gradient's gmm, the weight gradient's tgmm) each run interpreted
    assert len(re.findall(r"(?<![\w.])_gmm\(", twin_source)) == 3
    kernel_calls = re.findall(r"megablox_t?gmm\((.*?)\)\n", twin_source, re.DOTALL)
    assert len(kernel_calls) == 3
    assert all(call.rstrip().rstrip(",").endswith("interpret=True") for call in kernel_calls)
    assert twin_source.count("interpret=True") == 3
    assert f"PADDED_ROWS = {pallas.padded_rows}" in twin_source
    assert "jnp.pad(" in twin_source  # what the padding rows do: the padding test below

    # The module that ships is never interpreted.
    assert not generated.plan.kernel.config.interpret
    assert make_plan(generated.loaded).kernel.config.interpret is False
    assert "megablox_gmm(" in generated.source
    assert "interpret" not in generated.source


@pytest.mark.slow
def test_small_pallas_layer_verifies(small_pallas):
    """One full verification per variant: twin parity with gradients, compiles, verdict."""
    variant, generated = small_pallas
    spec = generated.loaded.spec
    events = []
    report = verify(generated.loaded, generated.source, on_step=events.append)
    assert events == report.steps
    assert [s["step"] for s in report.steps] == [
        "import",
        FLOAT32_STEP,  # float32 spec: no second, low-precision twin
        "compile forward",
        "compile forward+backward",
        "memory verdict",
    ]

    twin = make_plan(twin_of(generated.loaded))
    twin_rows = twin.batch * twin.seq_len * spec.router.top_k
    cases = {case["case"]: case for case in report.step(FLOAT32_STEP)["cases"]}
    assert set(cases) == {"random routing", "starved experts"}
    for case in cases.values():
        assert case["max_relative_error"] < 1e-5, case
        counts = case["tokens_per_expert"]
        assert len(counts) == spec.layer.num_experts and sum(counts) == twin_rows  # dropless
        assert any(count % TWIN_TILE[0] for count in counts)  # ragged groups
    starved = cases["starved experts"]
    assert starved["starved_experts"]
    assert all(starved["tokens_per_expert"][e] == 0 for e in starved["starved_experts"])

    plan = generated.plan
    x_bytes = plan.local_tokens * plan.embed_dim * 4
    for name in ("compile forward", "compile forward+backward"):
        step = report.step(name)
        assert "oom" not in step
        memory = step["memory"]
        assert {"argument", "output", "temp", "alias"} <= set(memory)
        assert memory["argument"] > 0 and memory["output"] > 0 and step["flops"] > 0
        # Arguments on one device: its parameter shards and its slice of x.
        assert math.isclose(memory["argument"], plan.cost.param_bytes + x_bytes, rel_tol=0.05)
    # forward+backward returns a gradient for every argument: the same bytes again.
    backward = report.step("compile forward+backward")["memory"]
    assert math.isclose(backward["output"], plan.cost.param_bytes + x_bytes, rel_tol=0.05)

    verdict = report.step("memory verdict")["verdict"]
    assert verdict.startswith("fits"), verdict
    for name in ("forward", "forward+backward"):
        peak = peak_bytes(report.step(f"compile {name}")["memory"])
        assert f"{name} {peak / 2**30:.2f} GiB" in verdict
    assert "of 16.00 GiB HBM per device" in verdict


# ---------------------------------------------------------------------------------------
# Padding rows never reach the output or the gradients

PADDING_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax.numpy as jnp
    import numpy as np
    from moegen.verify.reference import parity
    from moegen.verify.worker import child as worker
    from moegen.verify.reference.layer import RouterConfig

    cfg = RouterConfig(**json.loads(sys.argv[1]))
    real_relative_error = parity.relative_error
    compared = []

    def relative_error(got, want, *set_aside):
        compared.append(bool(np.isfinite(np.asarray(got, np.float64)).all()))
        return real_relative_error(got, want, *set_aside)

    parity.relative_error = relative_error  # check_parity compares every output through it

    class Poisoned:
        # jax.numpy, except that pad fills with NaN: a padding row that reaches the output,
        # a kept activation or a weight gradient turns it NaN.
        def __init__(self):
            self.pads = []

        def __getattr__(self, name):
            return getattr(jnp, name)

        def pad(self, array, pad_width, **kwargs):
            self.pads.append([list(w) for w in pad_width])
            return jnp.pad(array, pad_width, constant_values=jnp.nan)

    results = []
    for i, (path, starved) in enumerate(json.loads(sys.argv[2])):
        module = worker.import_module(path, f"padded_module_{i}")
        module.jnp = Poisoned()
        compared.clear()
        cases = [parity.check_parity(
            module, cfg, *parity.random_case(module, 0), 1e-5, "random routing")]
        if starved:
            params, x, cotangent, experts = parity.starved_case(module, 1)
            case = parity.check_parity(module, cfg, params, x, cotangent, 1e-5, "starved experts")
            cases.append(case | {"starved_experts": experts})
        results.append({
            "routed_rows": module.ROUTED_ROWS,
            "padded_rows": module.PADDED_ROWS,
            "pads": module.jnp.pads,
            "finite": compared[:],
            "cases": cases,
        })
    print(json.dumps({"results": results}), flush=True)
    """
)


def padded_plans(tmp_path: Path) -> list:
    """Two interpreted pallas plans whose routed rows are padded to whole row tiles.

    (a) the twin of a small pallas spec: 20 routed rows in 32-row tiles;
    (b) pinned row tiles 32 (gate, up) and 24 (down), so the padding is to lcm = 96:
        76 rows of padding for 20 routed rows, several whole tiles of no group.
    """
    twin_spec = load_valid(write_spec(tmp_path, "padded_twin", pallas_yaml()))
    pinned_spec = load_valid(
        write_spec(
            tmp_path,
            "padded_pinned",
            pallas_yaml(
                embed_dim=16, ffn_dim=24, batch=8, seq_len=5, tiles=([32, 128, 128], [24, 128, 128])
            ),
        )
    )
    return [make_plan(twin_of(twin_spec), interpret=True), make_plan(pinned_spec, interpret=True)]


def run_with_nan_padding(tmp_path: Path, plans: list) -> list[dict]:
    """Render each plan and run PADDING_SCRIPT on 4 fake CPU devices; its per-module results.

    Only the first module (the twin) also runs the starved-experts case.
    """
    modules = []
    for i, plan in enumerate(plans):
        assert plan.kernel.config.pads_rows and plan.mesh.num_devices == 4
        path = tmp_path / f"padded_{i}.py"
        path.write_text(render(plan), encoding="utf-8")
        modules.append([str(path), i == 0])

    router = {"top_k": 2, "score": "softmax", "renormalize": True}
    script = tmp_path / "padding.py"
    script.write_text(PADDING_SCRIPT, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(router), json.dumps(modules)],
        env=fake_cpu_env(4),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    return last_json(result.stdout)["results"]


@pytest.mark.slow
def test_padding_rows_never_reach_outputs_or_gradients(tmp_path):
    """The rows that pad the routed buffer to whole row tiles are filled with NaN: forward,
    aux and every gradient stay finite and equal to the dense reference."""
    plans = padded_plans(tmp_path)
    assert (plans[0].routed_rows, plans[0].kernel.config.padded_rows) == (20, 32)
    assert (
        plans[1].routed_rows,
        plans[1].kernel.config.padded_rows,
        plans[1].kernel.config.row_alignment,
    ) == (20, 96, 96)
    results = run_with_nan_padding(tmp_path, plans)
    assert len(results) == 2
    for plan, got in zip(plans, results, strict=True):
        assert (got["routed_rows"], got["padded_rows"]) == (
            plan.routed_rows,
            plan.kernel.config.padded_rows,
        )
        # The poisoned pad was really used: the padding rows exist and hold NaN.
        assert got["pads"], "the module never padded its routed rows"
        assert all(
            p == [[0, plan.kernel.config.padded_rows - plan.routed_rows], [0, 0]]
            for p in got["pads"]
        )
        # y, grad_x and the four parameter gradients, per case: all finite...
        assert len(got["finite"]) == 6 * len(got["cases"]) and all(got["finite"]), got
        # ...and equal to the dense reference.
        for case in got["cases"]:
            assert case["max_relative_error"] < 1e-5, case
    starved = results[0]["cases"][1]
    assert all(starved["tokens_per_expert"][e] == 0 for e in starved["starved_experts"])
