"""moegen.variants.derive: a spec with some fields changed, validated again, located at the
original file (the twin, tune's candidates and the benchmark's variants are all made so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moegen.diagnostics import SpecError
from moegen.pipeline import load_valid
from moegen.spec import Tiles
from moegen.variants import derive, unchecked

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded():
    return load_valid(REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml")


def test_fields_change_and_nothing_else(loaded) -> None:
    tiles = Tiles(gate_up=[256, 512, 512], down=[256, 512, 512])
    derived = derive(
        loaded, {("memory", "ffn_chunks"): 2, ("target", "tiles"): tiles, ("shapes", "batch"): 16}
    )
    spec, old = derived.spec, loaded.spec
    assert (spec.memory.ffn_chunks, spec.target.tiles, spec.shapes.batch) == (2, tiles, 16)
    assert spec.target.hardware == old.target.hardware and spec.shapes.seq_len == old.shapes.seq_len
    assert spec.layer == old.layer and spec.router == old.router
    assert derived.source is loaded.source and derived.locations is loaded.locations
    assert loaded.spec.shapes.batch == old.shapes.batch  # the original is untouched


def test_a_derived_spec_that_breaks_a_rule_is_refused_at_the_original_file(loaded) -> None:
    with pytest.raises(SpecError) as caught:
        derive(loaded, {("layer", "embed_dim"): 4095})  # not whole lanes over fsdp
    assert all(d.file == loaded.source.display for d in caught.value.diagnostics)
    odd = unchecked(loaded, {("layer", "embed_dim"): 4095})  # the copy, for its diagnostics
    assert odd.spec.layer.embed_dim == 4095


def test_a_section_set_whole_and_field_by_field_is_an_error(loaded) -> None:
    with pytest.raises(ValueError, match="memory is set both whole"):
        derive(loaded, {("memory",): loaded.spec.memory, ("memory", "ffn_chunks"): 2})
    with pytest.raises(ValueError, match="not a field path"):
        derive(loaded, {(): 1})
