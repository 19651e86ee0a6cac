"""The benchmark's report: bench/RESULTS.md from the results bench.measure collected (pure)."""

from __future__ import annotations

from typing import Any

from bench.report_notes import READING_NOTES

# the generated layer and the baselines it is measured against (bench.baselines)
VARIANTS = ("moegen", "dense_dispatch", "ragged_dot")
BASELINE_NAMES = VARIANTS[1:]

LABELS = {
    "moegen": "moegen",
    "moegen_whole": "moegen, whole FFN (memory.ffn_chunks 1)",
    "moegen_xla": "moegen, kernel xla",
    "dense_dispatch": "dense dispatch",
    "ragged_dot": "ragged_dot",
}


def _counters(spec: dict, variant: str) -> dict | None:
    outcome = spec["variants"].get(variant) or {}
    return outcome.get("counters")


def _operand_bytes(spec: dict, variant: str) -> float | None:
    """Bytes accessed with each kernel call counted as XLA counts a dot: operands and result
    once (moegen.verify.hlo.loops.kernel_tile_bytes); the same as bytes accessed without kernels."""
    outcome = spec["variants"].get(variant) or {}
    if "counters" not in outcome:
        return None
    return outcome["counters"]["bytes_accessed"] - outcome.get("kernel_tile_bytes", 0.0)


# The compiled metrics compared with each baseline (ratios, losses): label, value of a variant
# that has counters, format, unit.
COMPARED = (
    ("compiled flops", lambda spec, v: _counters(spec, v)["flops"], "{:.4g} TFLOP", 1e12),
    ("bytes accessed", lambda spec, v: _counters(spec, v)["bytes_accessed"], "{:.4g} GB", 1e9),
    (
        "bytes accessed, kernel operands once",
        lambda spec, v: _operand_bytes(spec, v),
        "{:.4g} GB",
        1e9,
    ),
    ("peak memory", lambda spec, v: _counters(spec, v)["memory"]["peak"], "{:.4g} GiB", 2**30),
    (
        "exposed collective bytes",
        lambda spec, v: _counters(spec, v)["collectives"]["exposed_bytes"],
        "{:.4g} MiB",
        2**20,
    ),
)


def _fmt(value: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def _exposed(c: dict) -> tuple[int, int, float]:
    col = c["collectives"]
    return col["exposed"], col["total"], col["exposed_bytes"]


def _times(a: float, b: float) -> str:
    """How much larger a is than b, readable when they are close."""
    if not b:
        return "the baseline has none"
    ratio = a / b
    return f"+{(ratio - 1) * 100:.2g}%" if ratio < 1.005 else f"{ratio:.2f}x"


def losses(spec: dict) -> list[str]:
    """Each metric where a baseline does better than the generated layer, in words."""
    found = []
    mine = _counters(spec, "moegen")
    cpu = (spec.get("cpu") or {}).get("variants", {})
    for base in BASELINE_NAMES:
        theirs = _counters(spec, base)
        label = LABELS[base]
        if mine and theirs:
            for what, value, fmt, unit in COMPARED:
                a, b = value(spec, "moegen"), value(spec, base)
                if a > b:
                    found.append(
                        f"{spec['name']}: {what}: moegen {fmt.format(a / unit)} > "
                        f"{label} {fmt.format(b / unit)} ({_times(a, b)})"
                    )
        for mine_cpu in ("moegen", "moegen_xla"):
            if mine_cpu not in cpu or base not in cpu:
                continue
            a, b = cpu[mine_cpu]["median_s"], cpu[base]["median_s"]
            if a > b:
                kernel = ", kernel xla" if mine_cpu == "moegen_xla" else ""
                found.append(
                    f"{spec['name']}: CPU twin wall time: moegen{kernel} {a * 1e3:.1f} ms > "
                    f"{label} {b * 1e3:.1f} ms ({_times(a, b)})"
                )
    return found


def format_report(results: dict[str, Any]) -> str:
    """The markdown of bench/RESULTS.md from the collected results (pure)."""
    out = _intro(results) + _counters_table(results)
    out += memory_section(results)
    out += _ratios_table(results) + _cpu_table(results) + _losses_and_notes(results)
    tool = results.get("tool")
    return "\n".join(out + (_tool_section(tool) if tool else []))


def _intro(results: dict[str, Any]) -> list[str]:
    """The title, the command and what the figures are."""
    out: list[str] = []
    w = out.append
    w("# Benchmark: generated layers against plain-JAX baselines")
    w("")
    w(f"Produced by one command, from the repository root ({results['date']}):")
    w("")
    w("```sh")
    w(results["command"])
    w("```")
    w("")
    w(f"Total run time: {results['total_seconds']:.0f} s on {results['machine']}.")
    w("Versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()) + ".")
    w("")
    w(
        "Forward+backward (gradients of sum(y) with respect to every parameter and x) of each "
        "layer, compiled for the spec's TPU slice on compile-only devices (libtpu, no TPU), one "
        "fresh process per compile. All figures are **per device**, from the compiled program: "
        "`cost_analysis()` flops and bytes accessed (never `optimal_seconds`), `memory_analysis()` "
        "peak = arguments + outputs + temporaries - aliased, and the collectives of the scheduled "
        "HLO (`moegen.verify.hlo.counters`): *exposed* = synchronous, or async with no compute "
        "scheduled between start and done. Useful FLOPs: the plan's `cost.train_flops` (3 x "
        "(router + routed experts at top-k + shared expert), per device, no padding)."
    )
    w("")
    w(
        "Baselines (`bench/baselines.py`), plain `jax.jit` with the module's NamedShardings on "
        "the parameters and x, partitioned by GSPMD:"
    )
    w(
        "- **dense dispatch**: every token through every expert, a one-hot [tokens, experts] "
        "combine matrix folded into the down projection (the dropless GShard-style dense layer);"
    )
    w(
        "- **ragged_dot**: token copies sorted by expert over the global batch, "
        "`jax.lax.ragged_dot` for each projection (no planned padding, no tiles), unsorted and "
        "combined."
    )
    w("")
    return out


def _counters_table(results: dict[str, Any]) -> list[str]:
    """Each spec's compiled counters, moegen's and the baselines'."""
    out: list[str] = []
    w = out.append
    w("## TPU compiled counters (per device, forward+backward)")
    w("")
    w(
        "| spec | target | layer | compiled TFLOP | / useful | bytes accessed (GB) | "
        "bytes, kernel operands once (GB) | peak memory (GiB) | fits HBM | "
        "exposed / all collectives | exposed collective MiB | compile (s) |"
    )
    w("|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for spec in results["specs"]:
        target = f"{spec['hardware']} {spec['topology']}"
        if spec.get("skipped"):
            w(
                f"| {spec['name']} | {target} | skipped: {spec['skipped']} "
                "|  |  |  |  |  |  |  |  |  |"
            )
            continue
        for variant in [v for v in LABELS if v in spec["variants"]]:
            outcome = spec["variants"].get(variant) or {}
            label = LABELS[variant]
            if "counters" in outcome:
                c = outcome["counters"]
                exposed, total, exposed_bytes = _exposed(c)
                peak = c["memory"]["peak"]
                fits = "yes" if not spec["hbm_bytes"] or peak <= spec["hbm_bytes"] else "**no**"
                w(
                    f"| {spec['name']} | {target} | {label} | {c['flops'] / 1e12:.2f} | "
                    f"{c['flops'] / spec['useful_train_flops']:.2f} | "
                    f"{c['bytes_accessed'] / 1e9:.1f} | "
                    f"{_operand_bytes(spec, variant) / 1e9:.1f} | {peak / 2**30:.2f} | {fits} | "
                    f"{exposed} / {total} | {exposed_bytes / 2**20:.0f} | "
                    f"{outcome['seconds']:.0f} |"
                )
            elif "oom" in outcome:
                # a kernel's scoped VMEM is the plan's defect, not the layer's size
                oom = "tiles exceed scoped VMEM" if outcome.get("memory_space") == "vmem" else "OOM"
                w(
                    f"| {spec['name']} | {target} | {label} | n/a | n/a | n/a | n/a | n/a | "
                    f"**no**: compiler {oom} | n/a | n/a | {outcome['seconds']:.0f} |"
                )
            else:
                error = (outcome.get("error") or "not run").strip().splitlines()[-1][:120]
                w(
                    f"| {spec['name']} | {target} | {label} | error: `{error}` "
                    "|  |  |  |  |  |  |  |  |"
                )
    w("")
    w(
        "Useful TFLOP per device: "
        + ", ".join(f"{s['name']} {s['useful_train_flops'] / 1e12:.2f}" for s in results["specs"])
        + "."
    )
    w("")
    return out


def _ratios_table(results: dict[str, Any]) -> list[str]:
    """Each metric's baseline / moegen ratio."""
    out: list[str] = []
    w = out.append
    w("## Ratios: baseline / moegen (above 1: moegen does better)")
    w("")
    w(
        "| spec | baseline | compiled flops | bytes accessed | bytes, kernel operands once | "
        "peak memory | exposed collective bytes | CPU twin time | CPU twin time, moegen with "
        "kernel xla |"
    )
    w("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for spec in results["specs"]:
        if spec.get("skipped"):
            continue
        mine = _counters(spec, "moegen")
        cpu = (spec.get("cpu") or {}).get("variants", {})
        for base in BASELINE_NAMES:
            theirs = _counters(spec, base)
            cells = []
            for _, value, _, _ in COMPARED:
                if mine is None or theirs is None:
                    cells.append("OOM" if "oom" in (spec["variants"].get(base) or {}) else "n/a")
                    continue
                r = _ratio(value(spec, base), value(spec, "moegen"))
                cells.append("inf" if r is None and value(spec, base) else _fmt(r))
            for mine_cpu in ("moegen", "moegen_xla"):
                tr = _ratio(
                    cpu.get(base, {}).get("median_s"), cpu.get(mine_cpu, {}).get("median_s")
                )
                cells.append(_fmt(tr))
            w(f"| {spec['name']} | {LABELS[base]} | " + " | ".join(cells) + " |")
    w("")
    return out


def _cpu_table(results: dict[str, Any]) -> list[str]:
    """The twins' CPU wall times."""
    out: list[str] = []
    w = out.append
    w("## CPU wall time of the twins (forward+backward, median)")
    w("")
    w(
        "Each spec's shrunken twin (its own dtypes and mesh, fake CPU devices) and both "
        "baselines at the twin's shapes and shardings. A pallas twin runs megablox in interpret "
        "mode, so its time measures the interpreter, not the kernel; the row *moegen, kernel "
        "xla* is the same twin generated with `kernel: xla` (jax.lax.ragged_dot in the "
        "generated layer). At twin sizes (tens of tokens) the times measure per-op overhead, not "
        "arithmetic. y rel. err: relative difference of the forward output from the generated "
        "layer's (bfloat16 compute: ~1e-2 is rounding)."
    )
    w("")
    w("| spec | twin | layer | median (ms) | min (ms) | y rel. err |")
    w("|---|---|---|---:|---:|---:|")
    for spec in results["specs"]:
        cpu = spec.get("cpu")
        if not cpu:
            continue
        if "error" in cpu:
            w(
                f"| {spec['name']} | error: `{cpu['error'].strip().splitlines()[-1][:120]}` "
                "|  |  |  |  |"
            )
            continue
        twin = (
            f"{cpu['devices']} devices, {cpu['tokens']} tokens, embed {cpu['embed']}, "
            f"ffn {cpu['ffn']}, {cpu['dtype']}, {cpu['kernel']}"
        )
        for variant, r in cpu["variants"].items():
            w(
                f"| {spec['name']} | {twin} | {LABELS[variant]} | {r['median_s'] * 1e3:.1f} | "
                f"{min(r['runs_s']) * 1e3:.1f} | {r.get('y_rel_err', float('nan')):.1e} |"
            )
            twin = ""
    w("")
    return out


def _losses_and_notes(results: dict[str, Any]) -> list[str]:
    """Where a baseline does better, and how to read the figures."""
    out: list[str] = []
    w = out.append
    lost = [line for spec in results["specs"] for line in losses(spec)]
    w("## Where moegen loses")
    w("")
    if lost:
        w("Every metric on which a baseline does better than the generated layer, compiled")
        w("counters first:")
        w("")
        for line in sorted(lost, key=lambda line: "CPU twin" in line):
            w(f"- {line}")
    else:
        w("Nowhere: the generated layer does no worse than either baseline on any metric above.")
    w("")
    w("## Reading the figures")
    w("")
    for note in READING_NOTES:
        w(f"- {note}")
    w("")
    return out


def _tool_section(tool: dict[str, Any]) -> list[str]:
    """The tool's own build and check times."""
    out: list[str] = []
    w = out.append
    w("## The tool's own speed")
    w("")
    check = tool["check"]
    w(
        f"`moegen check` over all {check['specs']} specs: {check['seconds']:.1f} s "
        f"(exit {check['rc']})."
    )
    w("")
    w("| spec | `moegen build --no-verify` (s) | `moegen build` (s) | of which verify (s) |")
    w("|---|---:|---:|---:|")
    for name, r in tool["build_no_verify"].items():
        v = tool["verify"].get(name)
        rc = "" if r["rc"] == 0 else f" (exit {r['rc']})"
        full = (
            ""
            if v is None
            else f"{v['seconds']:.1f}" + ("" if v["rc"] == 0 else f" (exit {v['rc']})")
        )
        verify = "" if v is None else f"{v['verify_seconds']:.1f}"
        w(f"| {name} | {r['seconds']:.1f}{rc} | {full} | {verify} |")
    w("")
    w(
        "Each figure is the wall time of a fresh `python -m moegen` process (interpreter and "
        "import included). `moegen build` with verification is run for the cpu specs only; for "
        "TPU specs the compile times in the first table show the cost of the full-size compile."
    )
    w("")
    return out


def memory_section(results: dict[str, Any]) -> list[str]:
    """Compiled peak memory per device, forward and forward+backward, beside the plan's."""
    out = [
        "## Memory per device (compiled, and the plan's ledger)",
        "",
        "`memory_analysis()` of the compiled forward and forward+backward programs: peak = "
        "arguments + outputs + temporaries - aliased, in GB (1e9 bytes) and GiB; *plan*: the "
        "peak `moegen plan` estimates from its ledger (the backward pass of the expert FFN), "
        "and how far it is from the compiled one. FFN slices: `memory.ffn_chunks` as planned. "
        "The plan column is the ledger of the run; bench/LEDGER.md has today's ledger against "
        "every TPU example, compiled (`python -m bench.ledger`).",
        "",
        "| spec | layer | FFN slices | forward peak GB (GiB) | forward temporaries GB | "
        "fwd+bwd peak GB (GiB) | fwd+bwd temporaries GB | plan fwd+bwd GiB | plan error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for spec in results["specs"]:
        for variant, planned in (spec.get("plan_memory") or {}).items():
            outcome = spec["variants"].get(variant) or {}
            if "counters" not in outcome:
                continue
            train = outcome["counters"]["memory"]
            forward = outcome.get("forward_memory") or {}
            error = planned["train"] / train["peak"] - 1
            out.append(
                f"| {spec['name']} | {LABELS[variant]} | {planned['ffn_chunks']} | "
                + (
                    f"{forward['peak'] / 1e9:.3f} ({forward['peak'] / 2**30:.2f}) | "
                    f"{forward['temp'] / 1e9:.3f} | "
                    if forward
                    else "n/a | n/a | "
                )
                + f"{train['peak'] / 1e9:.3f} ({train['peak'] / 2**30:.2f}) | "
                f"{train['temp'] / 1e9:.3f} | {planned['train'] / 2**30:.2f} | {error:+.1%} |"
            )
    out += ["", ""]
    return out
