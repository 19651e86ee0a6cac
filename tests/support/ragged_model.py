"""An independent numpy model of jax.lax.ragged_all_to_all and of MoE dispatch, hand-made routings, and the spec builder of the ragged all-to-all tests.

The model is written from jax.lax.ragged_all_to_all's docstring alone: sender i writes
operand_i[input_offsets_i[j] : input_offsets_i[j] + send_sizes_i[j]] into receiver j's output
at output_offsets_i[j]; the output keeps its values everywhere else. MoE dispatch is modelled
copy by copy: a device receives, sender by sender, the copies routed to its experts in the
sender's (expert, copy) order; grouped by local expert for the FFN; results go back to the
sender's sorted position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from spec_builder import spec_yaml

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    return spec_yaml(
        {
            "description": "ragged all-to-all test",
            "experts": experts,
            "embed": embed,
            "ffn": ffn,
            "top_k": top_k,
            "score": "softmax",
            "renormalize": top_k > 1,
            "batch": batch,
            "seq_len": seq_len,
            "params_dtype": "float32",
            "compute_dtype": "float32",
            "axes": axes,
            "strategy": "ragged_all_to_all",
            "hardware": "cpu",
            "kernel": "xla",
        }
    )


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
