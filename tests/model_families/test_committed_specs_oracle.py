"""The committed real-model specs compute their models: each one shrunk (its widths to the
oracle's tiny ones, its shared expert in proportion, cpu, float32, experts replicated) and
compared with transformers' own MoE block configured with the published model's routing
(expert count, top-k, normalisation, groups, scaling, shared experts, clamps), output and
input gradient, at a normal input scale and at one where clamps bite.

Everything that decides routing and the FFN comes from the committed spec file itself, so a
spec that stops computing its model fails here. Needs the oracle extra (torch,
transformers); skipped without it unless MOEGEN_REQUIRE_ORACLE is set.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from oracle_gate import require_oracle

require_oracle()  # torch and transformers, or this module skipped (CI: failed)

from oracle import moegen_side  # noqa: E402
from oracle.families import EMBED, FAMILIES, FFN  # noqa: E402
from oracle.hf_blocks import as_numpy, build_block, counting_bites, run_block  # noqa: E402

from moegen.load import load_spec_bytes  # noqa: E402
from moegen.plan import make_plan  # noqa: E402
from moegen.render import render  # noqa: E402
from moegen.validate import validate  # noqa: E402

SPECS = Path(__file__).resolve().parents[2] / "specs"
TOLERANCE = 1e-5
TOKENS = (2, 32)  # batch, seq_len of the shrunk layer
SEED = 1

# committed spec -> (oracle family, the published model's routing settings, as its config)
PUBLISHED = {
    "gpt_oss_120b_v6e": ("gpt_oss", dict(num_local_experts=128, num_experts_per_tok=4)),
    "llama4_scout_v5e": ("llama4", dict(num_local_experts=16, num_experts_per_tok=1)),
    "qwen2_57b_a14b_v6e": (
        "qwen2_moe",
        dict(
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=False,
            shared_expert_intermediate_size=8 * FFN,  # 20480 / 2560
        ),
    ),
    "ernie45_21b_a3b_v5p": (
        "ernie4_5_moe",
        dict(num_experts=64, num_experts_per_tok=6, moe_num_shared_experts=2),
    ),
    "deepseek_v3_v5p": (
        "deepseek_v3",
        dict(
            n_routed_experts=256,
            num_experts_per_tok=8,
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            n_shared_experts=1,
        ),
    ),
    "mixtral_8x7b_v5e": ("mixtral", dict(num_local_experts=8, num_experts_per_tok=2)),
    "qwen3_30b_a3b_v6e": (
        "qwen3_moe",
        dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True),
    ),
}
moegen_side.provide_cpu_devices(2)


def shrunk_source(name: str) -> str:
    """The committed spec with the oracle's widths, on a cpu {data: 2} mesh in float32."""
    spec = yaml.safe_load((SPECS / f"{name}.yaml").read_text(encoding="utf-8"))
    layer = dict(spec["layer"])
    if "shared_ffn_dim" in layer:
        layer["shared_ffn_dim"] = layer["shared_ffn_dim"] * FFN // layer["ffn_dim"]
    layer |= {"embed_dim": EMBED, "ffn_dim": FFN}
    shrunk = {
        "version": 1,
        "layer": layer,
        "router": spec["router"],
        "shapes": {"batch": TOKENS[0], "seq_len": TOKENS[1]},
        "dtypes": {"params": "float32", "compute": "float32"},
        "mesh": {"axes": {"data": 2}},
    }
    loaded = load_spec_bytes(yaml.safe_dump(shrunk).encode(), f"specs/{name}.yaml", name)
    validate(loaded)
    return render(make_plan(loaded))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_committed_spec_computes_its_model(name: str) -> None:
    family_name, published = PUBLISHED[name]
    [family] = [f for f in FAMILIES if f.name == family_name]
    module = moegen_side.import_source(shrunk_source(name), f"committed_{name}")
    block = build_block(
        family.config,
        family.config_kwargs | published,
        family.block,
        family.block_args,
        family.init,
        SEED,
    )
    run = moegen_side.runner(module, as_numpy(family.weights(block)))
    x = np.random.default_rng(SEED).standard_normal((*TOKENS, EMBED)).astype(np.float32)
    for scale in (1.0, 8.0):
        inputs = x * np.float32(scale)
        if family.clamp is not None:
            limit, split = family.clamp
            with counting_bites(block, limit, split) as bites:
                want_y, want_grad = run_block(block, inputs)
            if scale > 1:
                assert bites.gate > 0 and bites.up > 0, bites  # the clamps are exercised
        else:
            want_y, want_grad = run_block(block, inputs)
        got_y, got_grad = run(inputs)
        for what, got, want in (("output", got_y, want_y), ("input grad", got_grad, want_grad)):
            error = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            print(f"{name} x{scale:g} {what}: {error:.2e}")
            assert error < TOLERANCE, (name, scale, what, error)
