"""The generated module's ragged all-to-all exchange of expert parallelism, run in a child process, against the numpy model of ragged_model.py.

The generated module's _exchange_plan, _ragged_all_to_all (the all_gather emulation used on
XLA:CPU, which lacks the op), _received_expert_ids and _routed_experts (with a fake expert
FFN) run inside jax.shard_map over the expert axis on fake CPU devices, in a child process
(JAX fixes its device count at start-up), on hand-made routings including the adversarial
ones: all copies to one expert, a device that receives nothing, a device that sends nothing,
every device sending everything to one device (the certified RECEIVE_ROWS exactly reached).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from ragged_model import (
    K1,
    K3,
    WIDTH,
    ModuleCase,
    count_cases,
    generic_cases,
    load,
    np_dispatch,
    np_exchange_plan,
    np_ragged_all_to_all,
    routed_cases,
    spec_text,
    token_values,
)

from moegen.plan import make_plan
from moegen.render import render

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
    assert plan.experts.emulates_collective  # cpu target: the all_gather twin
    return render(plan), plan.experts.receive_rows


# The exchange-level cases sent to the child: one name, counts and sorted rows each.
class ExchangeCases(NamedTuple):
    names: list[str]
    counts: list[np.ndarray]
    rows: list[np.ndarray]


def routed_exchange_cases(
    case: ModuleCase, routed: dict[str, np.ndarray]
) -> tuple[ExchangeCases, list[dict[str, np.ndarray]]]:
    """Every routed case's counts and sorted rows, with the inputs its _routed_experts run gets."""
    local = case.experts // case.shards
    tokens = token_values(case.shards, case.seq_len, WIDTH)
    rng = np.random.default_rng(5)
    cases = ExchangeCases([], [], [])
    routed_inputs = []
    for name, ids in routed.items():
        weights = rng.uniform(0.1, 1.0, ids.shape).astype(np.float32)
        model = np_dispatch(ids, tokens, weights, local)
        cases.names.append(name)
        cases.counts.append(model.counts.astype(np.int32))
        cases.rows.append(model.sorted_rows.astype(np.float32))
        routed_inputs.append({"tokens": tokens, "weights": weights, "ids": ids})
    return cases, routed_inputs


def add_hand_made_count_cases(case: ModuleCase, cases: ExchangeCases) -> None:
    """Hand-made counts; each device's rows are distinct (+1000 per device), NaN past its copies."""
    for name, counts in count_cases(case).items():
        rows = np.full((case.shards, case.seq_len * case.top_k, WIDTH), np.nan, np.float32)
        for d in range(case.shards):
            n = int(counts[d].sum())
            rows[d, :n] = token_values(1, n, WIDTH)[0] + 1000 * (d + 1)
        cases.names.append(name)
        cases.counts.append(counts.astype(np.int32))
        cases.rows.append(rows)


def child_inputs(
    cases: ExchangeCases,
    routed_inputs: list[dict[str, np.ndarray]],
    generic: list[dict[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """Flatten every case into the .npz keys SCRIPT reads (counts_i, tokens_i, g{i}_operand...)."""
    inputs: dict[str, np.ndarray] = {}
    for i, (counts, rows) in enumerate(zip(cases.counts, cases.rows, strict=True)):
        inputs[f"counts_{i}"], inputs[f"rows_{i}"] = counts, rows
    for i, routed_input in enumerate(routed_inputs):
        inputs |= {f"{k}_{i}": v for k, v in routed_input.items()}
    for i, g in enumerate(generic):
        inputs |= {f"g{i}_{k}": v for k, v in g.items()}
    inputs |= {
        "n_exchange": np.array(len(cases.names)),
        "n_routed": np.array(len(routed_inputs)),
        "n_generic": np.array(len(generic)),
    }
    return inputs


def run_child(
    case: ModuleCase, module_path: Path, inputs: dict[str, np.ndarray], tmp: Path
) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Run SCRIPT on case.shards fake CPU devices; return the module's constants and outputs."""
    inputs_path, outputs_path = tmp / f"in_{case.name}.npz", tmp / f"out_{case.name}.npz"
    np.savez(inputs_path, **inputs)
    script = tmp / "exchange.py"
    script.write_text(SCRIPT, encoding="utf-8")
    flags = f"--xla_force_host_platform_device_count={case.shards}"
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
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
    with np.load(outputs_path) as out:
        outputs = {k: out[k] for k in out.files}
    return constants, outputs


def run_module(case: ModuleCase, tmp: Path) -> Run:
    source, receive_rows = module_source(case)
    module_path = tmp / f"a2a_{case.name}.py"
    module_path.write_text(source, encoding="utf-8")
    routed = routed_cases(case)
    cases, routed_inputs = routed_exchange_cases(case, routed)
    add_hand_made_count_cases(case, cases)
    generic = generic_cases(case.shards, rows=8, out_rows=10, n=4)
    inputs = child_inputs(cases, routed_inputs, generic)
    constants, outputs = run_child(case, module_path, inputs, tmp)
    assert constants["RECEIVE_ROWS"] == receive_rows
    return Run(case, constants, *cases, list(routed), routed_inputs, generic, outputs)


@pytest.fixture(scope="module", params=[K3, K1], ids=lambda c: c.name)
def run(request, tmp_path_factory) -> Run:
    return run_module(request.param, tmp_path_factory.mktemp(f"a2a_{request.param.name}"))


# --------------------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_modules_certify_the_worst_case_receive_buffer(run: Run) -> None:
    c, case = run.constants, run.case
    local = case.experts // case.shards
    assert c["LOCAL_EXPERTS"] == local and c["EXPERT_SHARDS"] == case.shards
    assert c["ROUTED_ROWS"] == case.seq_len * case.top_k
    assert c["RECEIVE_ROWS"] == case.shards * case.seq_len * min(case.top_k, local)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_return_trip_restores_every_row_to_its_senders_sorted_position(run: Run) -> None:
    for name, counts, rows in zip(
        run.exchange_names, run.exchange_counts, run.exchange_rows, strict=True
    ):
        back = run.exchange(name)["back"]
        for d in range(run.case.shards):
            n = int(counts[d].sum())
            np.testing.assert_array_equal(back[d, :n], rows[d, :n], err_msg=f"{name}: device {d}")
            assert (back[d, n:] == -7.0).all(), (name, d)  # nothing written past the copies


@pytest.mark.slow
def test_routed_experts_with_a_fake_ffn_combine_every_copy(run: Run) -> None:
    """_routed_experts end to end: expert e multiplies by e + 1; y = sum_k w * x * (e_k + 1)."""
    local = run.case.experts // run.case.shards
    for name, inputs in zip(run.routed_names, run.routed_inputs, strict=True):
        model = np_dispatch(inputs["ids"], inputs["tokens"], inputs["weights"], local)
        got = run.routed(name)
        np.testing.assert_allclose(got["y"], model.y, rtol=1e-6, err_msg=name)
        np.testing.assert_array_equal(got["received"], [len(r) for r in model.received])


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
