"""The twin's starved-experts case under group-limited routing: only experts that no token
needs are starved (found by tests/property/test_property_build.py: 4 experts in 2 groups, keep 1,
top-2 forced every token onto the starved experts and failed a valid build)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen
from spec_builder import spec_yaml


def grouped_spec(experts: int, top_k: int, groups: int, keep: int) -> str:
    return spec_yaml(
        {
            "experts": experts,
            "embed": 64,
            "ffn": 128,
            "top_k": top_k,
            "group_limit": (groups, keep),
            "batch": 4,
            "seq_len": 16,
            "axes": {"data": 2},
        }
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("experts", "top_k", "groups", "keep", "starved"),
    [(4, 2, 2, 1, 0), (8, 4, 4, 2, 0), (8, 2, 4, 2, 4), (16, 2, 4, 2, 8)],
)
def test_group_limited_twin_starves_only_experts_no_token_needs(
    tmp_path: Path, experts: int, top_k: int, groups: int, keep: int, starved: int
) -> None:
    spec = grouped_spec(experts, top_k, groups, keep)
    (tmp_path / "grouped.yaml").write_text(spec, encoding="utf-8")
    result = run_moegen("build", "--out", "out", "grouped.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_traceback(result.stderr)
    assert f"{starved} experts got 0 tokens" in result.stderr
