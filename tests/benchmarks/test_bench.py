"""bench/: the baselines compute the dense reference's function (forward and gradients) on tiny
CPU twins, and bench.report's formatting on made-up numbers. No TPU compile here: the
benchmark itself (python -m bench.run) is not a timed test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from spec_builder import spec_yaml

from bench.baselines import BASELINES, baseline, unsupported
from bench.report import format_report, losses
from moegen.load import load_spec, load_spec_bytes
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import reference_config, twin_of
from moegen.verify.reference.layer import ReferenceConfig, dense_moe

REPO = Path(__file__).resolve().parents[2]

# Router and expert features the example specs do not all combine: a routing bias (it steers
# selection only), sqrtsoftplus scores, routed scaling, a plain activation and FFN biases.
FEATURES_SPEC = spec_yaml(
    {
        "description": "baselines feature check",
        "experts": 8,
        "embed": 64,
        "ffn": 48,
        "activation": "relu",
        "ffn_bias": True,
        "top_k": 3,
        "score": "sqrtsoftplus",
        "renormalize": True,
        "routed_scaling": 2.0,
        "routing_bias": True,
        "batch": 4,
        "seq_len": 8,
        "params_dtype": "float32",
        "compute_dtype": "float32",
        "axes": {"fsdp": 2},
        "hardware": "cpu",
        "kernel": "xla",
    }
)


def _twin(loaded, tmp_path: Path):
    twin = twin_of(loaded, dtype="float32")
    plan = make_plan(twin, interpret=True)
    path = tmp_path / f"{plan.module_name}_twin.py"
    path.write_text(render(plan), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"bench_twin_{plan.module_name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, ReferenceConfig(**reference_config(plan))


def _twin_of_example(name: str, tmp_path: Path):
    return _twin(validate(load_spec(REPO / "specs" / f"{name}.yaml")), tmp_path)


def _relative(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want)) / max(float(np.linalg.norm(want)), 1e-30)


@pytest.mark.parametrize(
    "source",
    [
        "mixtral_small_cpu",  # softmax, renormalised, swiglu
        "qwen2_57b_a14b_v6e",  # softmax top-8, a sigmoid-gated shared expert
        "ernie45_21b_a3b_v5p",  # softmax probabilities + selection bias, a shared expert
        "features",
    ],
)
def test_baselines_match_the_dense_reference_on_a_twin(source: str, tmp_path: Path) -> None:
    if source == "features":
        loaded = validate(
            load_spec_bytes(FEATURES_SPEC.encode(), "specs/features.yaml", "features")
        )
        module, cfg = _twin(loaded, tmp_path)
        assert "routing_bias" in module.PARAM_SHAPES and "b_up" in module.PARAM_SHAPES
    else:
        module, cfg = _twin_of_example(source, tmp_path)
    assert unsupported(cfg) is None
    rng = np.random.default_rng(0)
    params = {
        name: jnp.asarray(rng.normal(0.0, module.INIT_SCALES[name] or 0.1, shape), jnp.float32)
        for name, shape in module.PARAM_SHAPES.items()
    }
    x = jnp.asarray(rng.normal(0.0, 1.0, module.INPUT_SHAPE), jnp.float32)
    cotangent = jnp.asarray(rng.normal(0.0, 1.0, module.INPUT_SHAPE), jnp.float32)

    def forward_and_grads(layer):
        """y and the gradients of sum(y * cotangent) w.r.t. params and x, in one compile."""

        def run(p, xs):
            y, pull = jax.vjp(layer, p, xs)
            return y, pull(cotangent.astype(y.dtype))

        return jax.jit(run)

    want_y, (want_grads, want_grad_x) = forward_and_grads(lambda p, xs: dense_moe(p, xs, cfg)[0])(
        params, x
    )
    for name in BASELINES:
        y, (grads, grad_x) = forward_and_grads(baseline(name, module, cfg))(params, x)
        assert y.shape == module.INPUT_SHAPE and y.dtype == module.COMPUTE_DTYPE
        assert _relative(y, want_y) < 1e-5, (name, _relative(y, want_y))
        assert _relative(grad_x, want_grad_x) < 1e-5, name
        for key in params:
            if key == "routing_bias":  # selection only: zero gradient in both
                assert not np.any(np.asarray(grads[key]))
                assert not np.any(np.asarray(want_grads[key]))
                continue
            assert _relative(grads[key], want_grads[key]) < 1e-5, (name, key)


def test_unsupported_features_are_named(tmp_path: Path) -> None:
    _, cfg = _twin_of_example("deepseek_v3_v5p", tmp_path)
    assert "group-limited routing" in unsupported(cfg)
    capped = ReferenceConfig(top_k=2, score="softmax", capacity=4, load_balance_weight=0.01)
    assert unsupported(capped) == "capacity (token dropping), auxiliary losses"
    _, llama4 = _twin_of_example("llama4_scout_v5e", tmp_path)
    assert unsupported(llama4) == "combine weights on the expert input"
    _, gpt_oss = _twin_of_example("gpt_oss_120b_v6e", tmp_path)
    assert unsupported(gpt_oss) == "a clamped or scaled gated activation"
    with pytest.raises(ValueError, match="group-limited"):
        baseline("dense_dispatch", None, cfg)
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline("einsum", None, capped)


# --------------------------------------------------------------------------------------
# The report, on made-up numbers.
# --------------------------------------------------------------------------------------


def _counters(flops: float, nbytes: float, peak: int, exposed: int, total: int, exposed_bytes: int):
    return {
        "flops": flops,
        "bytes_accessed": nbytes,
        "transcendentals": 0.0,
        "memory": {
            "argument": peak,
            "output": 0,
            "temp": 0,
            "alias": 0,
            "generated_code": 0,
            "peak": peak,
        },
        "collectives": {
            "total": total,
            "async": total - exposed,
            "sync": exposed,
            "hidden": total - exposed,
            "hidden_by_matmul": total - exposed,
            "exposed": exposed,
            "bytes": 2 * exposed_bytes,
            "exposed_bytes": exposed_bytes,
            "by_kind": {},
        },
    }


def _winning_cpu_twin() -> dict:
    """CPU twin wall times where moegen loses only to ragged_dot (5 ms against its 10 ms)."""
    return {
        "devices": 8,
        "tokens": 80,
        "embed": 16,
        "ffn": 24,
        "dtype": "bfloat16",
        "kernel": "xla",
        "variants": {
            "moegen": {"median_s": 0.010, "runs_s": [0.010, 0.011, 0.009], "y_rel_err": 0.0},
            "dense_dispatch": {
                "median_s": 0.020,
                "runs_s": [0.02, 0.02, 0.02],
                "y_rel_err": 1e-3,
            },
            "ragged_dot": {
                "median_s": 0.005,
                "runs_s": [0.005, 0.006, 0.004],
                "y_rel_err": 2e-3,
            },
            "moegen_xla": {
                "median_s": 0.004,
                "runs_s": [0.004, 0.004, 0.003],
                "y_rel_err": 1e-3,
            },
        },
    }


def _winning_spec() -> dict:
    """alpha_v5e: moegen beats every baseline's counters; ragged_dot runs out of memory."""
    return {
        "name": "alpha_v5e",
        "hardware": "tpu-v5e",
        "topology": "2x4",
        "mesh": {"fsdp": 8},
        "strategy": "replicated",
        "kernel": "pallas",
        "useful_train_flops": 2e12,
        "hbm_bytes": 16 * 10**9,
        "variants": {
            "moegen": {
                "counters": _counters(2.2e12, 40e9, 6 * 2**30, 3, 8, 100 * 2**20),
                "kernel_tile_bytes": 10e9,  # megablox's tile re-reads among the 40 GB
                "seconds": 12.0,
            },
            "dense_dispatch": {
                "counters": _counters(8e12, 90e9, 9 * 2**30, 4, 4, 300 * 2**20),
                "seconds": 20.0,
            },
            "ragged_dot": {"oom": "RESOURCE_EXHAUSTED: Ran out of memory", "seconds": 30.0},
        },
        "cpu": _winning_cpu_twin(),
    }


def _losing_spec(winning: dict) -> dict:
    """beta_v6e: ragged_dot beats moegen's counters, and the CPU twin run failed."""
    return {
        **winning,
        "name": "beta_v6e",
        "hardware": "tpu-v6e",
        "variants": {
            "moegen": {
                "counters": _counters(8e12, 50e9, 6 * 2**30, 1, 8, 10 * 2**20),
                "seconds": 12.0,
            },
            "dense_dispatch": {
                "counters": _counters(8e12, 90e9, 20 * 2**30, 4, 4, 300 * 2**20),
                "seconds": 20.0,
            },
            "ragged_dot": {"counters": _counters(4e12, 45e9, 5 * 2**30, 0, 2, 0), "seconds": 9.0},
        },
        "cpu": {"error": "Traceback ...\nRuntimeError: boom"},
    }


def _skipped_spec(winning: dict) -> dict:
    """gamma_v5p: a spec the baselines cannot run."""
    return {
        **winning,
        "name": "gamma_v5p",
        "variants": {},
        "cpu": None,
        "skipped": "the baselines do not cover group-limited routing",
    }


def _results() -> dict:
    winning = _winning_spec()
    return {
        "command": "python -m bench.run --specs alpha_v5e beta_v6e gamma_v5p",
        "date": "2026-01-01 00:00 UTC",
        "versions": {"jax": "0.12.0.1", "libtpu": "0.0.51"},
        "machine": "x86_64, 2 CPU cores",
        "total_seconds": 123.4,
        "specs": [winning, _losing_spec(winning), _skipped_spec(winning)],
        "tool": {
            "check": {"seconds": 4.2, "rc": 0, "specs": 3},
            "build_no_verify": {
                "alpha_v5e": {"seconds": 1.5, "rc": 0},
                "cpu_one": {"seconds": 1.2, "rc": 0},
            },
            "verify": {"cpu_one": {"seconds": 20.0, "rc": 0, "verify_seconds": 17.5, "steps": {}}},
        },
    }


def test_report_tables_on_made_up_numbers() -> None:
    text = format_report(_results())
    assert text.startswith("# Benchmark")
    assert "python -m bench.run --specs alpha_v5e beta_v6e gamma_v5p" in text
    assert "Total run time: 123 s" in text and "jax 0.12.0.1" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| alpha_v5e | tpu-v5e 2x4 | moegen |"))
    # compiled TFLOP, / useful, GB, GB with kernel operands once, GiB, fits, exposed / all,
    # exposed MiB, compile s
    assert row == (
        "| alpha_v5e | tpu-v5e 2x4 | moegen | 2.20 | 1.10 | 40.0 | 30.0 | 6.00 | yes | 3 / 8 "
        "| 100 | 12 |"
    )
    oom = next(
        line for line in lines if line.startswith("| alpha_v5e | tpu-v5e 2x4 | ragged_dot |")
    )
    assert "compiler OOM" in oom
    # a kernel's scoped VMEM is told apart from the layer not fitting HBM
    results = _results()
    results["specs"][0]["variants"]["ragged_dot"] |= {"memory_space": "vmem"}
    vmem = next(
        line
        for line in format_report(results).splitlines()
        if line.startswith("| alpha_v5e | tpu-v5e 2x4 | ragged_dot |")
    )
    assert "**no**: compiler tiles exceed scoped VMEM" in vmem and "OOM" not in vmem
    dense_peak = next(
        line for line in lines if line.startswith("| beta_v6e | tpu-v6e 2x4 | dense dispatch |")
    )
    assert "| 20.00 | **no** |" in dense_peak
    assert (
        "| gamma_v5p | tpu-v5e 2x4 | skipped: the baselines do not cover group-limited routing |"
        in text
    )
    ratio = next(line for line in lines if line.startswith("| alpha_v5e | dense dispatch |"))
    assert ratio == (
        "| alpha_v5e | dense dispatch | 3.64 | 2.25 | 3.00 | 1.50 | 3.00 | 2.00 | 5.00 |"
    )
    assert "| alpha_v5e | ragged_dot | OOM | OOM | OOM | OOM | OOM | 0.50 | 1.25 |" in text
    assert "| alpha_v5e |  | moegen, kernel xla | 4.0 | 3.0 | 1.0e-03 |" in text
    assert "| beta_v6e | error: `RuntimeError: boom` |" in text
    assert "| 1.5 |  |  |" in text and "| cpu_one | 1.2 | 20.0 | 17.5 |" in text
    assert "`moegen check` over all 3 specs: 4.2 s (exit 0)" in text


def test_memory_table_beside_the_plan() -> None:
    results = _results()
    alpha = results["specs"][0]
    alpha["variants"]["moegen"]["forward_memory"] = {"peak": 2 * 10**9, "temp": 10**9}
    alpha["variants"]["moegen_whole"] = {
        "counters": _counters(2.0e12, 30e9, 9 * 2**30, 3, 8, 100 * 2**20),
        "seconds": 10.0,
        "forward_memory": {"peak": 3 * 10**9, "temp": 2 * 10**9},
    }
    alpha["plan_memory"] = {
        "moegen": {"forward": 2 * 2**30, "train": int(6.3 * 2**30), "ffn_chunks": 8},
        "moegen_whole": {"forward": 3 * 2**30, "train": 9 * 2**30, "ffn_chunks": 1},
    }
    lines = format_report(results).splitlines()
    assert (
        "| alpha_v5e | moegen | 8 | 2.000 (1.86) | 1.000 | 6.442 (6.00) | 0.000 | 6.30 | +5.0% |"
        in lines
    )
    assert (
        "| alpha_v5e | moegen, whole FFN (memory.ffn_chunks 1) | 1 | 3.000 (2.79) | 2.000 | "
        "9.664 (9.00) | 0.000 | 9.00 | +0.0% |"
    ) in lines
    # the whole-FFN layer is also in the counters table
    assert any(
        line.startswith("| alpha_v5e | tpu-v5e 2x4 | moegen, whole FFN (memory.ffn_chunks 1) |")
        for line in lines
    )


def test_losses_are_named_plainly() -> None:
    results = _results()
    alpha, beta, gamma = results["specs"]
    assert losses(alpha) == [
        "alpha_v5e: CPU twin wall time: moegen 10.0 ms > ragged_dot 5.0 ms (2.00x)"
    ]
    lost = losses(beta)
    assert "beta_v6e: compiled flops: moegen 8 TFLOP > ragged_dot 4 TFLOP (2.00x)" in lost
    assert "beta_v6e: bytes accessed: moegen 50 GB > ragged_dot 45 GB (1.11x)" in lost
    # no kernel re-reads recorded: the like-for-like bytes are the bytes accessed
    assert (
        "beta_v6e: bytes accessed, kernel operands once: moegen 50 GB > ragged_dot 45 GB (1.11x)"
        in lost
    )
    assert "beta_v6e: peak memory: moegen 6 GiB > ragged_dot 5 GiB (1.20x)" in lost
    assert not any("dense dispatch" in line for line in lost)  # equal flops is not a loss
    assert losses(gamma) == []
    text = format_report(results)
    assert "## Where moegen loses" in text
    assert "- beta_v6e: compiled flops: moegen 8 TFLOP > ragged_dot 4 TFLOP (2.00x)" in text
    results["specs"] = [gamma]
    assert "Nowhere: the generated layer does no worse" in format_report(results)
