"""Expert parallelism end to end: twin parity of both strategies, the receive buffer at run
time, and the plan's partitions, row counts and communication estimates.

Twin parity runs moegen.verify.verify on small cpu-target specs (forward, aux and gradients
within 1e-5 in float32, on random routing and with starved experts, then full-size cpu
compiles). aux.received_rows is read from a generated module run in a child process with
fake CPU devices, also under a router that sends every token to one device (the certified
worst case, exactly RECEIVE_ROWS).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.plan import Plan, make_plan
from moegen.render import render
from moegen.sizes import axes_product
from moegen.validate import validate
from moegen.verify import verify
from moegen.verify.twin import TWIN_SEQ_LEN, TWIN_SEQUENCES_PER_SHARD, twin_of

BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Case:
    strategy: str
    axes: dict[str, int]
    experts: int = 8
    top_k: int = 2
    score: str = "softmax"
    renormalize: bool = True
    chunks: int = 1
    embed: int = 32
    ffn: int = 16
    batch: int = 8
    seq_len: int = 4
    params: str = "float32"
    compute: str = "float32"
    hardware: str = "cpu"
    topology: str | None = None
    kernel: str = "xla"

    def text(self) -> str:
        mesh = "\n".join(f"    {name}: {size}" for name, size in self.axes.items())
        target = f"  hardware: {self.hardware}\n"
        if self.topology:
            target += f"  topology: {self.topology}\n"
        target += f"  kernel: {self.kernel}\n"
        return f"""\
version: 1
description: expert parallel test
layer:
  num_experts: {self.experts}
  embed_dim: {self.embed}
  ffn_dim: {self.ffn}
router:
  top_k: {self.top_k}
  score: {self.score}
  renormalize: {"true" if self.renormalize else "false"}
shapes:
  batch: {self.batch}
  seq_len: {self.seq_len}
dtypes:
  params: {self.params}
  compute: {self.compute}
mesh:
  axes:
{mesh}
parallelism:
  experts: {self.strategy}
  overlap_chunks: {self.chunks}
target:
{target}"""

    def load(self, name: str = "ep_case") -> LoadedSpec:
        return validate(load_spec_bytes(self.text().encode(), f"specs/{name}.yaml", name))


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
def test_twin_parity_forward_and_gradients(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    case = VERIFY_CASES[name]
    loaded = case.load(name.replace("-", "_"))
    plan = make_plan(loaded)
    assert plan.expert_strategy == case.strategy and plan.expert_axis == "expert"
    assert plan.fuses_gate_up is (case.ffn % 128 == 0 and "fsdp" not in case.axes)
    report = verify(loaded, render(plan))
    names = [step["step"] for step in report.steps]
    assert names == [
        "import",
        "twin parity (float32)",
        "compile forward",
        "compile forward+backward",
    ]

    twin = make_plan(twin_of(loaded))
    assert twin.expert_strategy == case.strategy
    assert twin.experts.overlap_chunks == case.chunks
    assert (twin.top_k, twin.score, twin.local_experts) == (
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
    from moegen.verify.reference import RouterConfig, dense_moe

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

PALLAS_FORWARD = textwrap.dedent(
    """
    import functools, json, sys
    import jax
    from moegen.verify import worker
    from moegen.verify.reference import RouterConfig, dense_moe

    m = worker.import_module(sys.argv[1], "twin")
    cfg = RouterConfig(top_k=m.TOP_K, score="softmax", renormalize=True)
    params, x, _ = worker._random_case(m, 0)
    mesh = m.make_mesh(jax.devices()[: m.NUM_DEVICES])
    placed, placed_x = worker._place(m, mesh, params, x)
    y, _ = jax.jit(functools.partial(m.moe_layer, mesh=mesh))(placed, placed_x)
    print(json.dumps({"relative_error": worker.relative_error(y, dense_moe(params, x, cfg)[0])}))
    """
)


def test_pallas_overlap_twin_forward_matches_the_dense_reference(tmp_path: Path) -> None:
    """Chunked gate/up partial sums through megablox (interpreted): the chunks must add up.

    megablox.gmm's existing_out keeps the rows a call does not write but overwrites the rows
    it does, so passing the running sum as existing_out would keep only the last chunk.
    """
    case = Case(
        "ring_of_experts",
        {"expert": 4},
        chunks=2,
        embed=512,
        ffn=256,
        batch=4,
        seq_len=128,
        compute="bfloat16",
        hardware="tpu-v5e",
        topology="2x2",
        kernel="pallas",
    )
    twin = make_plan(twin_of(case.load("ring_pallas_overlap")), interpret=True)
    assert twin.kernel_interpret and twin.experts.overlap_chunks == 2
    assert twin.experts.ffn_calls == 4
    module = tmp_path / "twin.py"
    module.write_text(render(twin), encoding="utf-8")
    script = tmp_path / "forward.py"
    script.write_text(PALLAS_FORWARD, encoding="utf-8")
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
    assert result.returncode == 0, result.stdout + result.stderr
    error = json.loads(result.stdout.strip().splitlines()[-1])["relative_error"]
    assert error < 1e-5, error


def test_module_doc_does_not_call_expert_sharded_weights_replicated() -> None:
    plan = make_plan(Case("ragged_all_to_all", {"expert": 4}).load())
    assert {p.name: p.partition[0] for p in plan.params}["w_gate"] == "expert"
    doc = ast.get_docstring(ast.parse(render(plan))) or ""
    assert "Experts are sharded over the expert axis" in doc
    assert "replicated on every device" not in doc, doc


# --------------------------------------------------------------------------------------
# The plan.
# --------------------------------------------------------------------------------------

MESHES = {
    "fsdp2xexpert4": {"fsdp": 2, "expert": 4},
    "expert4": {"expert": 4},
    "data2xexpert4": {"data": 2, "expert": 4},
    "expert8": {"expert": 8},
}


@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
@pytest.mark.parametrize("mesh", list(MESHES))
def test_param_partitions_and_local_shapes(mesh: str, strategy: str) -> None:
    axes = MESHES[mesh]
    e, d, f = 16, 64, 48
    plan = make_plan(Case(strategy, axes, experts=e, embed=d, ffn=f).load())
    fsdp = "fsdp" if "fsdp" in axes else None
    n, shards = axes.get("fsdp", 1), axes["expert"]
    params = {p.name: p for p in plan.params}
    assert params["router"].partition == (fsdp, None)
    assert params["w_gate"].partition == ("expert", fsdp, None)
    assert params["w_up"].partition == ("expert", fsdp, None)
    assert params["w_down"].partition == ("expert", None, fsdp)
    assert params["router"].local_shape == (d // n, e)
    assert params["w_gate"].local_shape == (e // shards, d // n, f)
    assert params["w_up"].local_shape == (e // shards, d // n, f)
    assert params["w_down"].local_shape == (e // shards, f, d // n)
    assert [p.shape for p in plan.params] == [(d, e), (e, d, f), (e, d, f), (e, f, d)]
    gather = {"router": 0, "w_gate": 1, "w_up": 1, "w_down": 2}
    for name, p in params.items():
        assert p.gather_axis == (gather[name] if fsdp else None)
    assert plan.local_experts == e // shards
    assert plan.expert_axis == "expert" and plan.experts.shards == shards
    # Stored bytes: only this device's experts, fsdp-sharded.
    stored = sum(math.prod(p.local_shape) for p in plan.params) * 4
    assert plan.cost.param_bytes == stored
    source = render(plan)
    assert '"w_gate": P("expert", ' in source
    assert f"LOCAL_EXPERTS = {e // shards}" in source


def test_replicated_strategy_shards_no_experts() -> None:
    plan = make_plan(Case("replicated", {"fsdp": 2, "data": 2}).load())
    params = {p.name: p for p in plan.params}
    assert params["w_gate"].partition == (None, "fsdp", None)
    assert params["w_gate"].local_shape[0] == plan.num_experts
    assert plan.expert_axis is None and plan.experts.axis is None
    assert plan.experts.ffn_rows == plan.local_tokens * plan.top_k
    assert (plan.experts.ffn_calls, plan.experts.receive_rows) == (1, 0)
    assert plan.experts.communication_bytes == ()
    assert not plan.experts.emulate_ragged_all_to_all


# (experts, top_k, mesh, batch, seq_len)
ROW_SHAPES = [
    (8, 2, "expert4", 8, 16),
    (8, 3, "data2xexpert4", 8, 5),  # top_k > local experts
    (16, 1, "fsdp2xexpert4", 16, 8),
    (64, 8, "expert8", 8, 32),
    (8, 8, "expert8", 8, 4),  # one expert per device: min(8, 1)
]


@pytest.mark.parametrize("shape", ROW_SHAPES, ids=lambda s: f"E{s[0]}-K{s[1]}-{s[2]}")
def test_rows_and_calls_per_strategy(shape) -> None:
    experts, top_k, mesh, batch, seq_len = shape
    axes = MESHES[mesh]
    shards = axes["expert"]
    local = experts // shards
    renorm = top_k > 1
    common = dict(experts=experts, top_k=top_k, renormalize=renorm, batch=batch, seq_len=seq_len)
    a2a = make_plan(Case("ragged_all_to_all", axes, **common).load())
    ring = make_plan(Case("ring_of_experts", axes, **common).load())
    overlap = make_plan(Case("ring_of_experts", axes, chunks=4, **common).load())
    devices = math.prod(axes.values())
    local_tokens = batch // devices * seq_len
    group = local_tokens * shards
    per_token = min(top_k, local)
    for plan in (a2a, ring, overlap):
        assert plan.local_tokens == local_tokens
        assert plan.routed_rows == local_tokens * top_k
        assert plan.experts.group_tokens == group
        assert plan.experts.local_experts == local and plan.experts.shards == shards
    assert (a2a.experts.ffn_rows, a2a.experts.ffn_calls, a2a.experts.receive_rows) == (
        group * per_token,
        1,
        group * per_token,
    )
    assert (ring.experts.ffn_rows, ring.experts.ffn_calls, ring.experts.receive_rows) == (
        group * per_token,
        1,
        0,
    )
    assert (overlap.experts.ffn_rows, overlap.experts.ffn_calls) == (
        local_tokens * per_token,
        shards,
    )
    assert overlap.experts.receive_rows == 0
    assert (overlap.experts.overlap_chunks, overlap.experts.chunk_width) == (4, 32 // 4)
    # kernel xla: nothing padded
    assert a2a.padded_rows == a2a.experts.ffn_rows and ring.padded_rows == ring.experts.ffn_rows
    src = render(a2a)
    assert f"RECEIVE_ROWS = {group * per_token}" in src
    assert f"FFN_ROWS = {group * per_token}" in src
    assert "RECEIVE_ROWS" not in render(ring)


def ragged_bytes(b: int, t: int, k: int, d: int, p: int) -> int:
    return 2 * b * t * k * d * (p - 1) // p


def ring_bytes(b: int, t: int, d: int, p: int) -> int:
    return (b + 4) * t * d * (p - 1)


@pytest.mark.parametrize("compute", ["float32", "bfloat16"])
@pytest.mark.parametrize("mesh", ["fsdp2xexpert4", "expert8", "data2xexpert4"])
@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
def test_communication_bytes(strategy: str, mesh: str, compute: str) -> None:
    axes = MESHES[mesh]
    case = Case(
        strategy, axes, experts=16, top_k=4, embed=256, ffn=64, batch=16, seq_len=64,
        params="float32", compute=compute,
    )  # fmt: skip
    plan = make_plan(case.load())
    b, p = BYTES[compute], axes["expert"]
    t, k, d = plan.local_tokens, 4, 256
    assert 2 * b * t * k * d * (p - 1) % p == 0  # the formula is exact for these shapes
    want = {
        "ragged_all_to_all": ragged_bytes(b, t, k, d, p),
        "ring_of_experts": ring_bytes(b, t, d, p),
    }
    comm = plan.experts.communication_bytes
    assert dict(comm) == want
    assert comm[0][0] == strategy  # the chosen strategy first
    assert [name for name, _ in comm] == [strategy] + [n for n in want if n != strategy]


def test_emulation_only_where_the_collective_is_missing() -> None:
    tpu = Case(
        "ragged_all_to_all", {"fsdp": 2, "expert": 4}, embed=512, ffn=256, batch=8,
        seq_len=128, compute="bfloat16", hardware="tpu-v5e", topology="2x4", kernel="pallas",
    )  # fmt: skip
    loaded = tpu.load()
    assert not make_plan(loaded).experts.emulate_ragged_all_to_all
    assert make_plan(loaded, interpret=True).experts.emulate_ragged_all_to_all
    assert make_plan(
        Case("ragged_all_to_all", {"expert": 4}).load()
    ).experts.emulate_ragged_all_to_all
    ring = make_plan(Case("ring_of_experts", {"expert": 4}).load(), interpret=True)
    assert not ring.experts.emulate_ragged_all_to_all


def _size_text(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@pytest.mark.parametrize("strategy", ["ragged_all_to_all", "ring_of_experts"])
def test_moegen_plan_shows_the_comm_forward_lines(
    strategy: str, tmp_path: Path, invoke_main
) -> None:
    case = Case(
        strategy, {"fsdp": 2, "expert": 4}, experts=8, top_k=2, embed=4096, ffn=14336,
        batch=8, seq_len=4096, params="float32", compute="bfloat16", hardware="tpu-v5e",
        topology="2x4", kernel="pallas", chunks=4 if strategy == "ring_of_experts" else 1,
    )  # fmt: skip
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "ep_plan.yaml").write_text(case.text(), encoding="utf-8")
    result = invoke_main("plan", "specs/ep_plan.yaml", cwd=tmp_path)
    assert result.code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.strip().startswith("comm forward")]
    assert len(lines) == 2, result.stdout
    b, t, d, p = 2, 4096, 4096, 4
    ragged, ring = ragged_bytes(b, t, 2, d, p), ring_bytes(b, t, d, p)
    assert (ragged, ring) == (100_663_296, 301_989_888)  # 0.094 GiB and 0.281 GiB
    texts = {
        "ragged_all_to_all": f"ragged_all_to_all  {_size_text(ragged)} per device",
        "ring_of_experts": f"ring_of_experts    {_size_text(ring)} per device",
    }
    other = next(name for name in texts if name != strategy)
    assert lines[0].split() == ["comm", "forward", *texts[strategy].split(), "(chosen)"]
    assert lines[1].split() == ["comm", "forward", *texts[other].split()]
    assert texts[strategy] in lines[0] and texts[other] in lines[1]
    out = result.stdout
    plan = make_plan(case.load())
    if strategy == "ragged_all_to_all":
        assert f"receive buffer  {plan.experts.receive_rows} rows" in out
        assert "overlap" not in out
    else:
        assert f"expert FFN rows {plan.experts.ffn_rows} x 4 ring steps per device" in out
        assert "overlap         4 chunks of 1024 columns" in out
        assert "receive buffer" not in out


def test_plan_of_a_ring_overlap_spec_uses_chunk_wide_gate_up_tiles() -> None:
    plan: Plan = make_plan(
        Case(
            "ring_of_experts", {"fsdp": 2, "expert": 4}, experts=16, embed=1024, ffn=1024,
            batch=8, seq_len=512, compute="bfloat16", hardware="tpu-v5e", topology="2x4",
            kernel="pallas", chunks=4,
        ).load()
    )  # fmt: skip
    assert plan.experts.chunk_width == 256
    assert plan.gate_up_tile is not None and plan.down_tile is not None
    # gate/up contract over one chunk of the embedding; down over the whole ffn dimension.
    assert plan.gate_up_tile[1] <= 256
    assert plan.padded_rows % plan.row_alignment == 0
    assert plan.padded_rows >= plan.experts.ffn_rows
