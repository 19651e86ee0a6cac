"""The ragged all-to-all exchange of expert parallelism against an independent numpy model.

The model is written from jax.lax.ragged_all_to_all's docstring alone: sender i writes
operand_i[input_offsets_i[j] : input_offsets_i[j] + send_sizes_i[j]] into receiver j's output
at output_offsets_i[j]; the output keeps its values everywhere else. MoE dispatch is modelled
copy by copy: a device receives, sender by sender, the copies routed to its experts in the
sender's (expert, copy) order; grouped by local expert for the FFN; results go back to the
sender's sorted position.

The generated module's _exchange_plan, _ragged_all_to_all (the all_gather emulation used on
XLA:CPU, which lacks the op), _received_expert_ids and _routed_experts (with a fake expert
FFN) run inside jax.shard_map over the expert axis on fake CPU devices, in a child process
(JAX fixes its device count at start-up), on hand-made routings including the adversarial
ones: all copies to one expert, a device that receives nothing, a device that sends nothing,
every device sending everything to one device (the certified RECEIVE_ROWS exactly reached).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify.twin import twin_of

REPO_ROOT = Path(__file__).resolve().parent.parent
WIDTH = 4  # columns of the hand-made rows (= embed_dim of the rendered modules)


def spec_text(
    *,
    experts: int,
    top_k: int,
    axes: dict[str, int],
    batch: int,
    seq_len: int,
    embed: int = 4,
    ffn: int = 8,
) -> str:
    mesh = "\n".join(f"    {name}: {size}" for name, size in axes.items())
    return f"""\
version: 1
description: ragged all-to-all test
layer:
  num_experts: {experts}
  embed_dim: {embed}
  ffn_dim: {ffn}
router:
  top_k: {top_k}
  score: softmax
  renormalize: {"true" if top_k > 1 else "false"}
shapes:
  batch: {batch}
  seq_len: {seq_len}
dtypes:
  params: float32
  compute: float32
mesh:
  axes:
{mesh}
parallelism:
  experts: ragged_all_to_all
target:
  hardware: cpu
  kernel: xla
"""


def load(text: str, name: str = "a2a_case") -> LoadedSpec:
    return validate(load_spec_bytes(text.encode(), f"specs/{name}.yaml", name))


# --------------------------------------------------------------------------------------
# The numpy model.
# --------------------------------------------------------------------------------------


def np_ragged_all_to_all(
    operands: np.ndarray,  # [senders, rows, ...]
    outputs: np.ndarray,  # [receivers, rows, ...]
    input_offsets: np.ndarray,  # [sender, receiver]
    send_sizes: np.ndarray,
    output_offsets: np.ndarray,  # [sender, receiver]: where in the receiver's output
    recv_sizes: np.ndarray,  # [receiver, sender]
) -> np.ndarray:
    """jax.lax.ragged_all_to_all as its docstring states it, over every device at once."""
    devices = operands.shape[0]
    # The docstring's precondition: send_sizes == all_to_all(recv_sizes).
    assert np.array_equal(send_sizes, recv_sizes.T), (send_sizes, recv_sizes)
    result = outputs.copy()
    for sender in range(devices):
        for receiver in range(devices):
            size = int(send_sizes[sender, receiver])
            if size == 0:
                continue
            src = int(input_offsets[sender, receiver])
            dst = int(output_offsets[sender, receiver])
            assert src + size <= operands.shape[1] and dst + size <= outputs.shape[1]
            result[receiver, dst : dst + size] = operands[sender, src : src + size]
    return result


def np_exchange_plan(counts: np.ndarray) -> dict[str, np.ndarray]:
    """Offsets and sizes from counts[sender, receiver, local expert], written as loops.

    Each sender's rows are sorted by expert, hence by receiver; each receiver stores the
    blocks of its senders in sender order.
    """
    devices = counts.shape[0]
    sizes = counts.sum(axis=2)  # [sender, receiver]
    start_in_sender = np.zeros_like(sizes)
    start_in_receiver = np.zeros_like(sizes)
    for s in range(devices):
        for r in range(devices):
            start_in_sender[s, r] = sum(sizes[s, q] for q in range(r))
            start_in_receiver[s, r] = sum(sizes[q, r] for q in range(s))
    return {
        # per device d (first index): its view
        "input_offsets": start_in_sender,
        "send_sizes": sizes,
        "output_offsets": start_in_receiver,
        "recv_sizes": sizes.T,
        "recv_offsets": start_in_receiver.T,
        "return_offsets": start_in_sender.T,
        "recv_counts": counts.transpose(1, 0, 2),  # [receiver, sender, local expert]
    }


@dataclass
class Dispatch:
    counts: np.ndarray  # [sender, receiver, local expert]
    sorted_rows: np.ndarray  # [sender, routed rows, W]: each sender's copies by (expert, copy)
    received: list[np.ndarray]  # per receiver: the rows it must receive, in buffer order
    received_experts: list[list[int]]  # per receiver: local expert of each received row
    grouped: list[np.ndarray]  # per receiver: received rows grouped by local expert
    group_sizes: np.ndarray  # [receiver, local expert]
    y: np.ndarray  # [sender, tokens, W]: with expert e's FFN being "multiply by e + 1"


def np_dispatch(
    ids: np.ndarray, tokens: np.ndarray, weights: np.ndarray, local_experts: int
) -> Dispatch:
    """Copy-by-copy MoE dispatch: ids, weights [devices, tokens, K]; tokens [devices, T, W]."""
    devices, num_tokens, top_k = ids.shape
    copies = []  # per sender: (expert, flat copy index, token), in the sender's sorted order
    for s in range(devices):
        mine = [
            (int(ids[s, t, k]), t * top_k + k, t) for t in range(num_tokens) for k in range(top_k)
        ]
        copies.append(sorted(mine))
    counts = np.zeros((devices, devices, local_experts), np.int64)
    for s in range(devices):
        for e, _, _ in copies[s]:
            counts[s, e // local_experts, e % local_experts] += 1
    sorted_rows = np.stack(
        [np.stack([tokens[s, t] for _, _, t in copies[s]]) for s in range(devices)]
    )
    received, received_experts, grouped = [], [], []
    width = tokens.shape[2]
    for r in range(devices):
        mine = [
            (s, e, t) for s in range(devices) for e, _, t in copies[s] if e // local_experts == r
        ]
        received.append(np.array([tokens[s, t] for s, _, t in mine]).reshape(-1, width))
        received_experts.append([e - r * local_experts for _, e, _ in mine])
        by_expert = sorted(mine, key=lambda c: c[1])  # stable: sender order within an expert
        grouped.append(np.array([tokens[s, t] for s, _, t in by_expert]).reshape(-1, width))
    y = np.zeros(tokens.shape, np.float64)
    for s in range(devices):
        for t in range(num_tokens):
            for k in range(top_k):
                y[s, t] += weights[s, t, k] * tokens[s, t] * (ids[s, t, k] + 1)
    return Dispatch(counts, sorted_rows, received, received_experts, grouped, counts.sum(0), y)


def max_received(routing: np.ndarray, shards: int, local_experts: int) -> int:
    """Most copies any device of the group receives; routing [group tokens, K] expert ids."""
    per_device = np.zeros(shards, np.int64)
    for choice in routing:
        for e in choice:
            per_device[e // local_experts] += 1
    return int(per_device.max())


# --------------------------------------------------------------------------------------
# Hand-made routings.
# --------------------------------------------------------------------------------------


def distinct_choices(rng: np.random.Generator, pool: list[int], k: int) -> list[int]:
    return [int(e) for e in rng.choice(pool, size=k, replace=False)]


def routing(
    rng: np.random.Generator,
    devices: int,
    num_tokens: int,
    experts: int,
    top_k: int,
    *,
    forced: dict[int, list[int]] | None = None,  # device -> experts every token picks
    pool: dict[int, list[int]] | None = None,  # device -> where its other picks come from
) -> np.ndarray:
    ids = np.zeros((devices, num_tokens, top_k), np.int32)
    for d in range(devices):
        fixed = (forced or {}).get(d, [])
        others = [e for e in (pool or {}).get(d, range(experts)) if e not in fixed]
        for t in range(num_tokens):
            picks = fixed + distinct_choices(rng, others, top_k - len(fixed))
            ids[d, t] = rng.permutation(picks)  # the order within top-k carries no meaning
    return ids


@dataclass(frozen=True)
class ModuleCase:
    name: str
    experts: int
    top_k: int
    shards: int
    seq_len: int  # tokens per device (one sequence per device)


K3 = ModuleCase("k3", experts=8, top_k=3, shards=4, seq_len=3)  # top_k > local experts (2)
K1 = ModuleCase("k1", experts=8, top_k=1, shards=4, seq_len=3)


def routed_cases(case: ModuleCase) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    s, t, e, k = case.shards, case.seq_len, case.experts, case.top_k
    everyone = dict.fromkeys(range(s))
    cases = {"random": routing(rng, s, t, e, k)}
    if case is K3:
        # every token of the group picks expert 5 (device 2, local expert 1)
        cases["common expert"] = routing(rng, s, t, e, k, forced={d: [5] for d in everyone})
        # nobody picks experts 4 and 5: device 2 receives nothing
        cases["device receives nothing"] = routing(
            rng, s, t, e, k, pool={d: [0, 1, 2, 3, 6, 7] for d in everyone}
        )
        # every token sends both experts of device 0 a copy: the certified worst case
        cases["all to device 0"] = routing(rng, s, t, e, k, forced={d: [0, 1] for d in everyone})
        cases["all to device 3"] = routing(rng, s, t, e, k, forced={d: [6, 7] for d in everyone})
    else:
        cases["all copies to one expert"] = np.full((s, t, k), 5, np.int32)
        # device 1 routes only to its own experts: it sends nobody anything
        cases["device sends nothing"] = routing(rng, s, t, e, k, pool={1: [2, 3]})
        cases["all to device 3"] = routing(rng, s, t, e, k, pool={d: [6, 7] for d in everyone})
    return cases


def count_cases(case: ModuleCase) -> dict[str, np.ndarray]:
    """Exchange-level counts [device, peer, local expert] no routing of the module produces."""
    local = case.experts // case.shards
    rng = np.random.default_rng(11)
    cases = {}
    ids = routing(rng, case.shards, case.seq_len, case.experts, case.top_k)
    counts = np_dispatch(ids, np.zeros((*ids.shape[:2], 1)), np.zeros(ids.shape), local).counts
    silent = counts.copy()
    silent[1] = 0  # device 1 has no copies at all: sends nothing
    cases["silent sender"] = silent
    isolated = silent.copy()
    isolated[:, 1] = 0  # ... and receives nothing either
    cases["isolated device"] = isolated
    cases["nothing at all"] = np.zeros_like(counts)
    return cases


def generic_cases(devices: int, rows: int, out_rows: int, n: int) -> list[dict[str, np.ndarray]]:
    """Arbitrary ragged_all_to_all arguments: gaps, blocks in any order, empty blocks."""
    rng = np.random.default_rng(3)
    cases = []
    for _ in range(n):
        sizes = rng.integers(0, 3, (devices, devices))  # [sender, receiver]
        sizes[rng.integers(devices)] = 0  # a sender that sends nothing
        io = np.zeros((devices, devices), np.int64)
        oo = np.zeros((devices, devices), np.int64)
        for s in range(devices):  # sender layouts: receivers in random order, with gaps
            room, pos = rows - sizes[s].sum(), 0
            for r in rng.permutation(devices):
                gap = int(rng.integers(0, room + 1)) if room else 0
                room, pos = room - gap, pos + gap
                io[s, r] = pos if sizes[s, r] else int(rng.integers(0, rows + 1))
                pos += sizes[s, r]
        for r in range(devices):  # receiver layouts: senders in random order, with gaps
            room, pos = out_rows - sizes[:, r].sum(), 0
            for s in rng.permutation(devices):
                gap = int(rng.integers(0, room + 1)) if room else 0
                room, pos = room - gap, pos + gap
                oo[s, r] = pos if sizes[s, r] else int(rng.integers(0, out_rows + 1))
                pos += sizes[s, r]
        cases.append(
            {
                "operand": rng.normal(size=(devices, rows, WIDTH)).astype(np.float32),
                "output": rng.normal(size=(devices, out_rows, WIDTH)).astype(np.float32),
                "input_offsets": io.astype(np.int32),
                "send_sizes": sizes.astype(np.int32),
                "output_offsets": oo.astype(np.int32),
                "recv_sizes": sizes.T.copy().astype(np.int32),
            }
        )
    return cases


def token_values(devices: int, num_tokens: int, width: int) -> np.ndarray:
    """Row (d, t) is unmistakable: d*100 + t + 1 in column 0, then small distinct values."""
    base = np.arange(devices)[:, None] * 100 + np.arange(num_tokens)[None, :] + 1
    cols = [base.astype(np.float32)] + [base * 0.001 * (c + 1) for c in range(width - 1)]
    return np.stack(cols, axis=-1).astype(np.float32)


# --------------------------------------------------------------------------------------
# The child process: the module's functions inside shard_map.
# --------------------------------------------------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    module_path, inputs_path, outputs_path = sys.argv[1:4]
    spec = importlib.util.spec_from_file_location("layer", module_path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    inputs = np.load(inputs_path)
    mesh = m.make_mesh(jax.devices()[: m.NUM_DEVICES])
    assert mesh.axis_names == (m.EXPERT_AXIS,), mesh.axis_names
    AXIS = m.EXPERT_AXIS

    def per_device(fn, n_in):
        # Leading dimension of every input and output: the device along the expert axis.
        def body(*args):
            out = fn(*[a[0] for a in args])
            return jax.tree.map(lambda v: v[None], out)
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS),) * n_in, out_specs=P(AXIS)))

    def put(a):
        return jax.device_put(jnp.asarray(a), NamedSharding(mesh, P(AXIS)))

    def exchange(counts, rows):
        plan = m._exchange_plan(counts)
        width = rows.shape[1]
        received = m._ragged_all_to_all(
            rows, jnp.full((m.RECEIVE_ROWS, width), -1.0, rows.dtype),
            plan.input_offsets, plan.send_sizes, plan.output_offsets, plan.recv_sizes,
            axis_name=AXIS,
        )
        ids = m._received_expert_ids(plan.recv_counts)
        grouped = received[jnp.argsort(ids, stable=True)]
        back = m._ragged_all_to_all(
            received, jnp.full(rows.shape, -7.0, rows.dtype),
            plan.recv_offsets, plan.recv_sizes, plan.return_offsets, plan.send_sizes,
            axis_name=AXIS,
        )
        out = {name: getattr(plan, name) for name in plan._fields}
        out["all_to_all_recv_sizes"] = jax.lax.all_to_all(plan.recv_sizes, AXIS, 0, 0, tiled=True)
        return out | {"received": received, "ids": ids, "grouped": grouped, "back": back}

    def fake_ffn(rows, weights, group_sizes):
        # Expert e multiplies its rows by e + 1 (global id); rows past the groups get 0.
        me = jax.lax.axis_index(AXIS)
        local = jnp.repeat(jnp.arange(m.LOCAL_EXPERTS), group_sizes, total_repeat_length=rows.shape[0])
        inside = jnp.arange(rows.shape[0]) < group_sizes.sum()
        scale = jnp.where(inside, 1 + me * m.LOCAL_EXPERTS + local, 0).astype(rows.dtype)
        return rows * scale[:, None]

    m._expert_ffn = fake_ffn

    def routed(tokens, weights, ids):
        y, received = m._routed_experts(tokens, {}, weights, ids)
        return {"y": y, "received": received}

    results = {}
    run_exchange = per_device(exchange, 2)
    for i in range(int(inputs["n_exchange"])):
        out = run_exchange(put(inputs[f"counts_{i}"]), put(inputs[f"rows_{i}"]))
        results |= {f"x{i}_{k}": np.asarray(v) for k, v in out.items()}
    run_routed = per_device(routed, 3)
    for i in range(int(inputs["n_routed"])):
        args = [put(inputs[f"{k}_{i}"]) for k in ("tokens", "weights", "ids")]
        out = run_routed(*args)
        results |= {f"r{i}_{k}": np.asarray(v) for k, v in out.items()}
    fields = ("operand", "output", "input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    run_generic = per_device(lambda *a: m._ragged_all_to_all(*a, axis_name=AXIS), 6)
    for i in range(int(inputs["n_generic"])):
        results[f"g{i}"] = np.asarray(run_generic(*[put(inputs[f"g{i}_{k}"]) for k in fields]))
    np.savez(outputs_path, **results)
    print(json.dumps({"constants": {
        name: getattr(m, name)
        for name in ("RECEIVE_ROWS", "ROUTED_ROWS", "LOCAL_EXPERTS", "EXPERT_SHARDS", "TOP_K")
    }}))
    """
)


@dataclass
class Run:
    case: ModuleCase
    constants: dict[str, int]
    exchange_names: list[str]
    exchange_counts: list[np.ndarray]
    exchange_rows: list[np.ndarray]
    routed_names: list[str]
    routed_inputs: list[dict[str, np.ndarray]]
    generic_inputs: list[dict[str, np.ndarray]]
    out: dict[str, np.ndarray]

    def exchange(self, name: str) -> dict[str, np.ndarray]:
        i = self.exchange_names.index(name)
        prefix = f"x{i}_"
        return {k[len(prefix) :]: v for k, v in self.out.items() if k.startswith(prefix)}

    def routed(self, name: str) -> dict[str, np.ndarray]:
        i = self.routed_names.index(name)
        prefix = f"r{i}_"
        return {k[len(prefix) :]: v for k, v in self.out.items() if k.startswith(prefix)}


def module_source(case: ModuleCase) -> tuple[str, int]:
    text = spec_text(
        experts=case.experts,
        top_k=case.top_k,
        axes={"expert": case.shards},
        batch=case.shards,
        seq_len=case.seq_len,
    )
    plan = make_plan(load(text, f"a2a_{case.name}"))
    assert plan.experts.emulate_ragged_all_to_all  # cpu target: the all_gather twin
    return render(plan), plan.experts.receive_rows


def run_module(case: ModuleCase, tmp: Path) -> Run:
    source, receive_rows = module_source(case)
    module_path = tmp / f"a2a_{case.name}.py"
    module_path.write_text(source, encoding="utf-8")
    local = case.experts // case.shards
    inputs: dict[str, np.ndarray] = {}

    # Exchange-level cases: every routed case's counts and sorted rows, plus hand-made counts.
    routed = routed_cases(case)
    tokens = token_values(case.shards, case.seq_len, WIDTH)
    rng = np.random.default_rng(5)
    exchange_names, exchange_counts, exchange_rows = [], [], []
    routed_inputs = []
    for name, ids in routed.items():
        weights = rng.uniform(0.1, 1.0, ids.shape).astype(np.float32)
        model = np_dispatch(ids, tokens, weights, local)
        exchange_names.append(name)
        exchange_counts.append(model.counts.astype(np.int32))
        exchange_rows.append(model.sorted_rows.astype(np.float32))
        routed_inputs.append({"tokens": tokens, "weights": weights, "ids": ids})
    for name, counts in count_cases(case).items():
        rows = np.full((case.shards, case.seq_len * case.top_k, WIDTH), np.nan, np.float32)
        for d in range(case.shards):
            n = int(counts[d].sum())
            rows[d, :n] = token_values(1, n, WIDTH)[0] + 1000 * (d + 1)
        exchange_names.append(name)
        exchange_counts.append(counts.astype(np.int32))
        exchange_rows.append(rows)
    for i, (counts, rows) in enumerate(zip(exchange_counts, exchange_rows, strict=True)):
        inputs[f"counts_{i}"], inputs[f"rows_{i}"] = counts, rows
    for i, routed_input in enumerate(routed_inputs):
        inputs |= {f"{k}_{i}": v for k, v in routed_input.items()}
    generic = generic_cases(case.shards, rows=8, out_rows=10, n=4)
    for i, g in enumerate(generic):
        inputs |= {f"g{i}_{k}": v for k, v in g.items()}
    inputs |= {
        "n_exchange": np.array(len(exchange_names)),
        "n_routed": np.array(len(routed_inputs)),
        "n_generic": np.array(len(generic)),
    }
    inputs_path, outputs_path = tmp / f"in_{case.name}.npz", tmp / f"out_{case.name}.npz"
    np.savez(inputs_path, **inputs)
    script = tmp / "exchange.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={case.shards}",
        JAX_PLATFORMS="cpu",
    )
    result = subprocess.run(
        [sys.executable, str(script), str(module_path), str(inputs_path), str(outputs_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    constants = json.loads(result.stdout.strip().splitlines()[-1])["constants"]
    assert constants["RECEIVE_ROWS"] == receive_rows
    with np.load(outputs_path) as out:
        outputs = {k: out[k] for k in out.files}
    return Run(
        case,
        constants,
        exchange_names,
        exchange_counts,
        exchange_rows,
        list(routed),
        routed_inputs,
        generic,
        outputs,
    )


@pytest.fixture(scope="module", params=[K3, K1], ids=lambda c: c.name)
def run(request, tmp_path_factory) -> Run:
    return run_module(request.param, tmp_path_factory.mktemp(f"a2a_{request.param.name}"))


# --------------------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------------------


def test_modules_certify_the_worst_case_receive_buffer(run: Run) -> None:
    c, case = run.constants, run.case
    local = case.experts // case.shards
    assert c["LOCAL_EXPERTS"] == local and c["EXPERT_SHARDS"] == case.shards
    assert c["ROUTED_ROWS"] == case.seq_len * case.top_k
    assert c["RECEIVE_ROWS"] == case.shards * case.seq_len * min(case.top_k, local)


def test_exchange_plan_offsets_and_sizes(run: Run) -> None:
    for name, counts in zip(run.exchange_names, run.exchange_counts, strict=True):
        got = run.exchange(name)
        want = np_exchange_plan(counts)
        for field, value in want.items():
            np.testing.assert_array_equal(got[field], value, err_msg=f"{name}: {field}")
        # The collective's precondition, checked with the real all_to_all on the devices.
        np.testing.assert_array_equal(
            got["send_sizes"], got["all_to_all_recv_sizes"], err_msg=f"{name}: send != a2a(recv)"
        )


def test_received_buffer_matches_the_docstring_model(run: Run) -> None:
    receive = run.constants["RECEIVE_ROWS"]
    for name, counts, rows in zip(
        run.exchange_names, run.exchange_counts, run.exchange_rows, strict=True
    ):
        got = run.exchange(name)
        plan = np_exchange_plan(counts)
        outputs = np.full((run.case.shards, receive, WIDTH), -1.0, np.float32)
        want = np_ragged_all_to_all(
            rows,
            outputs,
            plan["input_offsets"],
            plan["send_sizes"],
            plan["output_offsets"],
            plan["recv_sizes"],
        )
        np.testing.assert_array_equal(got["received"], want, err_msg=name)
        # Rows past what arrived keep the output's values.
        for d in range(run.case.shards):
            n = int(counts[:, d].sum())
            assert (got["received"][d, n:] == -1.0).all(), (name, d)


def test_each_device_receives_the_copies_of_its_experts(run: Run) -> None:
    local = run.case.experts // run.case.shards
    for name, inputs in zip(run.routed_names, run.routed_inputs, strict=True):
        model = np_dispatch(inputs["ids"], inputs["tokens"], inputs["weights"], local)
        got = run.exchange(name)
        for d in range(run.case.shards):
            n = len(model.received[d])
            np.testing.assert_array_equal(got["received"][d, :n], model.received[d], err_msg=name)
            np.testing.assert_array_equal(got["ids"][d, :n], model.received_experts[d])
            # Past the received rows: the sentinel LOCAL_EXPERTS, sorted after every group.
            assert (got["ids"][d, n:] == local).all(), (name, d)
            np.testing.assert_array_equal(got["grouped"][d, :n], model.grouped[d], err_msg=name)
            np.testing.assert_array_equal(got["recv_counts"][d].sum(0), model.group_sizes[d])


def test_return_trip_restores_every_row_to_its_senders_sorted_position(run: Run) -> None:
    for name, counts, rows in zip(
        run.exchange_names, run.exchange_counts, run.exchange_rows, strict=True
    ):
        back = run.exchange(name)["back"]
        for d in range(run.case.shards):
            n = int(counts[d].sum())
            np.testing.assert_array_equal(back[d, :n], rows[d, :n], err_msg=f"{name}: device {d}")
            assert (back[d, n:] == -7.0).all(), (name, d)  # nothing written past the copies


def test_routed_experts_with_a_fake_ffn_combine_every_copy(run: Run) -> None:
    """_routed_experts end to end: expert e multiplies by e + 1; y = sum_k w * x * (e_k + 1)."""
    local = run.case.experts // run.case.shards
    for name, inputs in zip(run.routed_names, run.routed_inputs, strict=True):
        model = np_dispatch(inputs["ids"], inputs["tokens"], inputs["weights"], local)
        got = run.routed(name)
        np.testing.assert_allclose(got["y"], model.y, rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got["received"], [len(r) for r in model.received])


def test_adversarial_routings_never_exceed_receive_rows_and_the_worst_reaches_it(run: Run) -> None:
    receive = run.constants["RECEIVE_ROWS"]
    received = {name: run.routed(name)["received"].tolist() for name in run.routed_names}
    for name, per_device in received.items():
        assert max(per_device) <= receive, (name, per_device)
    if run.case is K3:
        assert received["all to device 0"][0] == receive, received
        assert received["all to device 3"][3] == receive, received
        assert received["device receives nothing"][2] == 0, received
        assert received["common expert"][2] >= run.case.shards * run.case.seq_len
    else:
        assert received["all copies to one expert"] == [0, 0, receive, 0], received
        assert received["all to device 3"] == [0, 0, 0, receive], received
        sends = run.exchange("device sends nothing")["send_sizes"][1]
        assert sends.tolist() == [0, int(sends[1]), 0, 0] and sends[1] == run.case.seq_len


def test_silent_and_isolated_devices(run: Run) -> None:
    silent = run.exchange("silent sender")
    assert (silent["send_sizes"][1] == 0).all()
    assert (silent["recv_sizes"][:, 1] == 0).all()
    isolated = run.exchange("isolated device")
    assert (isolated["recv_sizes"][1] == 0).all()
    assert (isolated["received"][1] == -1.0).all()  # untouched
    assert (isolated["ids"][1] == run.case.experts // run.case.shards).all()
    nothing = run.exchange("nothing at all")
    assert (nothing["received"] == -1.0).all() and (nothing["back"] == -7.0).all()


def test_emulated_ragged_all_to_all_on_arbitrary_arguments(run: Run) -> None:
    """Gaps, blocks in any order, empty blocks with any offset: the docstring's semantics."""
    for i, g in enumerate(run.generic_inputs):
        want = np_ragged_all_to_all(
            g["operand"],
            g["output"],
            g["input_offsets"],
            g["send_sizes"],
            g["output_offsets"],
            g["recv_sizes"],
        )
        np.testing.assert_array_equal(run.out[f"g{i}"], want, err_msg=f"generic case {i}")


# --------------------------------------------------------------------------------------
# The plan's certified receive buffer against brute force.
# --------------------------------------------------------------------------------------

# (expert shards, local experts, top_k, tokens per device)
BOUND_SHAPES = [
    (2, 2, 1, 1),
    (2, 2, 2, 1),
    (2, 2, 3, 1),
    (2, 1, 2, 2),
    (4, 1, 3, 1),
    (4, 2, 3, 2),
    (4, 4, 2, 3),
    (2, 4, 8, 2),
    (8, 2, 4, 4),
    (8, 8, 8, 2),
]


@pytest.mark.parametrize("shape", BOUND_SHAPES, ids=lambda s: "S{}-L{}-K{}-T{}".format(*s))
def test_receive_rows_is_the_brute_force_maximum(shape: tuple[int, int, int, int]) -> None:
    shards, local, top_k, per_device = shape
    experts = shards * local
    plan = make_plan(
        load(
            spec_text(
                experts=experts,
                top_k=top_k,
                axes={"expert": shards},
                batch=shards,
                seq_len=per_device,
            )
        )
    )
    group = shards * per_device
    assert plan.experts.group_tokens == group
    bound = plan.experts.receive_rows
    assert bound == group * min(top_k, local)  # the documented formula
    assert plan.experts.ffn_rows == bound

    if math.comb(experts, top_k) ** group <= 20_000:  # every routing of the group
        subsets = list(itertools.combinations(range(experts), top_k))
        best = max(
            max_received(np.array(choice), shards, local)
            for choice in itertools.product(subsets, repeat=group)
        )
        assert best == bound
        return
    rng = np.random.default_rng(0)
    adversarial = []
    for target in range(shards):
        mine = list(range(target * local, (target + 1) * local))
        others = [e for e in range(experts) if e not in mine]
        take = min(top_k, local)
        adversarial.append(
            np.array(
                [
                    distinct_choices(rng, mine, take) + distinct_choices(rng, others, top_k - take)
                    for _ in range(group)
                ]
            )
        )
    randoms = [
        np.array([distinct_choices(rng, list(range(experts)), top_k) for _ in range(group)])
        for _ in range(50)
    ]
    assert max(max_received(r, shards, local) for r in adversarial) == bound
    assert all(max_received(r, shards, local) == bound for r in adversarial)
    assert max(max_received(r, shards, local) for r in randoms) <= bound
    # Nothing can beat the bound: a token sends one device at most min(top_k, local) copies.
    assert all(
        max(sum(e // local == d for e in choice) for d in range(shards)) <= min(top_k, local)
        for choice in itertools.islice(itertools.combinations(range(experts), top_k), 2000)
    )


def test_receive_rows_with_a_data_axis_counts_the_expert_group_only() -> None:
    plan = make_plan(
        load(spec_text(experts=8, top_k=3, axes={"data": 2, "expert": 4}, batch=8, seq_len=5))
    )
    # 8 sequences over 8 devices: 5 tokens each; the group is the 4 devices of one data row.
    assert plan.local_tokens == 5
    assert plan.experts.group_tokens == 20
    assert plan.experts.receive_rows == 20 * min(3, 2)
    assert math.prod(dict(plan.mesh_axes).values()) == 8


def test_twin_of_the_tpu_example_emulates_the_collective() -> None:
    """The TPU module calls jax.lax.ragged_all_to_all; its CPU twin uses the emulation."""
    path = REPO_ROOT / "specs" / "mixtral_8x7b_ep_a2a_v5e.yaml"
    if not path.exists():
        pytest.skip("example spec not present")
    loaded = load_valid(path)
    full = make_plan(loaded)
    assert full.expert_strategy == "ragged_all_to_all"
    assert not full.experts.emulate_ragged_all_to_all
    source = render(full)
    assert "jax.lax.ragged_all_to_all(" in source and "def _ragged_all_to_all(" not in source
    twin_plan = make_plan(twin_of(loaded), interpret=True)
    assert twin_plan.experts.emulate_ragged_all_to_all
    twin_source = render(twin_plan)
    assert "def _ragged_all_to_all(" in twin_source
    assert "jax.lax.ragged_all_to_all(" not in twin_source
    local = twin_plan.local_experts
    assert twin_plan.experts.receive_rows == twin_plan.experts.group_tokens * min(
        twin_plan.top_k, local
    )
    assert f"RECEIVE_ROWS = {twin_plan.experts.receive_rows}" in twin_source
