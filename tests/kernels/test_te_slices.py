"""The te examples in FFN slices build end to end: twins, then the forward and
forward+backward lowered for CUDA with Transformer Engine's grouped GEMMs and its VJP.

TE 2.20's grouped GEMM VJP cannot return float32 from bfloat16 inputs, so the sliced FFN's
down projection must not ask for it (templates/kernels/te.jinja, grouped_matmul to jnp.float32): the
twins, which stand ragged_dot in for TE, cannot catch that; only the lowering can. Needs TE
(`make te`); skipped without it, failed without it under MOEGEN_REQUIRE_TE=1 (`make test-te`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import SPEC_DIR, assert_no_traceback, run_moegen

pytestmark = pytest.mark.gpu_library("te")


TE_EXAMPLES = ["mixtral_8x7b_h100", "mixtral_8x7b_ep_h100_fp8", "qwen3_30b_a3b_b200_mxfp8"]


@pytest.mark.slow
@pytest.mark.parametrize("name", TE_EXAMPLES)
def test_te_example_in_two_ffn_slices_builds_and_lowers(name: str, tmp_path: Path) -> None:
    text = (SPEC_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    assert "\nmemory:" not in text
    (tmp_path / f"{name}_sliced.yaml").write_text(text + "memory:\n  ffn_chunks: 2\n")
    result = run_moegen("build", "--out", "out", f"{name}_sliced.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_traceback(result.stderr)
    lowered = re.search(
        r"lower forward\+backward for cuda .*te_grouped_gemm_ffi x(\d+)", result.stderr
    )
    assert lowered, result.stderr
    # Per slice: gate and up (one fused call or two), down; dgrad and wgrad of each.
    assert int(lowered.group(1)) >= 6
    source = (tmp_path / "out" / f"{name}_sliced.py").read_text(encoding="utf-8")
    # The float32 sum of the slices widens TE's result; TE is never asked for float32.
    assert ").astype(jnp.float32)" in source
    assert not re.search(r"grouped_dense\([^)]*preferred_element_type", source)
