"""Stage 5, verify: the shrunken-twin parity run (forward, aux, gradients) and full compiles.

Each full verification takes ~10-15 s in a child process with fake CPU devices, so there is
exactly one per example spec plus one for a mutated module; the cheap failure modes (import
error, timeout) stop long before any compile.
"""

from __future__ import annotations

import math
from operator import attrgetter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import EXAMPLE_NAMES, REPO_ROOT

import moegen.verify.verification
from moegen.pipeline import generate
from moegen.plan import make_plan
from moegen.plan.costs import DTYPE_BYTES
from moegen.sizes import axes_product
from moegen.verify import TOLERANCES, VerifyError, verify
from moegen.verify.reference.parity import (
    KINK_SHARE,
    relative_error,
    set_aside_share,
    skewed_enough,
)
from moegen.verify.twin import TWIN_SEQUENCES_PER_SHARD, twin_of, twin_seq_len

FLOAT32_STEP = "twin parity (float32)"
REQUIRED_STEPS = ["import", FLOAT32_STEP, "compile forward", "compile forward+backward"]


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)


# Full-size TPU compiles take one to several minutes each on a 2-core CI machine: here every
# example's twins run, and the CPU examples compile in full. CI compiles one TPU example in full
# through the CLI (tests/emit/test_tpu_examples.py), and small TPU layers of every strategy in
# test_tpu, test_multislice and test_overlap_hlo; `moegen build` compiled every example, with
# its memory verdict, before it was committed, and `moegen check` keeps them fresh.


def _with_variants(steps: list[str], variants: list[str]) -> list[str]:
    """The verify steps with shape variants, as verify orders them: each twin for the main
    shape then each variant ("twin parity (float32, eval)"), then each shape's compiles
    ("compile forward (eval)"), then each shape's memory verdict."""
    suffixes = ["", *(f" ({name})" for name in variants)]
    twins = [s for s in steps if s.startswith("twin parity (")]
    compiles = [s for s in steps if s.startswith("compile")]
    verdicts = [s for s in steps if s == "memory verdict"]
    out = [s for s in steps if s == "import"]
    for twin in twins:
        out += [twin] + [f"{twin[:-1]}, {name})" for name in variants]
    out += [f"{step}{suffix}" for suffix in suffixes for step in compiles]
    out += [f"{step}{suffix}" for step in verdicts for suffix in suffixes]
    return out


def _low_precision_label(spec) -> str | None:
    """The second twin's label ("bfloat16 compute, float32 params"); None for a float32 spec."""
    if (spec.dtypes.params, spec.dtypes.compute) == ("float32", "float32"):
        return None
    return f"{spec.dtypes.compute} compute, {spec.dtypes.params} params"


def _expected_steps(generated, compiles: bool) -> list[str]:
    """The step names verify must report for this example, in order."""
    expected = list(REQUIRED_STEPS if compiles else REQUIRED_STEPS[:2])
    if generated.plan.kernel.name in ("te", "tokamax"):
        # the full module imports its GPU library, needed only to lower it for CUDA
        # (tests/kernels/test_gpu_targets.py, tests/kernels/test_tokamax.py); its twins run kernel xla
        expected.remove("import")
    label = _low_precision_label(generated.loaded.spec)
    if label:
        expected.insert(2, f"twin parity ({label})")
    # each shape variant repeats the twins and compiles after the main shape's, named by it
    return _with_variants(expected, [v.name for v in generated.plan.variants])


def _assert_float32_twin_parity(generated, report) -> None:
    """Twin parity in float32: both cases, forward + aux + gradients within 1e-5."""
    spec = generated.loaded.spec
    twin = twin_of(generated.loaded)
    twin_plan = make_plan(twin)
    shards = axes_product(spec.mesh.axes, spec.batch_axes)
    twin_tokens = (
        shards * TWIN_SEQUENCES_PER_SHARD * twin_seq_len(generated.plan.experts.token_chunks)
    )
    assert twin_plan.batch * twin_plan.seq_len == twin_tokens
    parity = report.step(FLOAT32_STEP)
    cases = {case["case"]: case for case in parity["cases"]}
    expected_cases = {"random routing", "starved experts"}
    if spec.parallelism.redundant_experts:
        expected_cases.add("skewed to the replicas")
    assert set(cases) == expected_cases
    for case in cases.values():
        assert case["max_relative_error"] < 1e-5, case
        assert case["max_relative_error"] < TOLERANCES["float32"]
        counts = case["tokens_per_expert"]
        assert len(counts) == spec.layer.num_experts
        assert sum(counts) == twin_tokens * spec.router.top_k  # dropless
    starved = cases["starved experts"]
    assert starved["starved_experts"], "some experts must be starved"
    assert all(starved["tokens_per_expert"][e] == 0 for e in starved["starved_experts"])
    assert len(starved["starved_experts"]) <= spec.layer.num_experts - spec.router.top_k


def _assert_full_compiles(generated, report) -> None:
    """Full-size compiles, with per-device memory and a FLOP count."""
    spec = generated.loaded.spec
    plan = make_plan(generated.loaded)
    for step_name in ("compile forward", "compile forward+backward"):
        step = report.step(step_name)
        assert step["memory"]["argument"] > 0 and step["memory"]["output"] > 0
        assert step["flops"] > 0
    forward = report.step("compile forward")
    # Arguments on one device: its parameter shards plus its slice of x.
    x_bytes = plan.local_tokens * plan.embed_dim * DTYPE_BYTES[spec.dtypes.compute]
    assert math.isclose(
        forward["memory"]["argument"], plan.cost.param_bytes + x_bytes, rel_tol=0.05
    )


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@pytest.mark.slow
def test_example_spec_verifies(name, in_repo):
    generated = generate(Path("specs") / f"{name}.yaml")
    assert generated.source.encode() == (REPO_ROOT / "generated" / f"{name}.py").read_bytes()
    events = []
    compiles = generated.plan.hardware == "cpu"
    report = verify(
        generated.loaded, generated.source, on_step=events.append, run_compiles=compiles
    )
    assert events == report.steps  # progress sees every step as it happens

    names = [step["step"] for step in report.steps]
    assert names == _expected_steps(generated, compiles)
    assert all(step["seconds"] >= 0 for step in report.steps)

    _assert_float32_twin_parity(generated, report)
    label = _low_precision_label(generated.loaded.spec)
    if label:
        low = report.step(f"twin parity ({label})")
        for case in low["cases"]:
            assert case["max_relative_error"] < TOLERANCES["bfloat16"], case

    if compiles:
        _assert_full_compiles(generated, report)


@pytest.mark.slow
def test_mutated_module_fails_verification(in_repo, monkeypatch):
    """silu(up) * gate instead of silu(gate) * up: imports, compiles, but is wrong."""
    original, mutant = "jax.nn.silu(gate) * up", "jax.nn.silu(up) * gate"
    name = "mixtral_small_cpu"
    generated = generate(Path("specs") / f"{name}.yaml")
    assert generated.source.count(original) == 1
    real_render = moegen.verify.verification.render
    twins_rendered = []

    def mutated_render(plan):
        source = real_render(plan)
        assert source.count(original) == 1
        twins_rendered.append(plan.module_name)
        return source.replace(original, mutant)

    monkeypatch.setattr(moegen.verify.verification, "render", mutated_render)
    steps = []
    with pytest.raises(VerifyError, match="relative error") as caught:
        verify(
            generated.loaded,
            generated.source.replace(original, mutant),
            on_step=steps.append,
        )
    assert twins_rendered, "the twin must be rendered through moegen.verify.verification.render"
    message = str(caught.value)
    assert "differs from the dense reference" in message
    assert "random routing" in message
    # It failed at the parity step: imported fine, never reached a compile.
    assert [step["step"] for step in steps] == ["import"]


@pytest.mark.slow
def test_a_nan_gradient_fails_verification(in_repo, monkeypatch):
    """The same forward, but NaN in the input's and weights' gradients (where's untaken
    branch: 0 x sqrt'(0)). A NaN error compares False both ways: it must still fail."""
    original = "jax.nn.silu(gate) * up"
    mutant = "jax.nn.silu(gate) * jnp.where(True, up, jnp.sqrt(up * 0.0))"
    generated = generate(Path("specs") / "mixtral_small_cpu.yaml")
    assert generated.source.count(original) == 1
    real_render = moegen.verify.verification.render
    monkeypatch.setattr(
        moegen.verify.verification,
        "render",
        lambda plan: real_render(plan).replace(original, mutant),
    )
    with pytest.raises(VerifyError, match="relative error inf"):
        verify(generated.loaded, generated.source.replace(original, mutant))


def test_relative_error_of_a_non_finite_result_is_infinite() -> None:
    assert relative_error(np.array([1.0, math.nan]), np.array([1.0, 2.0])) == math.inf
    assert relative_error(np.array([math.inf]), np.array([1.0])) == math.inf
    assert relative_error(np.array([3.0, 4.0]), np.array([3.0, 4.0])) == 0.0


def test_a_low_precision_comparison_sets_aside_a_flipped_relu_term_not_a_wrong_path() -> None:
    """Rounding moves a pre-activation across ReLU's kink: one whole gradient term of a few
    hundred differs. Set aside, the rest meets a bfloat16 bound; a wrong path (every element
    off by 10%, or two experts' gradients swapped) does not hide in the 1% set aside."""
    rng = np.random.default_rng(0)
    want = rng.normal(size=(16, 24))
    rounded = want * (1.0 + rng.uniform(-(2.0**-8), 2.0**-8, want.shape))
    flipped = rounded.copy()
    flipped[3, 5] += 4.0 * np.abs(want).max()
    assert relative_error(flipped, want) > 5e-2
    assert relative_error(flipped, want, KINK_SHARE) < 1e-2
    assert relative_error(rounded * 1.1, want, KINK_SHARE) > 5e-2
    assert relative_error(rounded[[1, 0, *range(2, 16)]], want, KINK_SHARE) > 5e-2
    assert relative_error(np.array([1.0, math.nan]), np.array([1.0, 2.0]), KINK_SHARE) == math.inf


def test_a_gradient_cancelled_by_its_draw_is_measured_against_its_typical_size() -> None:
    """A scalar's gradient that sums to near zero for one cotangent: rounding that is small
    beside its typical size passes; a result off by that size does not."""
    want = np.array([1.76])  # this draw's sum; other cotangents give 20-190
    rounded = want + 0.47  # bfloat16 rounding of the terms, ~0.5% of their typical sum
    assert relative_error(rounded, want) > 0.1
    assert relative_error(rounded, want, typical=60.0) < 1e-2
    assert relative_error(-want * 30, want, typical=60.0) > 0.5  # a wrong path
    assert relative_error(np.array([math.nan]), want, typical=60.0) == math.inf


def test_the_replicas_skew_is_judged_by_the_copies_they_could_get() -> None:
    """A token sends an expert one copy at most: two hot experts of a top-6 router can get a
    third of the copies, and every token sending both one is as skewed as it gets."""
    copies = (20, 0, 1, 2, 13, 0, 1, 2, 5, 3, 0, 0, 1, 8, 0, 0, 20, 3, 1, 0, 4, 0, 0, 0, 10, 11)
    assert skewed_enough(copies, [0, 16], top_k=6)
    assert not skewed_enough(copies, [1, 5], top_k=6)  # two starved experts: not skewed
    # as many hot experts as picks: they could get every copy, and must get half
    assert skewed_enough((30, 20, 10), [0, 1], top_k=2)
    assert not skewed_enough((10, 10, 40), [0, 1], top_k=2)


def test_only_a_twin_below_float32_sets_elements_aside() -> None:
    import jax.numpy as jnp

    float32 = SimpleNamespace(COMPUTE_DTYPE=jnp.float32, PARAM_DTYPE=jnp.float32)
    assert set_aside_share(float32) == 0.0
    for compute, params in [(jnp.bfloat16, jnp.float32), (jnp.float32, jnp.bfloat16)]:
        assert set_aside_share(SimpleNamespace(COMPUTE_DTYPE=compute, PARAM_DTYPE=params)) == (
            KINK_SHARE
        )


def test_module_that_fails_to_import(in_repo):
    generated = generate(Path("specs/qwen3_moe_fsdp_cpu.yaml"))
    broken = generated.source + '\nraise RuntimeError("boom at import")\n'
    with pytest.raises(VerifyError, match="boom at import"):
        verify(generated.loaded, broken)


def test_verification_timeout(in_repo):
    generated = generate(Path("specs/qwen3_moe_fsdp_cpu.yaml"))
    with pytest.raises(VerifyError, match="timed out"):
        verify(generated.loaded, generated.source, timeout_s=0.5)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_twin_keeps_the_code_path_and_shrinks_the_sizes(name, in_repo):
    generated = generate(Path("specs") / f"{name}.yaml")
    plan = generated.plan
    twin = make_plan(twin_of(generated.loaded))
    for field in (
        "mesh.axes",
        "mesh.num_devices",
        "mesh.batch_axes",
        "mesh.fsdp_axis",
        "experts.strategy",
        "hardware",
        "num_experts",
        "router.top_k",
        "router.score",
        "router.renormalize",
        "ffn.activation",
        "ffn.fuses_gate_up",
        "ffn.chunks",
    ):
        assert attrgetter(field)(twin) == attrgetter(field)(plan), field
    # TE and tokamax run on a GPU only: their twins run the portable kernel, same signature
    gpu_only = plan.kernel.name in ("te", "tokamax")
    assert twin.kernel.name == ("xla" if gpu_only else plan.kernel.name)
    assert twin.param_dtype == twin.compute_dtype == "float32"
    assert twin.embed_dim <= plan.embed_dim and twin.embed_dim != twin.ffn_dim
    # a device's tokens, stretched to split into the spec's token chunks
    assert twin.local_batch == TWIN_SEQUENCES_PER_SHARD
    assert twin.seq_len == twin_seq_len(plan.experts.token_chunks) * plan.mesh.sequence_shards
    assert twin.experts.token_chunks == plan.experts.token_chunks
    keep = make_plan(twin_of(generated.loaded, dtype=None))
    assert (keep.param_dtype, keep.compute_dtype) == (plan.param_dtype, plan.compute_dtype)


def test_verify_checks_the_plan_it_is_given_and_plans_each_twin_once(in_repo, monkeypatch):
    """No second plan of the full-size spec, and each twin derived and planned once."""
    import moegen.verify.twin
    from moegen.verify.messages import VerifyReport

    generated = generate(Path("specs/mixtral_small_cpu.yaml"))  # bfloat16 compute: two twins
    planned = []
    real_make_plan = moegen.verify.twin.make_plan

    def counting_make_plan(loaded, **kwargs):
        planned.append((loaded.spec.layer.embed_dim, kwargs))
        return real_make_plan(loaded, **kwargs)

    def no_full_plan(*args, **kwargs):
        raise AssertionError("verify planned the spec again")

    jobs = []

    def worker(job_path, num_devices, on_step, timeout_s):
        jobs.append(job_path.read_text(encoding="utf-8"))
        return VerifyReport()

    monkeypatch.setattr(moegen.verify.verification, "make_plan", no_full_plan)
    monkeypatch.setattr(moegen.verify.twin, "make_plan", counting_make_plan)
    monkeypatch.setattr(moegen.verify.verification, "_run_worker", worker)
    verify(generated.loaded, generated.source, plan=generated.plan, run_compiles=False)
    # the two twins, once each, with the full-size layer's combine
    pinned = {
        "interpret": True,
        "weights_on_hidden": generated.plan.experts.combine.weights_on_hidden,
    }
    assert planned == [(planned[0][0], pinned)] * 2
    assert planned[0][0] < generated.plan.embed_dim
    [job] = jobs
    assert '"label": "float32"' in job and '"label": "bfloat16 compute, float32 params"' in job
