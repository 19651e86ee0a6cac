"""Benchmark: how long moegen takes on the worst specs that pass the size limit (16 KiB).

    python -m bench.validate_worst [--limit SECONDS] [--only NAME ...]

Specs are untrusted input (`moegen check` runs on pull requests), so the time of the stages
that run on every spec must not grow with the values written in it. Each case below is a spec
built to make one stage do as much work as the rules allow: huge expert counts with a group
limit, a huge mesh axis split over slices, huge widths for the tile search, huge batches,
long lists, thousands of unknown keys, deep nesting, the whole 16 KiB. For each, the time of
`load + validate` and of `plan + render` (what `moegen check` and `moegen build --no-verify`
run: `moegen.pipeline.generate`, render included, through ruff) is printed with the outcome
(valid, or exit 3 with the first diagnostic), then the worst of each column.

A stage that runs past --limit seconds (default 60) is stopped and shown as "> LIMIT".
This is a benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import copy
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from moegen.diagnostics import SpecError
from moegen.load import MAX_SPEC_BYTES
from moegen.pipeline import generate

INT32_MAX = 2**31 - 1

BASE: dict = {
    "version": 1,
    "description": "worst case",
    "layer": {"num_experts": 8, "embed_dim": 512, "ffn_dim": 1792},
    "router": {"top_k": 2, "renormalize": True},
    "shapes": {"batch": 16, "seq_len": 256},
    "dtypes": {"params": "float32", "compute": "bfloat16"},
    "mesh": {"axes": {"data": 2, "fsdp": 4}},
    "target": {"hardware": "cpu", "kernel": "xla"},
}


def _spec(**sections: dict) -> str:
    """BASE with whole sections replaced (None removes one), as YAML text."""
    spec = copy.deepcopy(BASE)
    for name, value in sections.items():
        if value is None:
            spec.pop(name, None)
        else:
            spec[name] = value
    return yaml.safe_dump(spec, sort_keys=False)


def _one_pallas_chip(layer: dict, **sections: dict) -> str:
    """One v5e chip, one token: the tile search gets the widest layer the int32 rule allows."""
    return _spec(
        layer=layer,
        router={"top_k": 1},
        shapes={"batch": 1, "seq_len": 1},
        mesh={"axes": {"data": 1}},
        target={"hardware": "tpu-v5e", "topology": "1x1", "kernel": "pallas"},
        **sections,
    )


def _padded_to_limit(text: str) -> str:
    """`text` followed by comment lines up to exactly MAX_SPEC_BYTES bytes."""
    line = "# " + "x" * 77 + "\n"
    body = text + line * ((MAX_SPEC_BYTES - len(text)) // len(line))
    return body + "#" * (MAX_SPEC_BYTES - len(body) - 1) + "\n"


def _unknown_keys(count: int | None = None) -> str:
    """`count` unknown top-level keys after a valid spec (None: as many as fit the size limit)."""
    head = _spec()
    if count is None:
        count = (MAX_SPEC_BYTES - len(head)) // len("u00000: 0\n")
    return head + "".join(f"u{i:05d}: 0\n" for i in range(count))


def _at_limit_end(tail: str) -> str:
    """Unknown keys up to the size limit, then `tail`."""
    keys = _unknown_keys()
    return keys[: MAX_SPEC_BYTES - len(tail) - 16].rsplit("\n", 1)[0] + "\n" + tail


def _nested(depth: int, under: str = "nested: ") -> str:
    """A value nested `depth` flow sequences deep: under an unknown key, or in place of a
    known field's value (`under` = "  num_experts: ")."""
    value = "[" * depth + "1" + "]" * depth
    head = _spec()
    if under.startswith(" "):
        return head.replace(under + "8", under + value, 1)
    return head + under + value + "\n"


def _long_list(item: str) -> str:
    head = _spec()
    count = (MAX_SPEC_BYTES - len(head) - 64) // (len(item) + 2)
    return head.replace("mesh:\n", "mesh:\n  batch_axes: [" + ", ".join([item] * count) + "]\n", 1)


E30 = 2**30
CASES: dict[str, Callable[[], str]] = {
    "reference (mixtral_small_cpu)": lambda: _spec(),
    # router.group_limit: the divisors of the expert count, the keeps of each group count
    "experts 2^31-1 (prime), groups 2": lambda: _spec(
        layer={"num_experts": INT32_MAX, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 2, "group_limit": {"groups": 2, "keep": 1}},
    ),
    "experts 2^30, groups 2^30, keep 3": lambda: _spec(
        layer={"num_experts": E30, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 2, "group_limit": {"groups": E30, "keep": 3}},
    ),
    "experts 2^30, top_k 2^30-1, groups 2": lambda: _spec(
        layer={"num_experts": E30, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": E30 - 1, "group_limit": {"groups": 2, "keep": 1}},
    ),
    "experts 735134400 (1344 divisors), no keep": lambda: _spec(
        layer={"num_experts": 735134400, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 735134399, "group_limit": {"groups": 2, "keep": 1}},
    ),
    "experts 4096, top_k 735134400, groups 2": lambda: _spec(
        layer={"num_experts": 4096, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 735134400, "group_limit": {"groups": 2, "keep": 1}},
    ),
    # mesh: a huge axis split over slices, huge axes elsewhere
    "data 2^31-1 over dcn_axes 2": lambda: _spec(
        mesh={"axes": {"data": INT32_MAX}, "dcn_axes": {"data": 2}},
        target={"hardware": "tpu-v5e", "topology": "16x16", "slices": 2},
    ),
    "data 735134400 over dcn_axes 19": lambda: _spec(
        mesh={"axes": {"data": 735134400}, "dcn_axes": {"data": 19}},
        target={"hardware": "tpu-v5p", "topology": "16x16x24", "slices": 19},
    ),
    "every axis 2^31-1": lambda: _spec(
        mesh={"axes": {"data": INT32_MAX, "fsdp": INT32_MAX, "expert": INT32_MAX}},
        parallelism={"experts": "ragged_all_to_all"},
    ),
    "largest v5p: 16x16x24 x 64 slices": lambda: _spec(
        layer={"num_experts": 256, "embed_dim": 7168, "ffn_dim": 2048},
        router={"top_k": 8},
        shapes={"batch": 393216, "seq_len": 4},
        mesh={"axes": {"data": 384, "fsdp": 64, "expert": 16}, "dcn_axes": {"data": 64}},
        parallelism={"experts": "ragged_all_to_all"},
        target={"hardware": "tpu-v5p", "topology": "16x16x24", "slices": 64, "kernel": "pallas"},
    ),
    # widths: the megablox tile search, the FFN slice counts
    "pallas ffn 2^31-128 (whole lanes)": lambda: _one_pallas_chip(
        {"num_experts": 1, "embed_dim": 128, "ffn_dim": INT32_MAX + 1 - 128}
    ),
    "pallas ffn 2^31-1 (ragged lanes)": lambda: _one_pallas_chip(
        {"num_experts": 1, "embed_dim": 128, "ffn_dim": INT32_MAX}
    ),
    "pallas embed 2^31-128, ffn 384": lambda: _one_pallas_chip(
        {"num_experts": 1, "embed_dim": INT32_MAX + 1 - 128, "ffn_dim": 384}
    ),
    "pallas ffn 367567200 (whole lanes, many divisors)": lambda: _one_pallas_chip(
        {"num_experts": 2, "embed_dim": 1408, "ffn_dim": 367567200 // 128 * 128}
    ),
    "pallas pinned tiles 2^31-1": lambda: _one_pallas_chip(
        {"num_experts": 8, "embed_dim": 512, "ffn_dim": 1024},
        memory={"ffn_chunks": 1},
    ).replace(
        "kernel: pallas\n",
        "kernel: pallas\n  tiles: {gate_up: [2147483647, "
        "2147483647, 2147483647], down: [2147483647, 2147483647, 2147483647]}\n",
    ),
    "xla embed and ffn 2^31-1": lambda: _spec(
        layer={"num_experts": INT32_MAX, "embed_dim": INT32_MAX, "ffn_dim": INT32_MAX},
    ),
    "ffn_chunks 2^31-1": lambda: _spec(memory={"ffn_chunks": INT32_MAX}),
    "ffn 2^20 in 2^20 slices": lambda: _spec(
        layer={"num_experts": 8, "embed_dim": 64, "ffn_dim": 2**20},
        shapes={"batch": 8, "seq_len": 8},
        memory={"ffn_chunks": 2**20},
    ),
    "overlap_chunks 2^31-1 (ring)": lambda: _spec(
        mesh={"axes": {"expert": 8}},
        parallelism={"experts": "ring_of_experts", "overlap_chunks": INT32_MAX},
    ),
    # shapes: batch x seq_len as large as int32 indexing allows, and past it
    "batch and seq_len 2^31-1": lambda: _spec(shapes={"batch": INT32_MAX, "seq_len": INT32_MAX}),
    "2^30 tokens over 256 cpu devices": lambda: _spec(
        layer={"num_experts": 8, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 1},
        shapes={"batch": 2**22, "seq_len": 256},
        mesh={"axes": {"data": 256}},
    ),
    "capacity factor 1024, 2^30 tokens": lambda: _spec(
        layer={"num_experts": 8, "embed_dim": 8, "ffn_dim": 8},
        router={"top_k": 1, "load_balance_loss": 0.01, "capacity": {"factor": 1024.0}},
        shapes={"batch": 2**22, "seq_len": 256},
        mesh={"axes": {"data": 256}},
    ),
    # the loader: length, keys, nesting
    "batch_axes: as many data as fit": lambda: _long_list("data"),
    "unknown keys filling the limit": lambda: _unknown_keys(),
    # the same read by PyYAML's pure-Python parser (libyaml's reading is not taken): its
    # error at the end, a tab, a tag
    "unknown keys filling the limit, then a syntax error": lambda: _at_limit_end("a: [\n"),
    "unknown keys filling the limit, then a tab": lambda: _at_limit_end("t:\t1\n"),
    "unknown keys filling the limit, then a tag": lambda: _at_limit_end("g: !x 1\n"),
    "1000 unknown keys": lambda: _unknown_keys(1000),
    "nested 30 deep, unknown key": lambda: _nested(30),
    "nested 30 deep, in num_experts": lambda: _nested(30, "  num_experts: "),
    "nested 300 deep, unknown key": lambda: _nested(300),
    "the limit: valid spec and comments": lambda: _padded_to_limit(_spec()),
    "the limit: description": lambda: _spec().replace(
        "description: worst case", "description: " + "x" * (MAX_SPEC_BYTES - len(_spec()) - 64)
    ),
}


class _Overrun(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _Overrun


def _timed(limit: float, stage: Callable[[], object]) -> tuple[float | None, object]:
    """Seconds `stage` took and what it returned or raised (None seconds: past `limit`)."""
    signal.setitimer(signal.ITIMER_REAL, limit)
    start = time.perf_counter()
    try:
        result: object = stage()
    except _Overrun:
        return None, None
    except Exception as err:  # noqa: BLE001 - a benchmark reports whatever happens
        result = err
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return time.perf_counter() - start, result


def run_case(text: str, workdir: Path, limit: float) -> tuple[float | None, float | None, str]:
    """(load + validate seconds, plan + render seconds, outcome) of one spec text."""
    path = workdir / "worst.yaml"
    path.write_bytes(text.encode("utf-8"))
    stages: dict[str, float] = {}

    def progress(spec: str, step: str, seconds: float, details: dict) -> None:
        stages[step] = seconds

    seconds, result = _timed(limit, lambda: generate(path, progress))
    if seconds is None:
        # the stage that was running is the first one not reported
        if "load + validate" not in stages:
            return None, None, f"stopped after {limit:g} s in load + validate"
        return stages["load + validate"], None, f"stopped after {limit:g} s in plan + render"
    validate_s = stages.get("load + validate", seconds)
    if isinstance(result, SpecError):
        first = result.diagnostics[0]
        message = f"{first.line}:{first.column} {first.field}: {first.message}"
        count = len(result.diagnostics)
        return validate_s, None, f"exit 3 ({count}): {message[:110]}"
    if isinstance(result, Exception):
        return validate_s, None, f"CRASH {type(result).__name__}: {str(result)[:100]}"
    plan_render = stages.get("plan", 0.0) + stages.get("render", 0.0)
    return validate_s, plan_render, "valid, rendered"


def _cell(seconds: float | None, limit: float, ran: bool) -> str:
    if seconds is None:
        return f"> {limit:g}" if ran else "-"
    return f"{seconds:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--only", nargs="*", help="run the cases whose names contain these")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _on_alarm)
    names = [n for n in CASES if not args.only or any(part in n for part in args.only)]
    width = max(map(len, names))
    print(
        f"{'case':<{width}}  {'bytes':>6}  {'load+validate s':>15}  {'plan+render s':>13}  outcome"
    )
    worst = {"validate": (0.0, ""), "plan": (0.0, "")}
    with tempfile.TemporaryDirectory(prefix="moegen-worst-") as tmp:
        for name in names:
            text = CASES[name]()
            validate_s, plan_s, outcome = run_case(text, Path(tmp), args.limit)
            stopped = outcome.startswith("stopped")
            validate_cell = _cell(validate_s, args.limit, stopped)
            plan_cell = _cell(plan_s, args.limit, stopped and validate_s is not None)
            size = len(text.encode("utf-8"))
            print(f"{name:<{width}}  {size:>6}  {validate_cell:>15}  {plan_cell:>13}  {outcome}")
            sys.stdout.flush()
            for key, value, ran in (
                ("validate", validate_s, stopped),
                ("plan", plan_s, stopped and validate_s is not None),
            ):
                seconds = args.limit if value is None and ran else value or 0.0
                if seconds > worst[key][0]:
                    worst[key] = (seconds, name)
    print(f"worst load + validate: {worst['validate'][0]:.3f} s ({worst['validate'][1]})")
    print(f"worst plan + render:   {worst['plan'][0]:.3f} s ({worst['plan'][1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
