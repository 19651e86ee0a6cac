"""Stage 1, `moegen.load`: a placement file a spec names (parallelism.placement: NAME.json),
read beside the spec and hashed with it; every bad file refused at the spec's placement
value, naming the file and what is wrong, with nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from spec_builder import spec_positions, spec_yaml

from moegen.diagnostics import SpecError
from moegen.load import load_spec
from moegen.load.placement_file import MAX_PLACEMENT_BYTES
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate

PLACEMENT = [[{"expert": e, "share": 0.5}] for e in (2, 4, 6, 0)]
CHOICES = {
    "experts": 8,
    "embed": 64,
    "ffn": 48,
    "top_k": 2,
    "batch": 8,
    "seq_len": 8,
    "axes": {"expert": 4},
    "strategy": "ragged_all_to_all",
    "redundant_experts": 4,
    "placement": "placement.json",
}


def write(tmp_path: Path, placement: object = None, raw: bytes | None = None) -> Path:
    spec = tmp_path / "layer.yaml"
    spec.write_text(spec_yaml(CHOICES))
    if raw is None:
        record = {"format": "moegen-placement-2", "placement": placement or PLACEMENT}
        raw = json.dumps(record).encode()
    (tmp_path / "placement.json").write_bytes(raw)
    return spec


def refusal(spec: Path) -> str:
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    [diagnostic] = caught.value.diagnostics
    at = spec_positions(CHOICES)["parallelism.placement"].value
    assert (diagnostic.line, diagnostic.column, diagnostic.field) == (*at, "parallelism.placement")
    assert diagnostic.message.startswith("placement file 'placement.json': ")
    return diagnostic.message.removeprefix("placement file 'placement.json': ")


def test_the_file_is_read_into_the_spec_and_hashed_with_it(tmp_path) -> None:
    spec = write(tmp_path)
    loaded = validate(load_spec(spec))
    inline = [[r.model_dump() for r in device] for device in loaded.spec.parallelism.placement]
    assert inline == PLACEMENT
    first = render(make_plan(loaded))
    # another placement: another hash and another module, so `moegen check` calls it stale
    write(tmp_path, [[{"expert": e, "share": 0.25}] for e in (2, 4, 6, 0)])
    again = validate(load_spec(spec))
    assert again.source.sha256 != loaded.source.sha256
    assert render(make_plan(again)) != first
    assert loaded.source.sha256 in first


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{", "not JSON: "),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON: "),
        (b"[]", 'expected a JSON object with a "placement" list'),
        (b'{"placement": [], "extra": 1}', 'expected a JSON object with a "placement" list'),
        (b'{"format": "moegen-placement-1", "placement": []}', "format 'moegen-placement-1'"),
        (b'{"placement": [[{"expert": -1, "share": 0.5}]]}', "placement[0][0]['expert']: "),
        (b'{"placement": [[{"expert": 1, "share": 2.0}]]}', "placement[0][0]['share']: "),
        (b'{"placement": [[{"expert": "1", "share": 0.5}]]}', "placement[0][0]['expert']: "),
        (b'{"placement": [[{"expert": 1}]]}', "placement[0][0]['share']: "),
        (b'{"placement": [[{"expert": 1, "share": NaN}]]}', "placement[0][0]['share']: "),
        (b'{"placement": "x"}', "placement: "),
    ],
)
def test_a_bad_file_is_refused_with_its_reason(tmp_path, raw, reason) -> None:
    assert refusal(write(tmp_path, raw=raw)).startswith(reason)


def test_a_missing_an_unreadable_or_a_huge_file_is_refused(tmp_path) -> None:
    spec = write(tmp_path)
    (tmp_path / "placement.json").unlink()
    assert refusal(spec).startswith("no such file beside the spec")
    (tmp_path / "placement.json").mkdir()
    assert refusal(spec) == "not a regular file"
    (tmp_path / "placement.json").rmdir()
    (tmp_path / "placement.json").write_bytes(b" " * (MAX_PLACEMENT_BYTES + 1))
    assert refusal(spec) == f"over {MAX_PLACEMENT_BYTES} bytes; a placement file is at most that"


def test_a_link_to_a_device_is_not_read(tmp_path) -> None:
    spec = write(tmp_path)
    (tmp_path / "placement.json").unlink()
    os.symlink("/dev/zero", tmp_path / "placement.json")
    assert refusal(spec) == "not a regular file"


@pytest.mark.parametrize("name", ["../placement.json", "/etc/placement.json", "p.yaml", ".p.json"])
def test_the_spec_names_a_file_beside_it_only(tmp_path, name) -> None:
    spec = tmp_path / "layer.yaml"
    spec.write_text(spec_yaml({**CHOICES, "placement": name}))
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    assert [d.field for d in caught.value.diagnostics] == ["parallelism.placement"]
