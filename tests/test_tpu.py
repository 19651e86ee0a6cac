"""The TPU target: megablox (Pallas) grouped matmuls, verified without a TPU.

The twin runs megablox interpreted on fake CPU devices against the dense reference (ragged
groups, padded row tiles, starved experts, gradients included); the full-size module is
compiled for the real slice on libtpu's compile-only devices, and its per-device memory is
judged against the slice's HBM.

Full verifications are expensive (interpreted Pallas twins ~10-20 s, full-size TPU compiles
10-40 s on a shared 2-core machine), so there are exactly four: two small pallas specs, one
spec that does not fit its slice, and the committed Mixtral v5e example. Everything else is
checked at unit level (plan, render, memory verdict) or in a short child process.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import (
    EXAMPLE_SPECS,
    GENERATED_DIR,
    REPO_ROOT,
    assert_no_traceback,
    run_moegen,
    snapshot,
)

import moegen.pipeline
import moegen.verify
from moegen.hardware import CATALOGUE, GIB
from moegen.load import load_spec
from moegen.pipeline import generate, load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import VerifyError, VerifyReport, memory_verdict, peak_bytes, verify
from moegen.verify.twin import TWIN_SEQ_LEN, TWIN_SEQUENCES_PER_SHARD, TWIN_TILE, twin_of

FLOAT32_STEP = "twin parity (float32)"


# ---------------------------------------------------------------------------------------
# Helpers


def pallas_yaml(
    *,
    top_k: int = 2,
    score: str = "softmax",
    renormalize: bool = True,
    num_experts: int = 8,
    embed_dim: int = 256,
    ffn_dim: int = 512,
    batch: int = 4,
    seq_len: int = 64,
    axes: dict[str, int] | None = None,
    topology: str = "2x2",
    dtypes: tuple[str, str] = ("float32", "float32"),
    tiles: tuple[list[int], list[int]] | None = None,
) -> str:
    """A small pallas spec on tpu-v5e (2x2, mesh data 2 x fsdp 2 unless told otherwise)."""
    mesh = "".join(
        f"\n    {axis}: {size}" for axis, size in (axes or {"data": 2, "fsdp": 2}).items()
    )
    text = f"""\
version: 1
description: Small megablox layer for the TPU tests.
layer:
  num_experts: {num_experts}
  embed_dim: {embed_dim}
  ffn_dim: {ffn_dim}
router:
  top_k: {top_k}
  score: {score}
  renormalize: {"true" if renormalize else "false"}
shapes:
  batch: {batch}
  seq_len: {seq_len}
dtypes:
  params: {dtypes[0]}
  compute: {dtypes[1]}
mesh:
  axes:{mesh}
target:
  hardware: tpu-v5e
  topology: {topology}
  kernel: pallas
"""
    if tiles:
        text += f"  tiles:\n    gate_up: {tiles[0]}\n    down: {tiles[1]}\n"
    return text


def write_spec(root: Path, name: str, text: str) -> Path:
    path = root / "specs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def fake_cpu_env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONIOENCODING"] = "utf-8"
    # As moegen's own worker does: compile-only libtpu, shared with other processes.
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return env


def last_json(stdout: str) -> dict:
    """The last JSON object a child printed (libraries may print other lines)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in:\n{stdout}")


def _is_tpu_spec(path: Path) -> bool:
    try:
        return load_spec(path).spec.target.hardware.startswith("tpu")
    except Exception:  # an invalid spec is another test's failure; judge it by its text
        text = path.read_text(encoding="utf-8", errors="replace")
        return re.search(r"^\s*hardware:\s*['\"]?tpu", text, re.MULTILINE) is not None


TPU_SPECS = [path for path in EXAMPLE_SPECS if _is_tpu_spec(path)]
TPU_NAMES = [path.stem for path in TPU_SPECS]


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
# 1. The twin: interpreted megablox on padded, ragged rows; the full module: compiled


def test_twin_pads_ragged_rows_and_runs_megablox_interpreted(small_pallas):
    variant, generated = small_pallas
    top_k = VARIANTS[variant]["top_k"]
    twin = make_plan(twin_of(generated.loaded), interpret=True)

    assert twin.kernel == "pallas" and twin.kernel_interpret
    assert twin.gate_up_tile == twin.down_tile == tuple(TWIN_TILE)
    assert twin.local_tokens == TWIN_SEQUENCES_PER_SHARD * TWIN_SEQ_LEN
    assert twin.routed_rows == twin.local_tokens * top_k
    # The routed rows are not a whole number of row tiles: the kernel gets padding rows.
    assert twin.routed_rows % TWIN_TILE[0] != 0
    assert twin.pads_rows and twin.padded_rows > twin.routed_rows
    assert twin.padded_rows % twin.row_alignment == 0
    assert twin.padded_rows - twin.routed_rows < twin.row_alignment
    # Contraction and output smaller than one tile: the kernel masks them.
    assert twin.embed_dim < TWIN_TILE[1] and twin.ffn_dim < TWIN_TILE[2]

    twin_source = render(twin)
    gmm_calls = re.findall(r"megablox\.gmm\((.*?)\)\n", twin_source, re.DOTALL)
    assert len(gmm_calls) == 3  # gate, up, down
    assert all(call.rstrip().rstrip(",").endswith("interpret=True") for call in gmm_calls)
    assert twin_source.count("interpret=True") == 3
    assert f"PADDED_ROWS = {twin.padded_rows}" in twin_source
    assert "jnp.pad(" in twin_source  # what the padding rows do: the padding test below

    # The module that ships is never interpreted.
    assert not generated.plan.kernel_interpret
    assert make_plan(generated.loaded).kernel_interpret is False
    assert "megablox.gmm(" in generated.source
    assert "interpret" not in generated.source


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
# 2. Padding rows never reach the output or the gradients

PADDING_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import jax.numpy as jnp
    import numpy as np
    from moegen.verify import worker
    from moegen.verify.reference import RouterConfig

    cfg = RouterConfig(**json.loads(sys.argv[1]))
    real_relative_error = worker.relative_error
    compared = []

    def relative_error(got, want):
        compared.append(bool(np.isfinite(np.asarray(got, np.float64)).all()))
        return real_relative_error(got, want)

    worker.relative_error = relative_error  # check_parity compares every output through it

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
        cases = [worker.check_parity(
            module, cfg, *worker._random_case(module, 0), 1e-5, "random routing")]
        if starved:
            params, x, cotangent, experts = worker._starved_case(module, 1)
            case = worker.check_parity(module, cfg, params, x, cotangent, 1e-5, "starved experts")
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


def test_padding_rows_never_reach_outputs_or_gradients(tmp_path):
    """The rows that pad the routed buffer to whole row tiles are filled with NaN: forward,
    aux and every gradient stay finite and equal to the dense reference."""
    # (a) the twin of a small pallas spec: 20 routed rows in 32-row tiles;
    # (b) pinned row tiles 32 (gate, up) and 24 (down), so the padding is to lcm = 96:
    #     76 rows of padding for 20 routed rows, several whole tiles of no group.
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
    plans = [make_plan(twin_of(twin_spec), interpret=True), make_plan(pinned_spec, interpret=True)]
    assert (plans[0].routed_rows, plans[0].padded_rows) == (20, 32)
    assert (plans[1].routed_rows, plans[1].padded_rows, plans[1].row_alignment) == (20, 96, 96)
    modules = []
    for i, plan in enumerate(plans):
        assert plan.pads_rows and plan.num_devices == 4
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
    results = last_json(result.stdout)["results"]
    assert len(results) == 2
    for plan, got in zip(plans, results, strict=True):
        assert (got["routed_rows"], got["padded_rows"]) == (plan.routed_rows, plan.padded_rows)
        # The poisoned pad was really used: the padding rows exist and hold NaN.
        assert got["pads"], "the module never padded its routed rows"
        assert all(p == [[0, plan.padded_rows - plan.routed_rows], [0, 0]] for p in got["pads"])
        # y, grad_x and the four parameter gradients, per case: all finite...
        assert len(got["finite"]) == 6 * len(got["cases"]) and all(got["finite"]), got
        # ...and equal to the dense reference.
        for case in got["cases"]:
            assert case["max_relative_error"] < 1e-5, case
    starved = results[0]["cases"][1]
    assert all(starved["tokens_per_expert"][e] == 0 for e in starved["starved_experts"])


# ---------------------------------------------------------------------------------------
# 3. The HBM verdict


def test_spec_too_large_for_its_slice_is_refused_with_the_compilers_verdict(tmp_path):
    """64 experts of 4096 x 8192 on a v5e 2x2 with the FFN whole: the forward fits,
    forward+backward does not. (Left to the plan, the FFN runs in slices and it fits.)"""
    name = "too_big_v5e"
    text = pallas_yaml(
        num_experts=64,
        embed_dim=4096,
        ffn_dim=8192,
        batch=4,
        seq_len=2048,
        axes={"fsdp": 4},
        dtypes=("float32", "bfloat16"),
    )
    write_spec(tmp_path, name, text + "memory:\n  ffn_chunks: 1\n")
    (tmp_path / "generated").mkdir()
    before = snapshot(tmp_path)
    plan = make_plan(load_valid(tmp_path / "specs" / f"{name}.yaml"))

    result = run_moegen("build", f"specs/{name}.yaml", cwd=tmp_path)
    err = result.stderr
    assert result.returncode == 4, result.stdout + err
    assert result.stdout == ""
    assert_no_traceback(result.stdout + err)
    assert snapshot(tmp_path) == before  # nothing written, generated/ still empty
    assert not any((tmp_path / "generated").iterdir())
    assert "wrote" not in err

    # The forward compiled (with its memory); forward+backward is the compiler's verdict.
    assert re.search(r"^  verify: compile forward\s+\d+\.\d+ s  per device: args", err, re.M), err
    assert "verification failed; nothing written:" in err
    message = err[err.index("verification failed; nothing written:") :]
    assert "forward+backward does not fit tpu-v5e 2x2; the TPU compiler says:" in message
    assert "RESOURCE_EXHAUSTED" in message
    assert "Largest buffers by the plan: " in message
    for item, size in plan.memory.ledger[:4]:
        assert f"{item} {size / 2**30:.2f} GiB" in message, item
    assert "To fit: shard parameters over more devices (a larger fsdp axis)" in message
    assert "bfloat16" in message and "larger slice" in message
    assert "run the FFN in slices (memory.ffn_chunks: 2 (" in message
    assert "memory verdict" not in err


def _mem(argument: float, output: float, temp: float, alias: float = 0.0) -> dict[str, int]:
    """A compiled step's memory figures, given in GiB; generated code is never counted."""
    figures = {"argument": argument, "output": output, "temp": temp, "alias": alias}
    return {k: int(v * GIB) for k, v in figures.items()} | {"generated_code": 7 * GIB}


def _report(*steps: dict) -> VerifyReport:
    return VerifyReport(
        steps=[
            {"step": "import", "seconds": 0.1},
            {"step": FLOAT32_STEP, "seconds": 1.0, "cases": []},
            *({"seconds": 1.0} | step for step in steps),
        ]
    )


@pytest.fixture
def v5e_plan(tmp_path):
    plan = make_plan(load_valid(write_spec(tmp_path, "verdict_v5e", pallas_yaml())))
    assert (plan.hardware, plan.topology) == ("tpu-v5e", "2x2")
    assert plan.memory.hbm_bytes_per_device == 16 * GIB
    return plan


def test_peak_bytes_is_arguments_outputs_temporaries_less_aliases():
    memory = {"argument": 100, "output": 20, "temp": 300, "alias": 15, "generated_code": 10**9}
    assert peak_bytes(memory) == 100 + 20 + 300 - 15


def test_memory_verdict_fits(v5e_plan):
    verdict = memory_verdict(
        v5e_plan,
        _report(
            {"step": "compile forward", "memory": _mem(1, 0.5, 2, 0.25), "flops": 1.0},
            # exactly the HBM: fits; and aliased outputs are not counted twice (18 - 2 = 16)
            {"step": "compile forward+backward", "memory": _mem(8, 8, 2, 2), "flops": 1.0},
        ),
    )
    assert verdict is not None and verdict.startswith("fits: "), verdict
    assert "forward 3.25 GiB, forward+backward 16.00 GiB of 16.00 GiB HBM per device" in verdict
    m = v5e_plan.memory
    assert (
        f"(plan estimate: forward {m.forward_peak / 2**30:.2f}, "
        f"forward+backward {m.train_peak / 2**30:.2f} GiB)" in verdict
    )


def test_memory_verdict_one_byte_over_fails(v5e_plan):
    over = _mem(8, 8, 0) | {"temp": 1}
    assert peak_bytes(over) == 16 * GIB + 1
    with pytest.raises(VerifyError, match="forward\\+backward does not fit tpu-v5e 2x2"):
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(1, 1, 1)},
                {"step": "compile forward+backward", "memory": over},
            ),
        )


def test_memory_verdict_too_large_names_figures_buffers_and_advice(v5e_plan):
    with pytest.raises(VerifyError) as caught:
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(6, 0.5, 11, 0.5)},  # 17 GiB
                {"step": "compile forward+backward", "memory": _mem(1, 1, 1)},
            ),
        )
    message = str(caught.value)
    assert message.startswith(
        "forward does not fit tpu-v5e 2x2: 17.00 GiB per device "
        "(arguments 6.00, outputs 0.50, temporaries 11.00) > 16.00 GiB HBM.\n"
    ), message
    assert "Largest buffers by the plan: " in message
    for item, size in v5e_plan.memory.ledger[:4]:
        assert f"{item} {size / 2**30:.2f} GiB" in message
    assert "To fit: " in message and "larger fsdp axis" in message


def test_memory_verdict_reports_the_compilers_out_of_memory(v5e_plan):
    oom = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
        "memory required for HLO temporaries (24.16G) exceeds available HBM (15.75G)."
    )
    with pytest.raises(VerifyError) as caught:
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(1, 1, 1)},
                {"step": "compile forward+backward", "oom": oom},
            ),
        )
    message = str(caught.value)
    assert message.startswith(
        f"forward+backward does not fit tpu-v5e 2x2; the TPU compiler says:\n  {oom}\n"
        "Largest buffers by the plan: "
    ), message
    assert "To fit: " in message


def test_memory_verdict_uses_the_slices_hbm(v5e_plan):
    """The same figures judged against another HBM size (as for another generation)."""
    report = _report(
        {"step": "compile forward", "memory": _mem(10, 1, 10)},
        {"step": "compile forward+backward", "memory": _mem(10, 10, 10)},
    )
    with pytest.raises(VerifyError):
        memory_verdict(v5e_plan, report)
    roomy = replace(v5e_plan, memory=replace(v5e_plan.memory, hbm_bytes_per_device=32 * GIB))
    assert memory_verdict(roomy, report).endswith(
        "forward 21.00 GiB, forward+backward 30.00 GiB of 32.00 GiB HBM per device"
        f" (plan estimate: forward {v5e_plan.memory.forward_peak / 2**30:.2f}, "
        f"forward+backward {v5e_plan.memory.train_peak / 2**30:.2f} GiB)"
    )


def test_memory_verdict_is_none_on_cpu():
    plan = make_plan(load_valid(REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"))
    assert plan.memory.hbm_bytes_per_device == 0
    report = _report({"step": "compile forward", "memory": _mem(1000, 1000, 1000)})
    assert memory_verdict(plan, report) is None


# ---------------------------------------------------------------------------------------
# 4. The TPU example specs


def test_there_are_tpu_example_specs():
    assert "mixtral_8x7b_v5e" in TPU_NAMES


@pytest.mark.parametrize("name", TPU_NAMES)
def test_tpu_example_is_fresh_without_compiling(name, invoke_main, monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("moegen check must not verify or compile")

    monkeypatch.setattr(moegen.verify, "_run_worker", no_compile)
    monkeypatch.setattr(moegen.pipeline, "verify", no_compile)
    result = invoke_main("check", f"specs/{name}.yaml", cwd=REPO_ROOT)
    assert result.code == 0, result.output
    assert result.stderr.strip() == "1 generated module(s) fresh", result.output
    assert result.stdout == ""


def test_mixtral_v5e_builds_through_the_cli_and_matches_the_committed_module(tmp_project):
    """The one full CLI build for a TPU target: twins, compiles, verdict, committed bytes."""
    name = "mixtral_8x7b_v5e"
    target = tmp_project / "generated" / f"{name}.py"
    target.unlink()
    others = snapshot(tmp_project / "generated")
    result = run_moegen("build", f"specs/{name}.yaml", cwd=tmp_project)
    err = result.stderr
    assert result.returncode == 0, err
    assert result.stdout == ""
    assert_no_traceback(err)
    for step in (
        "verify: import",
        "verify: twin parity (float32)",
        "verify: twin parity (bfloat16 compute, float32 params)",
    ):
        assert f"  {step} " in err, step
    for step in ("compile forward", "compile forward+backward"):
        assert re.search(
            rf"^  verify: {re.escape(step)}\s+\d+\.\d+ s  per device: args ", err, re.M
        )
    verdict = re.search(r"^  verify: memory verdict\s+\d+\.\d+ s  (.*)$", err, re.M)
    assert verdict, err
    assert re.match(
        r"fits: forward \d+\.\d\d GiB, forward\+backward \d+\.\d\d GiB of 16\.00 GiB HBM per "
        r"device \(plan estimate: forward \d+\.\d\d, forward\+backward \d+\.\d\d GiB\)$",
        verdict.group(1),
    ), verdict.group(1)
    assert err.rstrip().endswith(f"wrote generated/{name}.py")
    assert target.read_bytes() == (GENERATED_DIR / f"{name}.py").read_bytes()
    assert snapshot(tmp_project / "generated") == others | {f"{name}.py": target.read_bytes()}


# ---------------------------------------------------------------------------------------
# 5. Without libtpu: a clear message, not a crash

NO_LIBTPU_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys, types

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "libtpu" or name.startswith("libtpu."):
            return None  # as on a machine without moegen[tpu]
        return real_find_spec(name, *args, **kwargs)

    importlib.util.find_spec = find_spec

    from moegen.verify import worker

    tpu = json.loads(sys.argv[2])
    try:
        worker.target_devices(types.SimpleNamespace(NUM_DEVICES=4), tpu)
    except worker.CheckFailed as err:
        print(json.dumps({"target_devices": str(err)}), flush=True)
    else:
        print(json.dumps({"target_devices": None}), flush=True)
    sys.exit(worker.main(sys.argv[1]))  # the whole worker on a job without twins
    """
)


def test_missing_libtpu_says_to_install_the_tpu_extra(tmp_path):
    generated = generate(write_spec(tmp_path, "no_libtpu", pallas_yaml()))
    plan = generated.plan
    module = tmp_path / "no_libtpu.py"
    module.write_text(generated.source, encoding="utf-8")
    tpu = {"topology_name": plan.tpu_topology_name, "chips_per_host_bounds": [2, 2, 1]}
    assert plan.tpu_topology_name == "v5e:2x2" and plan.chips_per_host_bounds == (2, 2, 1)
    job = {
        "module": str(module),
        "twins": [],
        "router": {"top_k": plan.top_k, "score": plan.score, "renormalize": plan.renormalize},
        "tpu": tpu,
    }
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    script = tmp_path / "no_libtpu_worker.py"
    script.write_text(NO_LIBTPU_SCRIPT, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, str(script), str(job_path), json.dumps(tpu)],
        env=fake_cpu_env(plan.num_devices),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    direct = events[0]["target_devices"]
    assert direct is not None, "target_devices found TPU devices without libtpu"
    pin = next(
        dep
        for dep in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["tpu"]
        if dep.startswith("libtpu")
    )
    assert "compiling for TPU needs libtpu" in direct
    assert "pip install 'moegen[tpu]'" in direct and pin in direct, direct

    # The worker reports it as its one error (what `moegen build` shows), after the import.
    assert result.returncode == 1, result.stdout + result.stderr[-4000:]
    assert [e["step"] for e in events if "step" in e] == ["import"]
    assert events[-1] == {"error": direct}
    assert_no_traceback(result.stdout)


# ---------------------------------------------------------------------------------------
# The slice catalogue, and libtpu shared between processes

TOPOLOGY_SCRIPT = textwrap.dedent(
    """
    import json
    from jax.experimental import topologies
    from moegen.hardware import CATALOGUE

    found = {}
    for name, chip in CATALOGUE.items():
        if chip.platform != "tpu":
            continue
        for topology in chip.topologies:
            devices = topologies.get_topology_desc(
                platform="tpu",
                topology_name=f"{chip.topology_prefix}:{topology}",
                chip_config_name="default",
                chips_per_host_bounds=chip.chips_per_host_bounds(topology),
                num_slices=1,
            ).devices
            found[f"{name} {topology}"] = len(devices)
    print(json.dumps(found), flush=True)
    """
)


def test_every_catalogue_slice_has_the_devices_the_rules_assume():
    """libtpu's compile-only devices for every (generation, topology) a spec may name."""
    result = subprocess.run(
        [sys.executable, "-c", TOPOLOGY_SCRIPT],
        env=fake_cpu_env(1),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found = last_json(result.stdout)
    expected = {
        f"{name} {topology}": chip.devices(topology)
        for name, chip in CATALOGUE.items()
        if chip.platform == "tpu"
        for topology in chip.topologies
    }
    assert found == expected


LOCK_HOLDER = textwrap.dedent(
    """
    import sys
    from jax.experimental import topologies

    topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x2", chip_config_name="default",
        chips_per_host_bounds=(2, 2, 1), num_slices=1,
    )
    print("ready", flush=True)
    sys.stdin.read()  # hold libtpu (and its lockfile) until the test is done
    """
)


def _hold_libtpu(env: dict[str, str]) -> subprocess.Popen[str] | None:
    """A process that holds libtpu as another verification would, or None when another
    process already holds it (this test process, or a build elsewhere on the machine):
    the situation under test holds either way."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    if holder.stdout.readline().strip() == "ready":
        return holder
    holder.stdin.close()
    holder.wait(timeout=60)
    return None


def test_concurrent_tpu_verifications_do_not_collide(tmp_path, monkeypatch):
    """Another process holding libtpu (another `moegen build`, a parallel test run) must not
    make a compile-only verification fail: libtpu takes the exclusive /tmp/libtpu_lockfile
    unless ALLOW_MULTIPLE_LIBTPU_LOAD=1, and compile-only devices need no exclusive hold."""
    monkeypatch.delenv("ALLOW_MULTIPLE_LIBTPU_LOAD", raising=False)  # moegen must set it
    monkeypatch.chdir(tmp_path)
    generated = generate(write_spec(tmp_path, "concurrent", pallas_yaml()).relative_to(tmp_path))
    monkeypatch.setattr(moegen.verify, "_twins", lambda loaded: [])  # the compile collides
    env = fake_cpu_env(1)
    env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
    holder = _hold_libtpu(env)
    try:
        report = verify(generated.loaded, generated.source, timeout_s=300)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=60)
    assert report.step("memory verdict")["verdict"].startswith("fits")
