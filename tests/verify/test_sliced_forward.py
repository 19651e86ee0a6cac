"""FFN slices whose forward pass runs whole (issue 20's forward-peak regression).

In slices the down projections add up in a float32 [rows, D] sum, beside each slice's own:
for a narrow FFN over many rows (Qwen3-30B-A3B: D 2048, FFN 768, a 262144-row receive buffer)
that is more than the whole width's activations, and the sliced forward pass compiled to 6.6
GB against 2.9 GB whole (v5e, expert 8). Where the ledger says so, the plan runs the forward
pass as the whole layout does and the backward pass slice by slice (jax.custom_gradient); a
wide FFN (Mixtral) keeps its sliced forward. Here: the plan's choice and what it renders, the
twin kept on the full plan's path, and (slow, libtpu) the compiled forward peaks. Twin parity
of both paths: tests/verify/test_ffn_slices.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import assert_twin_parity
from spec_builder import spec_yaml
from tpu_cases import fake_cpu_env, last_json

from bench.maxtext import ANCHOR, spec_text
from moegen.load import load_spec_bytes
from moegen.pipeline import generate
from moegen.plan import MAIN_SHAPE, Plan, ffn, make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import plan_twin, twin_of, verify

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = {row.label: row for row in ANCHOR}


def _plan(text: str, **pins) -> Plan:
    return make_plan(validate(load_spec_bytes(text.encode(), "specs/layer.yaml", "layer")), **pins)


def _anchor(label: str, ffn_chunks: int) -> Plan:
    return _plan(spec_text(ROWS[label], 1, ffn_chunks))


@pytest.mark.parametrize("label", ["b_qwen3_ep8", "b_qwen3_ep4fsdp2", "b_qwen3_v5p_ep8"])
def test_narrow_ffn_slices_run_the_forward_pass_as_the_whole_layout(label, monkeypatch) -> None:
    sliced = _anchor(label, 2)
    # the whole layout as the slices read the weights: cast once (the whole layer alone may
    # read float32 ones as stored, moegen.plan.weight_reads)
    monkeypatch.setattr(ffn, "kernel_weight_dtype", lambda loaded, *_: loaded.spec.dtypes.compute)
    whole = _anchor(label, 1)
    assert sliced.ffn.whole_forward and not whole.ffn.whole_forward
    assert sliced.memory.forward_peak == whole.memory.forward_peak  # that pass's estimate
    assert sliced.memory.train_peak < whole.memory.train_peak  # the backward pass in slices
    forward = (sliced.kernel.config.forward_gate_up_tile, sliced.kernel.config.forward_down_tile)
    assert forward == (whole.kernel.config.gate_up_tile, whole.kernel.config.down_tile)
    assert sliced.ffn.forward_fuses_gate_up == whole.ffn.fuses_gate_up
    assert sliced.kernel.config.padded_rows == whole.kernel.config.padded_rows


def test_wide_ffn_slices_keep_their_sliced_forward() -> None:
    reference = (REPO_ROOT / "specs/mixtral_8x7b_ep_a2a_v5e.yaml").read_text()
    for plan in (_plan(reference), _anchor("a_mixtral_s4096", 16)):
        assert plan.ffn.chunks > 1 and not plan.ffn.whole_forward
        assert plan.kernel.config.forward_gate_up_tile is None
        assert plan.ffn.forward_params == ()
        source = render(plan)
        assert "_whole_forward" not in source and "FORWARD_GATE_UP_TILING" not in source


def test_slices_in_token_chunks_keep_their_sliced_forward() -> None:
    """A chunk's rows are few: run whole, its forward pass cost forward+backward more
    (moegen.plan.ffn.layouts)."""
    plan = _plan(spec_text(ROWS["b_qwen3_ep8"], 4, 2))
    assert (plan.experts.token_chunks, plan.ffn.chunks) == (4, 2)
    assert not plan.ffn.whole_forward and "_whole_forward" not in render(plan)


def test_whole_forward_renders_a_custom_gradient_over_the_slices() -> None:
    source = render(_anchor("b_qwen3_ep8", 2))
    assert "@jax.custom_gradient\ndef _whole_forward(" in source
    assert "out = _whole_forward(rows, weights, group_sizes)" in source
    whole = source.split("def _whole_forward(", 1)[1].split("\ndef ", 1)[0]
    assert "FORWARD_GATE_UP_TILING" in whole and "FORWARD_DOWN_TILING" in whole
    assert "jax.lax.scan" not in whole  # the slices run in _sum_of_slices, for the backward
    assert "jax.vjp(sum_of_slices, rows, stored)" in source


def test_fsdp_whole_forward_gathers_gate_and_up_apart_as_the_whole_layout_does() -> None:
    """fsdp gathers the whole weights for that pass: gate and up apart, one gathered after the
    other (fuses_gate_up); its slices keep them side by side."""
    plan = _anchor("b_qwen3_ep4fsdp2", 2)
    assert plan.ffn.fuses_gate_up and not plan.ffn.forward_fuses_gate_up
    source = render(plan)
    whole = source.split("def _whole_weights(", 1)[1].split("\ndef ", 1)[0]
    assert '"w_gate": jax.lax.all_gather(' in whole and '"w_up": jax.lax.all_gather(' in whole
    assert '"w_gate_up"' in source.split("def _weight_slice(", 1)[1].split("\ndef ", 1)[0]


def test_pinned_forward_overrides_the_ledger() -> None:
    text = spec_text(ROWS["b_qwen3_ep8"], 1, 2)
    assert not _plan(text, whole_forward={MAIN_SHAPE: False}).ffn.whole_forward
    assert _plan(text, whole_forward={MAIN_SHAPE: True}).ffn.whole_forward


@pytest.mark.parametrize("dtype", ["float32", None])
def test_twin_runs_the_forward_pass_as_the_full_plan_does(dtype: str | None) -> None:
    """The shrunken twin's own ledger would slice its forward pass; it runs the full plan's."""
    loaded = validate(
        load_spec_bytes(spec_text(ROWS["b_qwen3_ep8"], 1, 2).encode(), "specs/q.yaml", "q")
    )
    full = make_plan(loaded)
    twin = twin_of(loaded, full, dtype=dtype)
    assert not make_plan(twin, interpret=True).ffn.whole_forward
    assert plan_twin(twin, full).ffn.whole_forward


# Training shape whole forward, the decode variant (8 tokens, the gathered weights weigh most) in
# slices: each shape's module runs its own plan's path, and the twin each as the full plan does.
VARIANTS = spec_yaml(
    {
        "description": "FFN slices in shape variants.",
        "experts": 8,
        "embed": 128,
        "ffn": 64,
        "top_k": 2,
        "batch": 8,
        "seq_len": 2048,
        "variants": {"decode": {"batch": 8, "seq_len": 1}},
        "params_dtype": "float32",
        "compute_dtype": "bfloat16",
        "axes": {"fsdp": 8},
        "hardware": "cpu",
        "kernel": "xla",
        "ffn_chunks": 4,
    }
)


def test_each_shape_variant_runs_its_own_plans_forward_pass() -> None:
    plan = _plan(VARIANTS)
    [decode] = plan.variants
    assert plan.ffn.whole_forward and not decode.plan.ffn.whole_forward
    source = render(plan)
    assert "_whole_forward(rows, weights, group_sizes)" in source
    decode_ffn = source.split("def _expert_ffn_decode(", 1)[1].split("\ndef ", 1)[0]
    assert "jax.lax.scan(add_slice" in decode_ffn and "_whole_forward" not in decode_ffn


@pytest.mark.slow
def test_shape_variants_in_slices_match_the_dense_reference(tmp_path, monkeypatch) -> None:
    (tmp_path / "variants.yaml").write_text(VARIANTS)
    monkeypatch.chdir(tmp_path)
    generated = generate(Path("variants.yaml"))
    assert_twin_parity(verify(generated.loaded, generated.source, run_compiles=False))


# Qwen3's shape at a quarter of the width and tokens: quick to compile, the same trade.
def narrow(chunks: int) -> str:
    return spec_yaml(
        {
            "description": f"a narrow FFN of many experts, {chunks} slices.",
            "experts": 64,
            "embed": 1024,
            "ffn": 256,
            "top_k": 8,
            "score": "softmax",
            "renormalize": True,
            "batch": 8,
            "seq_len": 1024,
            # bfloat16 params: both read them in place (with float32 ones the whole layer
            # would read them as stored and the slices cast them: another comparison)
            "params_dtype": "bfloat16",
            "compute_dtype": "bfloat16",
            "axes": {"expert": 8},
            "strategy": "ragged_all_to_all",
            "hardware": "tpu-v5e",
            "topology": "2x4",
            "kernel": "pallas",
            "ffn_chunks": chunks,
        }
    )


COMPILE_FORWARD = textwrap.dedent(
    """
    import functools, importlib.util, json, sys
    import jax
    from jax.experimental import topologies

    devices = topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x4", chip_config_name="default",
        chips_per_host_bounds=(2, 4, 1), num_slices=1,
    ).devices
    peaks = {}
    for path in sys.argv[1:]:
        spec = importlib.util.spec_from_file_location("layer_" + str(len(peaks)), path)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        mesh = m.make_mesh(devices)
        forward = functools.partial(m.moe_layer, mesh=mesh)
        stats = jax.jit(forward).lower(m.param_shapes(mesh), m.input_shape(mesh)).compile()
        stats = stats.memory_analysis()
        peaks[path] = (
            stats.argument_size_in_bytes + stats.output_size_in_bytes
            + stats.temp_size_in_bytes - stats.alias_size_in_bytes
        )
    print(json.dumps(peaks))  # the last line: tpu_cases.last_json
    """
)


@pytest.mark.slow
def test_sliced_forward_peak_is_no_higher_than_the_whole_layers(tmp_path) -> None:
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("compiling for TPU needs libtpu")
    paths = {}
    for chunks in (1, 2):
        plan = _plan(narrow(chunks))
        assert plan.ffn.whole_forward == (chunks == 2)
        paths[chunks] = tmp_path / f"narrow_{chunks}.py"
        paths[chunks].write_text(render(plan), encoding="utf-8")
    command = [sys.executable, "-c", COMPILE_FORWARD, str(paths[1]), str(paths[2])]
    result = subprocess.run(
        command, capture_output=True, text=True, env=fake_cpu_env(8), timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr[-6000:]
    peaks = last_json(result.stdout)
    # measured with float32 params (libtpu 0.0.51): 0.329 GB both; the slices' float32 sum made it 0.732 GB
    assert peaks[str(paths[2])] <= peaks[str(paths[1])], peaks
