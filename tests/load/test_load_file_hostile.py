"""Hostile load files for `moegen rebalance --load` (moegen.placement.read_load) and hostile
placement files a spec names: every one refused with a message naming the file and what is
wrong (exit 2, nothing written), never a traceback, an internal error or a hang; and loads
of huge or subnormal counts placed as their proportions say."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen
from spec_builder import spec_yaml

from moegen.diagnostics import SpecError
from moegen.load import load_spec
from moegen.placement import LoadError, place, read_load

CHOICES = {
    "experts": 8,
    "embed": 8,
    "ffn": 16,
    "top_k": 2,
    "batch": 4,
    "seq_len": 64,
    "axes": {"expert": 4},
    "strategy": "ragged_all_to_all",
}
ONES = ",1,1,1,1,1,1,1"

# name -> (the load file's bytes, words the refusal holds after the file's name)
HOSTILE = {
    "a 400-digit integer": (
        b'{"tokens_per_expert": [' + b"9" * 400 + ONES.encode() + b"]}",
        "tokens_per_expert[0] is a 400-digit number: too long",
    ),
    "a 5000-digit integer": (
        b'{"tokens_per_expert": [1, ' + b"7" * 5000 + b",1,1,1,1,1,1]}",
        "tokens_per_expert[1] is a 5000-digit number: too long",
    ),
    "an integer past float64": (
        b'{"tokens_per_expert": [' + b"9" * 309 + ONES.encode() + b"]}",
        "tokens_per_expert[0] = 9999999999",
    ),
    "a float past float64": (
        b'{"tokens_per_expert": [1e309' + ONES.encode() + b"]}",
        "tokens_per_expert[0] = inf: too large",
    ),
    "a sum past float64": (
        b'{"tokens_per_expert": [1e308, 1e308, 1, 1, 1, 1, 1, 1]}',
        "tokens_per_expert sums to over 1.798e+308",
    ),
    "a key twice": (
        b'{"tokens_per_expert": [1,1,1,1,1,1,1,1], "tokens_per_expert": [9' + ONES.encode() + b"]}",
        "the key 'tokens_per_expert' appears twice in one object",
    ),
    "a nested key twice": (
        b'{"steps": {"a": 1, "a": 2}, "tokens_per_expert": [1' + ONES.encode() + b"]}",
        "the key 'a' appears twice in one object",
    ),
    "every count 0": (
        b'{"tokens_per_expert": [0, 0, 0, 0, 0, 0, 0, 0]}',
        "every count is 0",
    ),
    "a FIFO": (None, "not a regular file"),
    "a link to a device": (None, "not a regular file"),
}


def _write_load(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "load.json"
    content, _ = HOSTILE[name]
    if name == "a FIFO":
        os.mkfifo(path)  # no writer: opening it for reading would block for ever
    elif name == "a link to a device":
        os.symlink("/dev/zero", path)
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("name", list(HOSTILE))
def test_rebalance_refuses_a_hostile_load_naming_the_file(tmp_path, invoke_main, name) -> None:
    (tmp_path / "layer.yaml").write_text(spec_yaml(CHOICES))
    _write_load(tmp_path, name)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = ("rebalance", "layer.yaml", "--load", "load.json", "--slots", "1")
    if name == "a FIFO":  # in a child with a timeout: a regression would hang in-process
        ran = run_moegen(*args, "--out", "p.json", cwd=tmp_path, timeout=120)
        code, stderr, output = ran.returncode, ran.stderr, ran.stdout + ran.stderr
    else:
        result = invoke_main(*args, "--out", "p.json", cwd=tmp_path)
        code, stderr, output = result.code, result.stderr, result.output
    assert code == 2, output
    assert f"load.json: {HOSTILE[name][1]}" in stderr and "nothing written" in stderr
    assert_no_traceback(output)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("name", list(HOSTILE))
def test_read_load_refuses_a_hostile_load_with_a_load_error(tmp_path, name) -> None:
    path = _write_load(tmp_path, name)
    # a regression that opens the FIFO would block: a writer then comes, and the test fails
    rescue = threading.Timer(30, lambda: open(path, "wb").close())  # noqa: SIM115
    if name == "a FIFO":
        rescue.start()
    try:
        with pytest.raises(LoadError) as raised:
            read_load(path, 8)
    finally:
        rescue.cancel()
    assert str(raised.value).startswith(f"{path}: {HOSTILE[name][1]}")
    assert "set_int_max_str_digits" not in str(raised.value)


def test_a_long_integer_outside_the_counts_is_no_harm(tmp_path) -> None:
    path = tmp_path / "load.json"
    path.write_bytes(
        b'{"steps": ' + b"9" * 5000 + b', "tokens_per_expert": [2' + ONES.encode() + b"]}"
    )
    assert read_load(path, 8) == [2.0] + [1.0] * 7


@pytest.mark.parametrize("scale", [2.0**-1073, 2.0**-1000, 2.0**-20, 2.0**20, 2.0**1021])
def test_the_placement_depends_on_the_proportions_alone(scale) -> None:
    """A load scaled by a power of two (exact: the same proportions) places as the load,
    though its counts are subnormal, or their sum is past float64 (2**1021)."""
    load = [4.0, 1.0, 0.0, 2.0, 0.5, 0.0, 3.0, 1.0]
    want = place(load, 4, 1)
    scaled = [value * scale for value in load]
    assert place(scaled, 4, 1) == want
    assert want.busiest_over_mean(scaled) == pytest.approx(want.busiest_over_mean(load))


def test_a_subnormal_load_is_placed_as_its_proportions_say(tmp_path, invoke_main) -> None:
    (tmp_path / "layer.yaml").write_text(spec_yaml(CHOICES))
    placements = []
    for load in ([5e-324, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]):
        (tmp_path / "load.json").write_text(json.dumps({"tokens_per_expert": load}))
        args = ("rebalance", "layer.yaml", "--load", "load.json", "--out", "p.json")
        result = invoke_main(*args, cwd=tmp_path)
        assert result.code == 0, result.output
        assert "busiest device: 4.000x the mean before, 1.000x after" in result.stdout
        placements.append(json.loads((tmp_path / "p.json").read_text())["placement"])
    assert placements[0] == placements[1]


def test_place_refuses_an_integer_past_float64() -> None:
    with pytest.raises(ValueError, match=r"load\[0\] = 1000"):
        place([10**400, 1, 1, 1], 2, 1)


PLACEMENT_CHOICES = {**CHOICES, "redundant_experts": 4, "placement": "placement.json"}
SLOT = '{"expert": 2, "share": 0.5}'


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            '{"placement": [[X], [{"expert": 4, "share": 0.5}], [X], [X]], "placement": []}',
            "the key 'placement' appears twice in one object",
        ),
        (
            '{"placement": [[{"expert": 2, "share": 0.5, "share": 1.0}], [X], [X], [X]]}',
            "the key 'share' appears twice in one object",
        ),
        (
            '{"placement": [[{"expert": 2, "share": ' + "1" * 5000 + "}], [X], [X], [X]]}",
            "a 5000-digit integer: too long",
        ),
    ],
    ids=["placement twice", "share twice", "a 5000-digit share"],
)
def test_a_hostile_placement_file_is_refused_at_the_spec(tmp_path, raw, reason) -> None:
    spec = tmp_path / "layer.yaml"
    spec.write_text(spec_yaml(PLACEMENT_CHOICES))
    (tmp_path / "placement.json").write_text(raw.replace("X", SLOT))
    with pytest.raises(SpecError) as caught:
        load_spec(spec)
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.field == "parallelism.placement"
    assert diagnostic.message.startswith(f"placement file 'placement.json': {reason}")
