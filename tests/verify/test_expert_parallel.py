"""Expert parallelism end to end: twin parity of both strategies, the receive buffer at run time, and the pallas overlap twin.

Twin parity runs moegen.verify.verify on small cpu-target specs (forward, aux and gradients
within 1e-5 in float32, on random routing and with starved experts, then full-size cpu
compiles). aux.received_rows is read from a generated module run in a child process with
fake CPU devices, also under a router that sends every token to one device (the certified
worst case, exactly RECEIVE_ROWS).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from expert_parallel_cases import Case

from moegen.plan import make_plan
from moegen.render import render
from moegen.sizes import axes_product
from moegen.verify import verify
from moegen.verify.twin import TWIN_SEQ_LEN, TWIN_SEQUENCES_PER_SHARD, twin_of

# --------------------------------------------------------------------------------------
# Twin parity through moegen.verify.
# --------------------------------------------------------------------------------------

VERIFY_CASES = {
    "a2a-data2xexpert4-top2-softmax": Case("ragged_all_to_all", {"data": 2, "expert": 4}),
    "a2a-expert4-top3-sigmoid": Case(
        "ragged_all_to_all", {"expert": 4}, top_k=3, score="sigmoid", renormalize=False
    ),
    "a2a-expert8-top1-softmax": Case(
        "ragged_all_to_all", {"expert": 8}, top_k=1, renormalize=False
    ),
    "ring-fsdp2xexpert4-top1-sigmoid": Case(
        "ring_of_experts", {"fsdp": 2, "expert": 4}, top_k=1, score="sigmoid", renormalize=False
    ),
    "ring-data2xexpert4-top3-softmax": Case(
        "ring_of_experts", {"data": 2, "expert": 4}, experts=16, top_k=3
    ),
    "ring-overlap4-fsdp2xexpert4-top2-sigmoid": Case(
        "ring_of_experts", {"fsdp": 2, "expert": 4}, score="sigmoid", chunks=4
    ),
    # whole 128-lane FFN width, no fsdp: gate and up as one grouped matmul (w_gate_up)
    "ring-overlap2-expert4-top2-gate-up-side-by-side": Case(
        "ring_of_experts", {"expert": 4}, chunks=2, ffn=128
    ),
    "a2a-data2xexpert4-top2-gate-up-side-by-side": Case(
        "ragged_all_to_all", {"data": 2, "expert": 4}, ffn=128
    ),
}


@pytest.mark.parametrize("name", list(VERIFY_CASES))
@pytest.mark.slow
def test_twin_parity_forward_and_gradients(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    case = VERIFY_CASES[name]
    loaded = case.load(name.replace("-", "_"))
    plan = make_plan(loaded)
    assert plan.experts.strategy == case.strategy and plan.mesh.expert_axis == "expert"
    assert plan.ffn.fuses_gate_up is (case.ffn % 128 == 0 and "fsdp" not in case.axes)
    report = verify(loaded, render(plan))
    names = [step["step"] for step in report.steps]
    assert names == [
        "import",
        "twin parity (float32)",
        "compile forward",
        "compile forward+backward",
    ]

    twin = make_plan(twin_of(loaded))
    assert twin.experts.strategy == case.strategy
    assert twin.experts.overlap_chunks == case.chunks
    assert (twin.router.top_k, twin.router.score, twin.local_experts) == (
        case.top_k,
        case.score,
        plan.local_experts,
    )
    twin_tokens = axes_product(case.axes, case.axes) * TWIN_SEQUENCES_PER_SHARD * TWIN_SEQ_LEN
    parity = report.step("twin parity (float32)")
    cases = {c["case"]: c for c in parity["cases"]}
    assert set(cases) == {"random routing", "starved experts"}
    for result in cases.values():
        assert result["max_relative_error"] < 1e-5, result
        assert sum(result["tokens_per_expert"]) == twin_tokens * case.top_k  # dropless
    starved = cases["starved experts"]
    assert starved["starved_experts"]
    assert all(starved["tokens_per_expert"][e] == 0 for e in starved["starved_experts"])


# --------------------------------------------------------------------------------------
# aux.received_rows at run time.
# --------------------------------------------------------------------------------------

RECEIVED = textwrap.dedent(
    """
    import functools, importlib.util, json, sys
    import jax, jax.numpy as jnp, numpy as np
    from moegen.verify.reference.layer import RouterConfig, dense_moe

    spec = importlib.util.spec_from_file_location("layer", sys.argv[1])
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    mesh = m.make_mesh(jax.devices()[: m.NUM_DEVICES])
    cfg = RouterConfig(top_k=m.TOP_K, score="softmax", renormalize=True)
    layer = jax.jit(functools.partial(m.moe_layer, mesh=mesh))
    axes = dict(zip(m.MESH_AXES, m.MESH_SHAPE))
    groups = m.NUM_DEVICES // m.EXPERT_SHARDS

    def expected_received(params, x):
        # Devices hold batch blocks in row-major (data, expert) order; a data row is a group.
        tokens = x.reshape(m.NUM_DEVICES, m.LOCAL_TOKENS, m.EMBED_DIM)
        logits = tokens @ params["router"]
        top = np.argsort(-logits, axis=-1, kind="stable")[..., : m.TOP_K]  # softmax is monotone
        device_of_expert = top // m.LOCAL_EXPERTS
        counts = np.zeros((groups, m.EXPERT_SHARDS), np.int64)
        for sender in range(m.NUM_DEVICES):
            for receiver in device_of_expert[sender].reshape(-1):
                counts[sender // m.EXPERT_SHARDS, receiver] += 1
        return int(counts.max())

    rng = np.random.default_rng(0)
    results = {}
    for case in ("random", "all to device 0"):
        params = {
            name: rng.normal(0.0, m.INIT_SCALES[name], shape).astype(np.float32)
            for name, shape in m.PARAM_SHAPES.items()
        }
        x = rng.normal(0.0, 1.0, m.INPUT_SHAPE).astype(np.float32)
        if case == "all to device 0":
            # positive tokens; experts 0 and 1 (device 0's) win; the third pick varies
            x = np.abs(x) + 0.1
            router = 0.1 * np.abs(params["router"])
            router[:, :2] += 1.0
            params["router"] = router
        placed = {
            k: jax.device_put(v, jax.sharding.NamedSharding(mesh, m.PARAM_SPECS[k]))
            for k, v in params.items()
        }
        y, aux = layer(placed, jax.device_put(x, m.input_sharding(mesh)))
        want = np.asarray(dense_moe(params, x, cfg)[0])
        results[case] = {
            "received_rows": int(aux.received_rows),
            "expected": expected_received(params, x),
            "relative_error": float(np.linalg.norm(np.asarray(y) - want) / np.linalg.norm(want)),
            "tokens_per_expert": np.asarray(aux.tokens_per_expert).tolist(),
        }
    print(json.dumps({"RECEIVE_ROWS": m.RECEIVE_ROWS, "results": results}))
    """
)


@pytest.mark.slow
def test_received_rows_stays_within_receive_rows_and_reaches_it(tmp_path: Path) -> None:
    case = Case("ragged_all_to_all", {"data": 2, "expert": 4}, top_k=3, embed=16, ffn=8, seq_len=3)
    plan = make_plan(case.load("a2a_received"))
    # 3 tokens per device, 12 per expert group, at most min(3, 2) copies each to one device.
    assert (plan.local_tokens, plan.experts.group_tokens) == (3, 12)
    assert plan.experts.receive_rows == 24
    module = tmp_path / "a2a_received.py"
    module.write_text(render(plan), encoding="utf-8")
    script = tmp_path / "received.py"
    script.write_text(RECEIVED, encoding="utf-8")
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(module)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["RECEIVE_ROWS"] == 24
    for name, got in out["results"].items():
        assert 0 < got["received_rows"] <= 24, (name, got)
        assert got["received_rows"] == got["expected"], (name, got)
        assert got["relative_error"] < 1e-5, (name, got)
        assert sum(got["tokens_per_expert"]) == 8 * 3 * 3
    worst = out["results"]["all to device 0"]
    assert worst["received_rows"] == 24  # the certified buffer exactly full, nothing dropped
    assert worst["tokens_per_expert"][:2] == [24, 24]


# --------------------------------------------------------------------------------------
# The pallas overlap path (interpreted twin).
# --------------------------------------------------------------------------------------

PALLAS_PARITY = textwrap.dedent(
    """
    import json, sys
    import jax
    from moegen.verify.reference import parity
    from moegen.verify.worker import child as worker
    from moegen.verify.reference.layer import RouterConfig

    m = worker.import_module(sys.argv[1], "twin")
    cfg = RouterConfig(top_k=m.TOP_K, score="softmax", renormalize=True)
    params, x, cotangent = parity.random_case(m, 0)
    result = parity.check_parity(m, cfg, params, x, cotangent, 1e-5, "random routing")
    print(json.dumps({"max_relative_error": result.max_relative_error}))
    """
)


@pytest.mark.parametrize("chunks", [2, 1])
@pytest.mark.slow
def test_pallas_ring_twin_matches_the_dense_reference_with_gradients(
    chunks: int, tmp_path: Path
) -> None:
    """The ring through megablox (interpreted), forward, aux and every gradient.

    Overlapped (2 chunks): the chunks' gate/up partial sums must add up. Both: megablox leaves
    the rows past the groups unwritten (NaN in interpret mode, stale memory on a TPU), also in
    the input gradient it returns; a row gathered from the tokens must not carry that back.
    """
    case = Case(
        "ring_of_experts",
        {"expert": 4},
        chunks=chunks,
        embed=512,
        ffn=256,
        batch=4,
        seq_len=128,
        hardware="tpu-v5e",
        topology="2x2",
        kernel="pallas",
    )
    twin = make_plan(twin_of(case.load("ring_pallas_overlap")), interpret=True)
    assert twin.kernel.config.interpret and twin.experts.overlap_chunks == chunks
    assert twin.experts.ffn_calls == (4 if chunks > 1 else 1)
    module = tmp_path / "twin.py"
    module.write_text(render(twin), encoding="utf-8")
    script = tmp_path / "parity.py"
    script.write_text(PALLAS_PARITY, encoding="utf-8")
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    result = subprocess.run(
        [sys.executable, str(script), str(module)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    error = json.loads(result.stdout.strip().splitlines()[-1])["max_relative_error"]
    assert error < 1e-5, error


def test_module_doc_does_not_call_expert_sharded_weights_replicated() -> None:
    plan = make_plan(Case("ragged_all_to_all", {"expert": 4}).load())
    assert {p.name: p.partition[0] for p in plan.params}["w_gate"] == "expert"
    doc = ast.get_docstring(ast.parse(render(plan))) or ""
    assert "Experts are sharded over the expert axis" in doc
    assert "replicated on every device" not in doc, doc
