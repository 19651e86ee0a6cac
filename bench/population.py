"""A seeded population of valid TPU specs over the space users write (issue 27).

    population(count, seed) -> [(name, YAML text)]

Each spec is drawn from its own generator (`random.Random(f"{seed}:{index}")`), so that the
first N specs of a seed are the same whatever the count, and a spec's text depends on the
seed and its index alone. A draw is kept only when moegen validates it (the validator's
refusals are the space's boundary, not the generator's); a refused draw is drawn again from
the same generator, up to MAX_DRAWS times.

What is drawn:
- a model family's real layer and router (FAMILIES: Mixtral 8x7B, Qwen3-30B-A3B,
  DeepSeek-V3, OLMoE, DBRX, Jamba, gpt-oss-120b, Llama 4 Scout, Qwen2-57B-A14B, Qwen1.5-MoE);
- a TPU generation and slice (v5e, v5p, v6e, tpu7x; 4 to 16 devices), its devices factored
  over two or three of the mesh axes data, fsdp, expert, tensor, sequence;
- the strategy (ragged all-to-all, ring of experts, replicated) and the kernel (pallas, xla);
- the trades: the whole layer, FFN slices, token chunks, or both;
- variations: a shared expert or not, biases, a capacity factor, bfloat16 parameters;
- a batch and sequence scaled so that a device holds 2k to 16k tokens (a compile of a minute
  or two on a 2-core machine).
"""

from __future__ import annotations

import random
from typing import Any

import yaml

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes
from moegen.validate import validate

MAX_DRAWS = 200

# family -> (layer, router): the published configurations' MoE block
FAMILIES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "mixtral_8x7b": (
        {"num_experts": 8, "embed_dim": 4096, "ffn_dim": 14336},
        {"top_k": 2, "score": "softmax", "renormalize": True},
    ),
    "qwen3_30b_a3b": (
        {"num_experts": 128, "embed_dim": 2048, "ffn_dim": 768},
        {"top_k": 8, "score": "softmax", "renormalize": True},
    ),
    "deepseek_v3": (
        {"num_experts": 256, "embed_dim": 7168, "ffn_dim": 2048, "shared_ffn_dim": 2048},
        {
            "top_k": 8,
            "score": "sigmoid",
            "renormalize": True,
            "routed_scaling": 2.5,
            "group_limit": {"groups": 8, "keep": 4},
            "routing_bias": True,
        },
    ),
    "olmoe": (
        {"num_experts": 64, "embed_dim": 2048, "ffn_dim": 1024},
        {"top_k": 8, "score": "softmax"},
    ),
    "dbrx": (
        {"num_experts": 16, "embed_dim": 6144, "ffn_dim": 10752},
        {"top_k": 4, "score": "softmax", "renormalize": True},
    ),
    "jamba": (
        {"num_experts": 16, "embed_dim": 4096, "ffn_dim": 14336},
        {"top_k": 2, "score": "softmax"},
    ),
    "gpt_oss_120b": (
        {
            "num_experts": 128,
            "embed_dim": 2880,
            "ffn_dim": 2880,
            "glu": "gpt_oss",
            "ffn_bias": True,
        },
        {"top_k": 4, "score": "softmax", "score_after_top_k": True, "linear_bias": True},
    ),
    "llama4_scout": (
        {"num_experts": 16, "embed_dim": 5120, "ffn_dim": 8192, "shared_ffn_dim": 8192},
        {"top_k": 1, "score": "sigmoid", "weighting": "input"},
    ),
    "qwen2_57b_a14b": (
        {
            "num_experts": 64,
            "embed_dim": 3584,
            "ffn_dim": 2560,
            "shared_ffn_dim": 20480,
            "shared_expert_gate": True,
        },
        {"top_k": 8, "score": "softmax"},
    ),
    "qwen15_moe_a27b": (
        {
            "num_experts": 60,
            "embed_dim": 2048,
            "ffn_dim": 1408,
            "shared_ffn_dim": 5632,
            "shared_expert_gate": True,
        },
        {"top_k": 4, "score": "softmax"},
    ),
}

# generation -> slices of 4 to 16 devices (tpu7x: two devices a chip)
SLICES = {
    "tpu-v5e": ("2x2", "2x4", "4x4"),
    "tpu-v5p": ("2x2x1", "2x2x2", "2x2x4"),
    "tpu-v6e": ("2x2", "2x4", "4x4"),
    "tpu7x": ("2x2x1", "2x2x2"),
}
DEVICES_PER_CHIP = {"tpu7x": 2}
AXES = ("data", "fsdp", "expert", "tensor", "sequence")
STRATEGIES = ("ragged_all_to_all", "ragged_all_to_all", "ring_of_experts", "replicated")
TRADES = ("whole", "whole", "ffn slices", "token chunks", "both")


def _devices(hardware: str, topology: str) -> int:
    chips = 1
    for dim in topology.split("x"):
        chips *= int(dim)
    return chips * DEVICES_PER_CHIP.get(hardware, 1)


def _mesh(rng: random.Random, devices: int, strategy: str) -> dict[str, int]:
    """`devices` factored over two or three axes, in mesh order (major to minor)."""
    names = ["expert"] if strategy != "replicated" else []
    names += rng.sample([a for a in AXES if a not in names], rng.choice((1, 2)))
    sizes = dict.fromkeys(names, 1)
    left = devices
    while left > 1:
        sizes[rng.choice(names)] *= 2
        left //= 2
    return {axis: sizes[axis] for axis in AXES if sizes.get(axis, 1) > 1}


def _shapes(rng: random.Random, mesh: dict[str, int]) -> dict[str, int]:
    """Batch and sequence with 2k to 16k tokens on a device."""
    batch_shards = mesh.get("data", 1) * mesh.get("fsdp", 1)
    local_tokens = rng.choice((2048, 4096, 8192, 16384))
    seq_len = rng.choice((1024, 2048, 4096))
    seq_shards = mesh.get("sequence", 1)
    local_batch = max(1, local_tokens * seq_shards // seq_len)
    return {"batch": local_batch * batch_shards, "seq_len": seq_len}


def _trades(rng: random.Random) -> dict[str, Any]:
    trade = rng.choice(TRADES)
    memory: dict[str, Any] = {}
    if trade in ("ffn slices", "both"):
        memory["ffn_chunks"] = rng.choice((2, 4))
    if trade in ("token chunks", "both"):
        memory["token_chunks"] = rng.choice((2, 4, 8))
    elif trade == "whole":
        memory["token_chunks"] = 1  # the layer as written, not the plan's choice
    return memory


def draw(rng: random.Random) -> dict[str, Any]:
    """One spec's tree (not yet validated)."""
    family = rng.choice(sorted(FAMILIES))
    layer, router = (dict(section) for section in FAMILIES[family])
    if "shared_ffn_dim" in layer and rng.random() < 0.25:
        layer.pop("shared_ffn_dim")
        layer.pop("shared_expert_gate", None)
    if rng.random() < 0.15:
        layer["ffn_bias"] = True
    if rng.random() < 0.15:
        router["capacity"] = {"factor": rng.choice((1.0, 1.25, 2.0)), "drop": "probability"}
    hardware = rng.choice(sorted(SLICES))
    topology = rng.choice(SLICES[hardware])
    strategy = rng.choice(STRATEGIES)
    mesh = _mesh(rng, _devices(hardware, topology), strategy)
    params = "bfloat16" if rng.random() < 0.2 else "float32"
    spec: dict[str, Any] = {
        "version": 1,
        "description": f"population: {family} on {hardware} {topology}",
        "layer": layer,
        "router": router,
        "shapes": _shapes(rng, mesh),
        "dtypes": {"params": params, "compute": "bfloat16"},
        "mesh": {"axes": mesh},
        "parallelism": {"experts": strategy},
        "target": {"hardware": hardware, "topology": topology},
    }
    spec["target"]["kernel"] = rng.choice(("pallas", "pallas", "xla"))
    memory = _trades(rng)
    if memory:
        spec["memory"] = memory
    return spec


def population(count: int, seed: int) -> list[tuple[str, str]]:
    """`count` valid specs of `seed`: (name, YAML text), name `s<seed>_<index>_<family>`."""
    specs = []
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        for _ in range(MAX_DRAWS):
            tree = draw(rng)
            family = tree["description"].split()[1]
            name = f"s{seed}_{index:03d}_{family}"
            text = yaml.safe_dump(tree, sort_keys=False)
            try:
                validate(load_spec_bytes(text.encode(), f"{name}.yaml", name))
            except SpecError:
                continue
            specs.append((name, text))
            break
        else:
            raise RuntimeError(f"no valid spec in {MAX_DRAWS} draws for {seed}:{index}")
    return specs
