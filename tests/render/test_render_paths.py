"""Stage 4, render: only the chosen path is emitted (score, renormalisation, mesh), and the constants match the plan."""

from __future__ import annotations

import ast
import re

import pytest
from conftest import EXAMPLE_NAMES, REPO_ROOT
from render_cases import PROBE, code_only, render_examples, render_yaml
from spec_builder import spec_yaml

from moegen.pipeline import load_valid
from moegen.plan import make_plan


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """Each example spec rendered from the repository root (so paths read specs/NAME.yaml)."""
    return render_examples()


MESHES = {"data": {"data": 2}, "fsdp": {"fsdp": 4}, "data+fsdp": {"data": 2, "fsdp": 2}}


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_only_the_chosen_path_is_emitted(tmp_path, score, renormalize, mesh):
    text = spec_yaml(PROBE | {"score": score, "renormalize": renormalize, "axes": MESHES[mesh]})
    source = render_yaml(tmp_path, text)
    code = code_only(source)
    other = {"softmax": "sigmoid", "sigmoid": "softmax"}[score]
    assert f"jax.nn.{score}(" in code
    assert other not in code and other not in source.split('"""', 2)[2], other
    renormalise_line = "combine_weights = combine_weights / jnp.sum(combine_weights"
    assert (renormalise_line in source) is renormalize
    fsdp = "fsdp" in mesh
    assert ("all_gather" in code) is fsdp
    assert ("FSDP_AXIS" in code) is fsdp
    if not fsdp:
        assert "fsdp" not in code
    if "data" not in mesh:
        assert "'data'" not in code and '"data"' not in source
    # Nothing conditional survives as a runtime branch on spec options.
    for option in ("SCORE", "RENORMALIZE", "USE_FSDP", "KERNEL"):
        assert option not in code


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_modules_hold_only_their_path(rendered, name):
    plan = make_plan(load_valid(REPO_ROOT / "specs" / f"{name}.yaml"))
    code = code_only(rendered[name])
    other = {"softmax": "sigmoid", "sigmoid": "softmax"}[plan.router.score]
    # The router scores its logits one way (a sigmoid may still gate a GLU or a shared expert).
    assert f"jax.nn.{plan.router.score}(" in code
    assert not re.search(rf"jax\.nn\.{other}\((top_)?logits\b", code)
    if plan.experts.strategy == "replicated":  # else the expert exchange gathers too
        assert ("all_gather" in code) is (plan.mesh.fsdp_axis is not None)
    assert ("jnp.sum(combine_weights" in code) is plan.router.renormalize
    calls = {
        "xla": "jax.lax.ragged_dot(",
        "pallas": "_gmm(",  # megablox, through a custom VJP giving each kernel its own tiles
        "te": "_te_grouped_matmul(",
        "tokamax": "_tokamax_grouped_matmul(",
    }
    # (gate,) up, down; gate and up side by side in one call where the plan fuses them
    sites = re.findall(rf"(?<![\w.]){re.escape(calls[plan.kernel.name])}", code)
    assert len(sites) >= plan.ffn.grouped_matmul_sites
    assert ('weights["w_gate_up"]' in rendered[name]) is plan.ffn.fuses_gate_up
    assert not any(call in code for kernel, call in calls.items() if kernel != plan.kernel.name)


def test_sigmoid_example_has_no_softmax_at_all(rendered):
    name = next(n for n in EXAMPLE_NAMES if "sigmoid" in n)
    assert "softmax" not in rendered[name]
    assert "all_gather" not in rendered[name]  # pure data parallel
    assert "jnp.sum(combine_weights" not in rendered[name]  # renormalize false


def test_constants_match_the_plan(rendered):
    for name in EXAMPLE_NAMES:
        plan = make_plan(load_valid(REPO_ROOT / "specs" / f"{name}.yaml"))
        namespace: dict = {}
        tree = ast.parse(rendered[name])
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    namespace[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
        assert namespace["BATCH"] == plan.batch
        assert namespace["SEQ_LEN"] == plan.seq_len
        assert namespace["EMBED_DIM"] == plan.embed_dim
        assert namespace["FFN_DIM"] == plan.ffn_dim
        assert namespace["NUM_EXPERTS"] == plan.num_experts
        assert namespace["TOP_K"] == plan.router.top_k
        assert namespace["LOCAL_TOKENS"] == plan.local_tokens
        assert namespace["ROUTED_ROWS"] == plan.routed_rows
        assert namespace["MESH_AXES"] == tuple(a for a, _ in plan.mesh.axes)
        assert namespace["MESH_SHAPE"] == tuple(s for _, s in plan.mesh.axes)
        assert namespace["NUM_DEVICES"] == plan.mesh.num_devices
        assert namespace["BATCH_AXES"] == plan.mesh.batch_axes
        assert namespace["SPEC_DESCRIPTION"] == plan.description
