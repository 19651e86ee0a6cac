"""TPU check, phase one (here, with the project's venv): one-chip specs, modules, a manifest.

For every committed specs/*.yaml aimed at a TPU, writes a one-chip version (same layer,
router and dtypes; mesh fsdp 1 on a tpu-v5e 1x1; 8192 tokens a call), plans it with
`moegen plan --json` to see whether parameters, gradients and activations fit one chip's
15.7 GiB (float32 parameters switched to bfloat16 where only those fit; skipped with the
reason where neither does), renders its modules with `moegen build --no-verify` (kernels
pallas and xla, plus memory trades for the Mixtral and Qwen3-30B-A3B layers) into
$TPU_CHECK_WORK (default .tpu_check/, git-ignored) and writes manifest.json for the run phase
(tpu_check_run.py), which has no moegen. moegen runs only in child processes, so this file
imports nothing of it. moegen's dense reference is copied there as the package
`moegen_reference` for the layers whose features the run phase's simple reference lacks.

`--tiny` shrinks every layer to a few hundred wide (kernel xla, target cpu) so that the whole
harness runs on a CPU in CI.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tpu_check_extras import copy_reference, kernel_modules  # noqa: E402
from tpu_check_fit import (  # noqa: E402
    HBM_BYTES,
    ROOT,
    fitting_plan,
    moegen_python,
    plan_of,
    write_spec,
)

TOKENS, MAX_SEQ_LEN = 8192, 4096
TINY_LAYER = {"num_experts": 8, "embed_dim": 256, "ffn_dim": 256}
TINY_SHAPES = {"batch": 2, "seq_len": 32}
# Memory trades timed beside the plain modules (pallas kernel), keyed by the full-size layer.
TRADES: dict[tuple[int, int, int, int], dict[str, dict[str, int]]] = {
    (8, 4096, 14336, 2): {"token_chunks4": {"token_chunks": 4}, "ffn_chunks2": {"ffn_chunks": 2}},
    (128, 2048, 768, 8): {"token_chunks4": {"token_chunks": 4}},
}
# Keys that only mean something on several devices (or point at files of the source spec).
DROPPED_KEYS = ("parallelism", "memory")
SIMPLE_PARAMS = {"router", "w_gate", "w_up", "w_down"}
# ReferenceConfig fields the simple reference (tpu_check_peers.reference) handles only at
# these values; top_k, score, renormalize, routed_scaling, activation and the aux losses
# (not part of y) it follows whatever they are.
SIMPLE_DEFAULTS: dict[str, Any] = {
    "renormalize_epsilon": 0.0, "bias_on_logits": False, "logit_softcap": None,
    "router_norm_eps": None, "expert_norm_eps": None, "gelu_tanh": False,
    "score_after_top_k": False, "num_groups": 1, "top_groups": 1, "capacity": None,
    "weights_on_input": False, "gate_limit": None, "up_limit": None, "sigmoid_scale": 1.0,
    "up_offset": 0.0, "gate_clamp_after": False, "gate_softcap": None, "up_softcap": None,
    "shared_glu": None, "identity_experts": 0, "zero_experts": 0, "weighed_shared_experts": 0,
}  # fmt: skip
REFERENCE_CONFIGS = """
import json, sys
from pathlib import Path
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.verify.verification import reference_config
print(json.dumps({p: reference_config(make_plan(load_valid(Path(p)))) for p in sys.argv[1:]}))
"""


def work_dir() -> Path:
    """$TPU_CHECK_WORK (tests prepare into a temporary folder), else .tpu_check/."""
    return Path(os.environ.get("TPU_CHECK_WORK") or ROOT / ".tpu_check")


def tpu_specs() -> list[Path]:
    """Committed specs whose target is a TPU (tpu-v5e, tpu-v5p, tpu-v6e, tpu7x, ...)."""
    listed = subprocess.run(
        ["git", "ls-files", "specs/*.yaml"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    out = []
    for name in sorted(listed):
        spec = yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))
        if str(spec.get("target", {}).get("hardware", "")).startswith("tpu"):
            out.append(ROOT / name)
    return out


def one_chip(spec: dict[str, Any], tiny: bool) -> tuple[dict[str, Any], list[str]]:
    """The spec's layer on one chip (tiny: shrunk, for a CPU), and what was changed."""
    out = copy.deepcopy(spec)
    notes = [f"dropped {key}" for key in DROPPED_KEYS if out.pop(key, None) is not None]
    out["mesh"] = {"axes": {"fsdp": 1}}
    shapes = out["shapes"]
    if shapes.pop("variants", None) is not None:
        notes.append("dropped shape variants")
    if tiny:
        out["layer"].update(TINY_LAYER)
        if "shared_ffn_dim" in out["layer"]:
            out["layer"]["shared_ffn_dim"] = TINY_LAYER["ffn_dim"]
        router = out["router"]
        router["top_k"] = min(router["top_k"], 2)
        if "group_limit" in router:
            router["group_limit"] = {"groups": 4, "keep": 2}
        out["shapes"] = dict(TINY_SHAPES)
        out["target"] = {"hardware": "cpu", "kernel": "xla"}
        return out, notes
    seq_len = min(int(shapes["seq_len"]), MAX_SEQ_LEN)
    out["shapes"] = {"batch": max(1, TOKENS // seq_len), "seq_len": seq_len}
    out["target"] = {"hardware": "tpu-v5e", "topology": "1x1", "kernel": "pallas"}
    return out, notes


def layer_key(spec: dict[str, Any]) -> tuple[int, int, int, int]:
    layer = spec["layer"]
    return (layer["num_experts"], layer["embed_dim"], layer["ffn_dim"], spec["router"]["top_k"])


def plan_figures(plan: dict[str, Any]) -> dict[str, Any]:
    """What the plan says about memory and time (roofline bounds) of the one-chip layer."""
    memory, cost = plan.get("memory", {}), plan.get("cost", {})
    out: dict[str, Any] = {
        "forward_peak_bytes": memory.get("forward_peak"),
        "train_peak_bytes": memory.get("train_peak"),
        "param_bytes": cost.get("param_bytes"),
        "forward_flops": cost.get("forward_flops"),
        "train_flops": cost.get("train_flops"),
    }
    for p in plan.get("roofline", {}).get("passes", []):
        key = "forward" if p["name"] == "forward" else "forward_backward"
        out[f"{key}_bound_s"] = p.get("bound_s")
        out[f"{key}_bound_by"] = p.get("bound_by")
    return out


def shapes_of(plan: dict[str, Any]) -> dict[str, Any]:
    ffn = plan["ffn"]
    return {
        "experts": plan["num_experts"], "embed": plan["embed_dim"], "ffn": plan["ffn_dim"],
        "top_k": plan["router"]["top_k"], "tokens": plan["global_tokens"],
        "batch": plan["batch"], "seq_len": plan["seq_len"], "param_dtype": plan["param_dtype"],
        "compute_dtype": plan["compute_dtype"], "activation": ffn["activation"],
        "gated": bool(ffn["gated"]),
    }  # fmt: skip


def forward_flops(s: dict[str, Any]) -> int:
    """Useful FLOPs of one forward pass: the routed experts' matmuls and the router."""
    per_copy = 2 * s["embed"] * s["ffn"] * (3 if s["gated"] else 2)
    return s["tokens"] * s["top_k"] * per_copy + 2 * s["tokens"] * s["embed"] * s["experts"]


def reference_choice(
    cfg: dict[str, Any], plan: dict[str, Any], s: dict[str, Any]
) -> dict[str, Any]:
    """Which f32 reference checks this module: "simple" (tpu_check_peers.reference), "dense"
    (moegen's, copied), or "none" with the reason."""
    params = {p["name"] for p in plan["params"]}
    unusual = sorted(k for k, v in SIMPLE_DEFAULTS.items() if cfg.get(k, v) != v)
    unusual += sorted(params - SIMPLE_PARAMS)
    if cfg["score"] not in ("softmax", "sigmoid"):
        unusual.append(f"score {cfg['score']}")
    if not unusual:
        return {"kind": "simple", "config": cfg}
    whole_bytes = 12 * s["tokens"] * s["experts"] * s["ffn"]  # [tokens, experts, ffn] f32 x 3
    if cfg.get("capacity") is not None and whole_bytes > 2 * 2**30:
        return {
            "kind": "none",
            "reason": "capacity drops need the dense reference on every token at once: "
            f"{whole_bytes / 2**30:.0f} GiB of [tokens, experts, ffn] is too much",
        }
    # moegen's reference holds float32 copies of all parameters and their gradients, on top
    # of the module's parameters and gradients.
    param_bytes = int(plan["cost"]["param_bytes"])
    f32_bytes = param_bytes * (1 if s["param_dtype"] == "float32" else 2)
    need = 2 * param_bytes + 2 * f32_bytes
    if need > 0.9 * HBM_BYTES:
        return {
            "kind": "none",
            "reason": f"features {', '.join(unusual)} need moegen's dense reference, whose float32 "
            f"parameters and gradients beside the module's take ~{need / 2**30:.0f} GiB",
        }
    return {"kind": "dense", "config": cfg, "features": unusual}


def routing_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the peers need to route like the layer (a score they lack: softmax, noted)."""
    score = cfg["score"] if cfg["score"] in ("softmax", "sigmoid") else "softmax"
    keys = ("top_k", "renormalize", "routed_scaling", "activation")
    return {"score": score, **{k: cfg[k] for k in keys}, "layer_score": cfg["score"]}


def reference_configs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """moegen's ReferenceConfig fields of each spec (a child process: moegen is not imported)."""
    command = [moegen_python(), "-c", REFERENCE_CONFIGS, *map(str, paths)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(result.stdout)


def build(paths: list[Path], out: Path) -> dict[Path, str]:
    """`moegen build --no-verify` of every spec; {spec: error} of those that failed (all of
    them are built one by one where the build of them all together fails)."""
    base = [moegen_python(), "-m", "moegen", "build", "--no-verify", "--out", str(out)]
    print(f"$ moegen build --no-verify --out {out} <{len(paths)} specs>", flush=True)
    if subprocess.run([*base, *map(str, paths)], cwd=ROOT).returncode == 0:
        return {}
    failed = {}
    for path in paths:
        result = subprocess.run([*base, str(path)], cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            failed[path] = (result.stderr.strip() or result.stdout.strip())[-600:]
    return failed


def candidates(
    sources: list[Path], specs_dir: Path, tiny: bool, kernels: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One-chip layers (deduplicated: several sources may be the same layer on one chip) with
    their plans, and the skipped ones with their reasons."""
    layers: dict[str, dict[str, Any]] = {}
    skipped = []
    for source in sorted(sources, key=lambda p: (len(p.stem), p.stem)):  # short names first
        spec = yaml.safe_load(source.read_text(encoding="utf-8"))
        chip, notes = one_chip(spec, tiny)
        key = json.dumps({k: v for k, v in chip.items() if k != "description"}, sort_keys=True)
        rel = str(source.relative_to(ROOT))
        if key in layers:
            layers[key]["sources"].append(rel)
            continue
        name = source.stem + ("_tiny" if tiny else "_1chip")
        chip["description"] = f"tpu_check: {rel} on one chip" + (" (tiny)" if tiny else "")
        others = [{"target": {"kernel": kernel}} for kernel in kernels if kernel != "pallas"]
        others += [{"memory": trade} for trade in TRADES.get(layer_key(spec), {}).values()]
        plan, why = fitting_plan(specs_dir / f"{name}_pallas.yaml", chip, notes, tiny, others)
        if plan is None:
            skipped.append({"sources": [rel], "reason": why})
            print(f"skip {rel}: {why}", flush=True)
            continue
        layers[key] = {"name": name, "spec": chip, "plan": plan, "notes": notes,
                       "sources": [rel], "full_key": layer_key(spec)}  # fmt: skip
    # Layers with memory trades (Mixtral, Qwen3-30B-A3B) first: the run may end at its budget.
    ordered = sorted(layers.values(), key=lambda layer: layer["full_key"] not in TRADES)
    return ordered, skipped


def variants_of(
    layer: dict[str, Any], kernels: list[str], trades: bool, f32: bool
) -> list[tuple[str, str, str | None, dict]]:
    """(module name, kernel, trade, spec) of every module built for a layer: one a kernel, and
    (where `trades`) its memory trades with the first kernel; `f32`: one with float32 compute
    too, whose parity is held to the float32 tolerance (the tiny CPU run)."""
    out = []
    for kernel in kernels:
        spec = copy.deepcopy(layer["spec"])
        spec["target"]["kernel"] = kernel
        out.append((f"{layer['name']}_{kernel}", kernel, None, spec))
    if f32:
        spec = copy.deepcopy(layer["spec"])
        spec["dtypes"] = {"params": "float32", "compute": "float32"}
        out.append((f"{layer['name']}_xla_f32", "xla", "float32_compute", spec))
    for trade, memory in TRADES.get(layer["full_key"], {}).items() if trades else ():
        spec = copy.deepcopy(layer["spec"])
        spec["target"]["kernel"] = kernels[0]
        spec["memory"] = dict(memory)
        out.append((f"{layer['name']}_{kernels[0]}_{trade}", kernels[0], trade, spec))
    return out


def entry(
    layer: dict[str, Any], name: str, kernel: str, trade: str | None, plan: dict, cfg: dict
) -> dict[str, Any]:
    s = shapes_of(plan)
    return {
        "name": name, "file": f"modules/{name}.py", "spec": f"specs/{name}.yaml",
        "source_specs": layer["sources"], "kernel": kernel, "trade": trade, "shapes": s,
        "flops": {"forward": forward_flops(s), "forward_backward": 3 * forward_flops(s)},
        "plan": plan_figures(plan), "reference": reference_choice(cfg, plan, s),
        "routing": routing_of(cfg),
        "notes": layer["notes"],
    }  # fmt: skip


def prepare(args: argparse.Namespace) -> int:
    work = work_dir()
    if work.exists():
        shutil.rmtree(work)
    specs_dir, modules_dir = work / "specs", work / "modules"
    layers, skipped = candidates(tpu_specs(), specs_dir, args.tiny, args.kernels)
    for path in specs_dir.glob("*.yaml"):  # the fit trials: rewritten below as modules
        path.unlink()
    modules, traded, f32_done = [], set(), set()
    for layer in layers:  # trades once a layer (not at another seq_len)
        trades = layer["full_key"] not in traded
        traded.add(layer["full_key"])
        shared = "shared_ffn_dim" in layer["spec"]["layer"]  # tiny: float32 with and without
        f32 = args.tiny and shared not in f32_done
        f32_done.add(shared)
        for name, kernel, trade, spec in variants_of(layer, args.kernels, trades, f32):
            modules.append(
                (layer, name, kernel, trade, write_spec(specs_dir / f"{name}.yaml", spec))
            )
    paths = [m[-1] for m in modules]
    configs = reference_configs(paths)
    failed = build(paths, modules_dir)
    entries = []
    for layer, name, kernel, trade, path in modules:
        if path in failed:
            why = f"build failed: {failed[path]}"
            skipped.append({"sources": layer["sources"], "module": name, "reason": why})
            continue
        plan = layer["plan"] if trade is None and kernel == "pallas" else plan_of(path)[0]
        entries.append(entry(layer, name, kernel, trade, plan or layer["plan"], configs[str(path)]))
    copy_reference(ROOT, work)
    kernels = kernel_modules(ROOT, work, args.tiny, moegen_python())
    manifest = {
        "prepared_at": time.strftime("%Y-%m-%d %H:%M:%S %z"), "tiny": args.tiny,
        "commit": _git("rev-parse", "HEAD"), "hbm_bytes_limit": HBM_BYTES,
        "modules": entries, "kernels": kernels, "skipped": skipped,
    }  # fmt: skip
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    for e in entries:
        print(f"built   {e['name']:<44} from {', '.join(e['source_specs'])}")
    for s in skipped:
        print(f"skipped {', '.join(s['sources'])}: {s['reason'].splitlines()[0][:200]}")
    print(f"prepared {len(entries)} modules and {len(kernels)} kernel checks, {len(skipped)} "
          f"skipped, in {work} ({size >> 10} KiB)")  # fmt: skip
    return 0 if entries else 1


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny layers, kernel xla, cpu")
    parser.add_argument("--kernels", default="pallas,xla", help="comma-separated kernels")
    args = parser.parse_args(argv)
    args.kernels = [k for k in args.kernels.split(",") if k]
    args.kernels = ["xla"] if args.tiny else args.kernels
    return prepare(args)


if __name__ == "__main__":
    sys.exit(main())
