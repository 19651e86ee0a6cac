"""Shape variants (shapes.variants, issue 19 item 4): each variant planned whole, the module
composed from the main shape's and the variants' own renders (shared parameters, suffixed
shape-dependent parts, moe_layer dispatching on x.shape), and each variant verified."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_twin_parity

from moegen.load import load_spec, load_spec_bytes
from moegen.plan import make_plan
from moegen.render import render
from moegen.render_variants import VariantConflict, compose
from moegen.validate import validate
from moegen.verify import verify

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "specs/mixtral_small_variants_cpu.yaml"
TWO_SHAPES = (
    (REPO_ROOT / "specs/mixtral_small_cpu.yaml")
    .read_text()
    .replace(
        "  seq_len: 256\n", "  seq_len: 256\n  variants:\n    eval: {batch: 32, seq_len: 64}\n"
    )
)


def _loaded(text: str, name: str = "two_shapes"):
    return validate(load_spec_bytes(text.encode(), f"{name}.yaml", name))


@pytest.fixture(scope="module")
def plan():
    return make_plan(_loaded(TWO_SHAPES))


@pytest.mark.parametrize(
    ("field", "main", "eval_"),
    [("batch", 16, 32), ("seq_len", 256, 64), ("local_batch", 2, 4), ("local_tokens", 512, 256)],
)
def test_each_variant_is_planned_with_its_own_shapes(plan, field, main, eval_) -> None:
    (variant,) = plan.variants
    assert (getattr(plan, field), getattr(variant.plan, field)) == (main, eval_)


@pytest.mark.parametrize("field", ["params", "mesh", "router", "embed_dim"])
def test_variants_share_what_does_not_depend_on_the_shape(plan, field) -> None:
    assert getattr(plan.variants[0].plan, field) == getattr(plan, field)


@pytest.mark.parametrize(
    ("line", "present"),
    [
        ("BATCH_EVAL = 32", True),
        ("LOCAL_TOKENS_EVAL = 256  # LOCAL_BATCH * SEQ_LEN", True),
        ("def moe_layer_eval(", True),
        ("    INPUT_SHAPE_EVAL: moe_layer_eval,  # eval", True),
        ("    variant_layer = VARIANT_LAYERS.get(tuple(x.shape))", True),
        ("EMBED_DIM_EVAL", False),  # the same for every shape: not repeated
        ("def init_params_eval", False),
        ("def _gather_weights_eval", False),
    ],
)
def test_the_module_adds_only_what_the_variant_changes(plan, line, present) -> None:
    assert (line in render(plan)) is present


def test_a_spec_without_variants_renders_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # the header names the spec as given, from the repository
    plan = make_plan(validate(load_spec(Path("specs/mixtral_small_cpu.yaml"))))
    assert render(plan) == (REPO_ROOT / "generated/mixtral_small_cpu.py").read_text()


@pytest.mark.parametrize(
    ("variant_source", "message"),
    [
        ("PARAM_SHAPES = {'w': (2,)}\nBATCH = 4\n", "changes PARAM_SHAPES, which every"),
        ("BATCH = 4\nBATCH_EVAL = 1\n", "BATCH_EVAL already exists"),
    ],
)
def test_a_variant_that_touches_the_shared_parts_is_refused(plan, variant_source, message):
    main = "PARAM_SHAPES = {'w': (1,)}\nBATCH = 2\nBATCH_EVAL = 1\n"
    with pytest.raises(VariantConflict, match=message):
        compose(main, [(plan.variants[0], variant_source)], "")


@pytest.mark.slow
def test_a_two_shape_spec_builds_and_both_functions_match_the_reference(plan) -> None:
    report = verify(_loaded(TWO_SHAPES), render(plan), plan=plan)
    parity = assert_twin_parity(report)
    names = [step["step"] for step in parity]
    assert names == [
        "twin parity (float32)",
        "twin parity (float32, eval)",
        "twin parity (bfloat16 compute, float32 params)",
        "twin parity (bfloat16 compute, float32 params, eval)",
    ]
    compiled = [step["step"] for step in report.steps if step["step"].startswith("compile")]
    assert compiled == [
        "compile forward",
        "compile forward+backward",
        "compile forward (eval)",
        "compile forward+backward (eval)",
    ]
