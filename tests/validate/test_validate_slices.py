"""Stage 2, `moegen.validate`: multi-slice targets (target.slices, mesh.dcn_axes, the expert axis across slices)."""

from __future__ import annotations

import re

import yaml
from validate_cases import (
    EXPERT_OVER_DCN,
    KEY,
    MIXTRAL_2SLICES,
    REPO_ROOT,
    TWO_V5E_SLICES,
    VALUE,
    Cases,
    loaded_spec,
    rule_tests,
)

from moegen.load import load_spec_bytes
from moegen.validate import check_rules

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "slices_need_a_tpu_target": [
        ({}, []),  # one slice, the default
        ({"slices": 1}, []),  # written out
        (MIXTRAL_2SLICES, []),
        (
            {"slices": 2, "dcn_axes": {"data": 2}},
            [
                (
                    "target.slices",
                    VALUE,
                    "cpu has no slices; remove target.slices or pick a TPU target",
                )
            ],
        ),
    ],
    "dcn_fields_need_a_tpu_target": [
        ({}, []),
        (MIXTRAL_2SLICES, []),
        (
            {"dcn_axes": {"data": 2}, "expert_over_dcn": True},
            [
                (
                    "mesh.dcn_axes",
                    KEY,
                    (
                        "dcn_axes describes how mesh axes cross TPU slices; target cpu has none, so "
                        "it would be ignored: remove it"
                    ),
                ),
                (
                    "mesh.expert_over_dcn",
                    KEY,
                    (
                        "expert_over_dcn describes how mesh axes cross TPU slices; target cpu has "
                        "none, so it would be ignored: remove it"
                    ),
                ),
            ],
        ),
    ],
    "dcn_axes_split_mesh_axes": [
        ({}, []),  # no dcn_axes
        (MIXTRAL_2SLICES, []),
        ({**MIXTRAL_2SLICES, "dcn_axes": {"data": 2, "fsdp": 1}}, []),  # a part of 1 is in-slice
        # fsdp crosses the slices: 2 of its 4 ways in each slice
        ({**TWO_V5E_SLICES, "axes": {"data": 4, "fsdp": 4}, "dcn_axes": {"fsdp": 2}}, []),
        # data crosses the slices, but the mesh has no data axis: at the key
        (
            {**TWO_V5E_SLICES, "axes": {"fsdp": 16}, "dcn_axes": {"data": 2}},
            [("mesh.dcn_axes.data", KEY, "'data' is not a mesh axis (mesh.axes: fsdp)")],
        ),
        # 3 slices crossed by an fsdp axis of 8: at the value
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 3,
                "batch": 24,
                "axes": {"data": 3, "fsdp": 8},
                "dcn_axes": {"fsdp": 3},
            },
            [
                (
                    "mesh.dcn_axes.fsdp",
                    VALUE,
                    "fsdp = 8 does not split into 3 slices; valid: 1, 2, 4, 8",
                )
            ],
        ),
        # more slices than the axis has devices
        (
            {
                **TWO_V5E_SLICES,
                "slices": 4,
                "batch": 32,
                "axes": {"data": 2, "fsdp": 16},
                "dcn_axes": {"data": 4},
            },
            [("mesh.dcn_axes.data", VALUE, "data = 2 does not split into 4 slices; valid: 1, 2")],
        ),
        # both problems, each where it is written
        (
            {
                **TWO_V5E_SLICES,
                "slices": 6,
                "batch": 48,
                "axes": {"fsdp": 4, "expert": 12},
                "strategy": "ragged_all_to_all",
                "experts": 24,
                "dcn_axes": {"data": 2, "fsdp": 3},
            },
            [
                ("mesh.dcn_axes.data", KEY, "'data' is not a mesh axis (mesh.axes: fsdp, expert)"),
                (
                    "mesh.dcn_axes.fsdp",
                    VALUE,
                    "fsdp = 4 does not split into 3 slices; valid: 1, 2, 4",
                ),
            ],
        ),
    ],
    "dcn_axes_span_the_slices": [
        ({}, []),  # one slice, no dcn_axes
        ({"dcn_axes": {"data": 1}}, []),  # one slice, said explicitly
        (MIXTRAL_2SLICES, []),
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 4,
                "batch": 32,
                "axes": {"data": 4, "fsdp": 8},
                "dcn_axes": {"data": 2, "fsdp": 2},
            },
            [],  # 2 x 2 = 4 slices
        ),
        # several slices, none of the axes said to cross them: at target.slices
        (
            {**MIXTRAL_2SLICES, "dcn_axes": None},
            [
                (
                    "target.slices",
                    VALUE,
                    (
                        "2 slices, but mesh.dcn_axes does not say which axes cross them; add e.g. "
                        "dcn_axes: {data: 2} under mesh"
                    ),
                )
            ],
        ),
        # the product of the parts is not the number of slices: at the dcn_axes key
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 4,
                "batch": 32,
                "axes": {"data": 4, "fsdp": 8},
                "dcn_axes": {"data": 2},
            },
            [
                (
                    "mesh.dcn_axes",
                    KEY,
                    "the cross-slice parts multiply to 2 but target.slices is 4; make them equal",
                )
            ],
        ),
        (
            {**TWO_V5E_SLICES, "axes": {"data": 4, "fsdp": 4}, "dcn_axes": {"data": 2, "fsdp": 2}},
            [
                (
                    "mesh.dcn_axes",
                    KEY,
                    "the cross-slice parts multiply to 4 but target.slices is 2; make them equal",
                )
            ],
        ),
        # dcn_axes on a one-slice target (slices left at its default 1)
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "axes": {"data": 2, "fsdp": 4},
                "dcn_axes": {"data": 2},
            },
            [
                (
                    "mesh.dcn_axes",
                    KEY,
                    "the cross-slice parts multiply to 2 but target.slices is 1; make them equal",
                )
            ],
        ),
    ],
    "expert_axis_stays_in_a_slice": [
        ({}, []),
        (MIXTRAL_2SLICES, []),  # data crosses the slices, experts stay in each
        ({**MIXTRAL_2SLICES, "dcn_axes": {"data": 2, "expert": 1}}, []),  # explicitly in-slice
        ({**MIXTRAL_2SLICES, "dcn_axes": {"expert": 2}, "expert_over_dcn": True}, []),  # accepted
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 2,
                "axes": {"data": 2, "fsdp": 2, "expert": 4},
                "strategy": "ring_of_experts",
                "dcn_axes": {"expert": 2},
                "expert_over_dcn": True,
            },
            [],
        ),
        # the expert axis crosses the slices: at the part
        (
            {**MIXTRAL_2SLICES, "dcn_axes": {"expert": 2}},
            [("mesh.dcn_axes.expert", VALUE, EXPERT_OVER_DCN)],
        ),
        (
            {**MIXTRAL_2SLICES, "dcn_axes": {"expert": 2}, "expert_over_dcn": False},
            [("mesh.dcn_axes.expert", VALUE, EXPERT_OVER_DCN)],
        ),
        (
            {
                **TWO_V5E_SLICES,
                "slices": 4,
                "batch": 32,
                "axes": {"data": 2, "fsdp": 2, "expert": 8},
                "strategy": "ragged_all_to_all",
                "dcn_axes": {"data": 2, "expert": 2},
            },
            [("mesh.dcn_axes.expert", VALUE, EXPERT_OVER_DCN)],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def test_example_multi_slice_spec_without_its_slices_is_refused() -> None:
    """specs/mixtral_8x7b_2slices_v5e.yaml spans 16 devices: one 2x4 slice has 8."""
    text = (REPO_ROOT / "specs" / "mixtral_8x7b_2slices_v5e.yaml").read_text(encoding="utf-8")
    assert "  slices: 2\n" in text
    loaded = load_spec_bytes(text.replace("  slices: 2\n", "").encode(), "2s.yaml", "two")
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        (
            "mesh.axes",
            "the mesh has 16 devices but tpu-v5e 2x4 has 8; make the product of the axis sizes 8",
        ),
        (
            "mesh.dcn_axes",
            "the cross-slice parts multiply to 2 but target.slices is 1; make them equal",
        ),
    ]


def test_dcn_axes_advice_followed_passes() -> None:
    """Several slices and no dcn_axes: the dcn_axes the message suggests pass every rule."""
    loaded = loaded_spec({**MIXTRAL_2SLICES, "dcn_axes": None})
    [diagnostic] = check_rules(loaded)
    suggested = re.search(r"dcn_axes: (\{.*\}) under mesh", diagnostic.message)
    assert suggested, diagnostic.message
    dcn_axes = yaml.safe_load(suggested.group(1))  # the message writes it as YAML
    assert check_rules(loaded_spec({**MIXTRAL_2SLICES, "dcn_axes": dcn_axes})) == []


def test_topology_hint_counts_the_devices_of_one_slice() -> None:
    choices = {**TWO_V5E_SLICES, "axes": {"data": 2, "fsdp": 8}, "dcn_axes": {"data": 2}}
    [diagnostic] = check_rules(loaded_spec({**choices, "topology": "2x2x1"}))
    hint = diagnostic.message.rsplit(": ", 1)[1]
    assert check_rules(loaded_spec({**choices, "topology": hint})) == [], diagnostic.message


def test_dcn_axis_missing_from_the_mesh_is_reported_once() -> None:
    loaded = loaded_spec(
        {**TWO_V5E_SLICES, "axes": {"data": 2, "fsdp": 8}, "dcn_axes": {"expert": 2}}
    )
    assert [(d.field, d.message) for d in check_rules(loaded)] == [
        ("mesh.dcn_axes.expert", "'expert' is not a mesh axis (mesh.axes: data, fsdp)")
    ]


def test_slices_on_cpu_get_one_fix() -> None:
    assert [(d.field, d.message) for d in check_rules(loaded_spec({"slices": 2}))] == [
        ("target.slices", "cpu has no slices; remove target.slices or pick a TPU target")
    ]
