"""One-chip layers and their memory trades, drawn for timing on a TPU chip (issue 52, item 3).

    python -m bench.trade_time.layers --seed 0 --count 6   # into bench/trade_time/modules

Each layer is a model family's real MoE block (bench.population.FAMILIES) on one TPU v5e
chip (`fsdp: 1`, topology 1x1, kernel pallas): its tokens the most of 8192, 4096 and 2048 at
which the plan fits the whole layer and two trades on the chip, its parameters float32 or
bfloat16. Its variants: the layer whole, 2 and 4 token chunks, 2 and 4 FFN slices, and 2
chunks of 2 slices, each that validates and fits. Two layers come first, the ones the
trades' costs were first looked at on (Qwen3-30B-A3B with float32 parameters, Mixtral 8x7B
with bfloat16): the fit set. The others, in the seed's order, are the hold-out.

The modules (git-ignored) and `layers.json` (each layer's variants: module file, spec text)
go to the device (carry bench/trade_time/modules); bench.trade_time.chip times them there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.population import FAMILIES
from moegen.diagnostics import SpecError
from moegen.hardware import hardware
from moegen.load import load_spec_bytes
from moegen.plan import make_plan, peak
from moegen.render import render
from moegen.validate import validate

OUT = Path(__file__).resolve().parent / "modules"
VARIANTS = {
    "whole": {"token_chunks": 1, "ffn_chunks": 1},
    "tc2": {"token_chunks": 2, "ffn_chunks": 1},
    "tc4": {"token_chunks": 4, "ffn_chunks": 1},
    "fs2": {"token_chunks": 1, "ffn_chunks": 2},
    "fs4": {"token_chunks": 1, "ffn_chunks": 4},
    "tc2fs2": {"token_chunks": 2, "ffn_chunks": 2},
}
TOKENS = (8192, 4096, 2048)
# the chip's HBM a variant's planned peak may fill: the timing driver holds an input and a
# cotangent beside it
FILL = 0.85
FIT_SET = (("qwen3_30b_a3b", "float32"), ("mixtral_8x7b", "bfloat16"))
DTYPE_TAGS = {"float32": "f32", "bfloat16": "bf16"}


def layer_tree(family: str, params: str, tokens: int, memory: dict[str, int]) -> dict[str, Any]:
    layer, router = (dict(section) for section in FAMILIES[family])
    return {
        "version": 1,
        "description": f"trade timing: {family}, {params} parameters, {tokens} tokens",
        "layer": layer,
        "router": router,
        "shapes": {"batch": tokens // 2048, "seq_len": 2048},
        "dtypes": {"params": params, "compute": "bfloat16"},
        "mesh": {"axes": {"fsdp": 1}},
        "target": {"hardware": "tpu-v5e", "topology": "1x1", "kernel": "pallas"},
        "memory": dict(memory),
    }


def planned(name: str, tree: dict[str, Any]) -> tuple[str, Any] | None:
    """(spec text, plan) of a variant, or None where moegen refuses it."""
    text = yaml.safe_dump(tree, sort_keys=False)
    try:
        loaded = validate(load_spec_bytes(text.encode(), f"{name}.yaml", name))
    except SpecError:
        return None
    return text, make_plan(loaded)


def variants_that_fit(
    family: str, params: str, token_counts: tuple[int, ...] = TOKENS
) -> tuple[int, dict[str, tuple[str, Any]]]:
    """The most tokens at which the whole layer and two trades or more fit the chip (by the
    plan), with each variant that does."""
    hbm = hardware("tpu-v5e").hbm_bytes_per_chip
    for tokens in token_counts:
        found = {}
        for label, memory in VARIANTS.items():
            got = planned(f"{family}_{label}", layer_tree(family, params, tokens, memory))
            if got is not None and peak(got[1]) <= FILL * hbm:
                found[label] = got
        if "whole" in found and len(found) >= 3:
            return tokens, found
    return 0, {}


def candidate_layers(seed: int) -> list[tuple[str, str]]:
    """(family, params dtype): the fit set, then every other pair in the seed's order."""
    rng = random.Random(f"trade-time:{seed}")
    pool = [(f, p) for f in sorted(FAMILIES) for p in ("float32", "bfloat16")]
    rng.shuffle(pool)
    return [*FIT_SET, *(pair for pair in pool if pair not in FIT_SET)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trade_time.layers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=8, help="hold-out layers besides the fit set")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--tokens", type=int, nargs="*", default=list(TOKENS), help="token counts to try"
    )
    parser.add_argument(
        "--layers", nargs="*", default=[], help="family:dtype pairs instead of the draw"
    )
    args = parser.parse_args(argv)
    pairs = [tuple(p.split(":", 1)) for p in args.layers] or candidate_layers(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    layers: list[dict[str, Any]] = []
    for family, params in pairs:
        if len(layers) == len(FIT_SET) + args.count:
            break
        tokens, found = variants_that_fit(family, params, tuple(args.tokens))
        if not found:
            print(f"{family} {params}: no token count fits one chip", flush=True)
            continue
        key = f"{family}_{DTYPE_TAGS[params]}" + ("" if tokens == TOKENS[0] else f"_t{tokens}")
        entry = {"layer": key, "fit_set": (family, params) in FIT_SET, "tokens": tokens}
        entry["variants"] = {}
        for label, (text, plan) in found.items():
            module = f"{key}_{label}"
            (args.out / f"{module}.py").write_text(render(plan), encoding="utf-8")
            entry["variants"][label] = {"module": module, "spec": text}
        layers.append(entry)
        print(f"{key}: {tokens} tokens, {', '.join(found)}", flush=True)
    (args.out / "layers.json").write_text(json.dumps(layers, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
