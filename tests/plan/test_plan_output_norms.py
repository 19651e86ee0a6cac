"""Stage 3, `moegen.plan`: the experts' output norms (Ergo's): each routed expert's weight row
[E, D] laid out like its down bias, the shared expert's [D] replicated, both float32 and
starting at one; where the rendered module applies them; a spec without them has none."""

from __future__ import annotations

from plan_cases import A2A, feature_plan, param_rows

from moegen.plan.replicas import expert_weights
from moegen.render import render

NORMS = {"expert_output_norm_eps": 1e-5, "shared_output_norm_eps": 2e-5, "shared_ffn_dim": 32}


def test_each_expert_holds_its_own_rows_of_the_expert_output_norm() -> None:
    """The per-expert weight is sharded like b_down: its experts over the expert axis (each
    device holds its own experts' rows), its embed dim over fsdp (gathered in the layer); the
    shared expert's weight is replicated. Both float32 whatever the compute dtype, at one."""
    plan = feature_plan(
        axes={"fsdp": 2, "expert": 2}, layer=NORMS, parallelism=A2A, compute="bfloat16"
    )
    rows = param_rows(plan)
    assert rows["expert_output_norm"] == (
        (8, 64),
        (4, 32),
        ("expert", "fsdp"),
        1,
        "float32",
        0.0,
    )
    assert rows["shared_output_norm"] == ((64,), (64,), (None,), None, "float32", 0.0)
    names = [p.name for p in plan.params]
    assert names.index("w_down") < names.index("expert_output_norm") < names.index("shared_up")
    assert plan.init.ones == ("expert_output_norm", "shared_output_norm")
    assert (plan.ffn.expert_output_norm_eps, plan.ffn.shared_output_norm_eps) == (1e-5, 2e-5)
    assert plan.ffn.row_experts and plan.router.rms_norm
    # redundant slots copy an expert's norm row with its FFN weights
    assert "expert_output_norm" in {p.name for p in expert_weights(plan.params)}


def test_the_module_normalises_each_row_before_its_weight_and_the_shared_output() -> None:
    plan = feature_plan(axes={"expert": 2}, layer=NORMS, parallelism=A2A)
    source = render(plan)
    assert "EXPERT_OUTPUT_NORM_EPS = 1e-05  # each routed expert's output RMSNorm" in source
    assert "SHARED_OUTPUT_NORM_EPS = 2e-05  # the shared expert's output RMSNorm" in source
    ffn = source[source.index("def _expert_ffn(") :]
    down = ffn.index('weights["w_down"]')
    norm = ffn.index("out = _expert_output_norm(out, weights, row_experts)")
    assert ffn.index("row_experts = _row_experts(group_sizes") < down < norm
    assert norm < ffn.index("    return out")
    assert 'scale = weights["expert_output_norm"][row_experts]' in source  # xla: rows past
    # the groups are written (zeros), so they read the last expert's row
    shared = source[source.index("def _shared_expert(") :]
    assert shared.index('weights["shared_down"]') < shared.index(
        'out = _rms_norm(out, SHARED_OUTPUT_NORM_EPS) * weights["shared_output_norm"]'
    )
    # the routed rows are combined after their norm, in the strategy
    assert source.index("def _expert_output_norm(") < source.index("def _routed_experts(")


def test_a_spec_without_output_norms_has_none_of_them() -> None:
    plan = feature_plan(axes={"expert": 2}, layer={"shared_ffn_dim": 32}, parallelism=A2A)
    names = {p.name for p in plan.params}
    assert not names & {"expert_output_norm", "shared_output_norm"}
    assert plan.ffn.expert_output_norm_eps is None and plan.ffn.shared_output_norm_eps is None
    assert not plan.ffn.row_experts and not plan.router.rms_norm
    source = render(plan)
    assert "OUTPUT_NORM" not in source and "_row_experts" not in source
