"""Stage 2, `moegen.validate`: TPU topologies (shape per hardware, the mesh against the slice)."""

from __future__ import annotations

from validate_cases import (
    KEY,
    MIXTRAL_2SLICES,
    REPO_ROOT,
    TPU7X_SLICES,
    TWO_V5E_SLICES,
    V5E_SLICES,
    V5P_SLICES,
    VALUE,
    Cases,
    loaded_spec,
    position,
    rule_tests,
)

from moegen.load import load_spec_bytes
from moegen.validate import check_rules

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "topology_matches_hardware": [
        ({}, []),  # cpu: no topology
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),  # 4 chips, the 4-device mesh
        ({"hardware": "tpu-v6e", "topology": "2x4", "axes": {"data": 2, "fsdp": 4}}, []),
        ({"hardware": "tpu-v5p", "topology": "2x2x1"}, []),
        ({"hardware": "tpu7x", "topology": "2x2x1", "axes": {"data": 2, "fsdp": 4}}, []),
        (
            {"hardware": "tpu-v5e"},
            [("target", KEY, f"tpu-v5e needs target.topology, one of: {V5E_SLICES}")],
        ),
        (
            {"hardware": "tpu7x", "kernel": "pallas"},
            [("target", KEY, f"tpu7x needs target.topology, one of: {TPU7X_SLICES}")],
        ),
        (
            {"topology": "2x2"},
            [("target.topology", VALUE, "target cpu takes no topology; remove it")],
        ),
        (
            {"hardware": "tpu-v5e", "topology": "2x2x1"},  # a v5p shape on a v5e
            [
                (
                    "target.topology",
                    VALUE,
                    f"'2x2x1' is not a tpu-v5e slice; valid: {V5E_SLICES}; with 4 devices: 2x2",
                )
            ],
        ),
        (
            {"hardware": "tpu-v5p", "topology": "2x4", "axes": {"data": 2, "fsdp": 4}},
            [
                (
                    "target.topology",
                    VALUE,
                    f"'2x4' is not a tpu-v5p slice; valid: {V5P_SLICES}; with 8 devices: 2x2x2",
                )
            ],
        ),
        # tpu7x has two devices per chip: 8 devices are the 4 chips of 2x2x1
        (
            {"hardware": "tpu7x", "topology": "2x2x2", "axes": {"data": 2, "fsdp": 4}},
            [],
        ),
        (
            {"hardware": "tpu7x", "topology": "2x4", "axes": {"data": 2, "fsdp": 4}},
            [
                (
                    "target.topology",
                    VALUE,
                    f"'2x4' is not a tpu7x slice; valid: {TPU7X_SLICES}; with 8 devices: 2x2x1",
                )
            ],
        ),
        # libtpu's own spelling is not the spec's; the hint still names the right shape
        (
            {"hardware": "tpu-v6e", "topology": "v6e:2x2"},
            [
                (
                    "target.topology",
                    VALUE,
                    f"'v6e:2x2' is not a tpu-v6e slice; valid: {V5E_SLICES}; with 4 devices: 2x2",
                )
            ],
        ),
        # no slice of this generation has 12 devices: no hint
        (
            {"hardware": "tpu-v6e", "topology": "3x4", "batch": 12, "axes": {"data": 12}},
            [("target.topology", VALUE, f"'3x4' is not a tpu-v6e slice; valid: {V5E_SLICES}")],
        ),
    ],
    "mesh_matches_topology": [
        ({}, []),  # cpu
        ({"hardware": "tpu-v5e", "topology": "2x2"}, []),
        ({"hardware": "tpu-v5e", "topology": "1x1", "axes": {"data": 1}}, []),
        ({"hardware": "tpu-v5p", "topology": "2x2x2", "axes": {"data": 2, "fsdp": 4}}, []),
        ({"hardware": "tpu7x", "topology": "2x2x1", "axes": {"data": 2, "fsdp": 4}}, []),
        ({"hardware": "tpu-v5e"}, []),  # no topology: topology_matches_hardware reports it
        ({"hardware": "tpu-v5e", "topology": "2x3"}, []),  # not a slice: likewise
        (
            {"hardware": "tpu-v5e", "topology": "2x4"},
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 4 devices but tpu-v5e 2x4 has 8; "
                        "make the product of the axis sizes 8"
                    ),
                )
            ],
        ),
        (
            {"hardware": "tpu-v6e", "topology": "4x4", "axes": {"data": 2, "fsdp": 4}},
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 8 devices but tpu-v6e 4x4 has 16; "
                        "make the product of the axis sizes 16"
                    ),
                )
            ],
        ),
        # one mesh position per chip is not enough on tpu7x: JAX sees 2 devices per chip
        (
            {"hardware": "tpu7x", "topology": "2x2x1"},
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 4 devices but tpu7x 2x2x1 has 8 (2 per chip); "
                        "make the product of the axis sizes 8"
                    ),
                )
            ],
        ),
        # multi-slice: the mesh spans every slice, chips x slices devices
        (MIXTRAL_2SLICES, []),  # v5e 2x4 x 2 slices: 16 devices
        (
            {
                "hardware": "tpu-v5e",
                "topology": "2x4",
                "slices": 4,
                "batch": 32,
                "axes": {"data": 4, "fsdp": 8},
                "dcn_axes": {"data": 4},
            },
            [],
        ),
        (
            {
                "hardware": "tpu7x",
                "topology": "2x2x1",
                "slices": 2,
                "axes": {"data": 2, "fsdp": 8},
                "dcn_axes": {"data": 2},
            },
            [],  # 4 chips x 2 devices x 2 slices
        ),
        # one slice's worth of devices for two slices
        (
            {**TWO_V5E_SLICES, "axes": {"data": 2, "fsdp": 4}, "dcn_axes": {"data": 2}},
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 8 devices but tpu-v5e 2x4 x 2 slices has 16; "
                        "make the product of the axis sizes 16"
                    ),
                )
            ],
        ),
        (
            {
                **TWO_V5E_SLICES,
                "slices": 4,
                "axes": {"data": 4, "fsdp": 4},
                "dcn_axes": {"data": 4},
            },
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 16 devices but tpu-v5e 2x4 x 4 slices has 32; "
                        "make the product of the axis sizes 32"
                    ),
                )
            ],
        ),
        (
            {
                "hardware": "tpu7x",
                "topology": "2x2x1",
                "slices": 2,
                "axes": {"data": 2, "fsdp": 4},
                "dcn_axes": {"data": 2},
            },
            [
                (
                    "mesh.axes",
                    KEY,
                    (
                        "the mesh has 8 devices but tpu7x 2x2x1 x 2 slices has 16 (2 per chip); "
                        "make the product of the axis sizes 16"
                    ),
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def test_tpu_rules_report_together() -> None:
    """A TPU spec with every target field wrong: each problem once, where it is written."""
    choices = {
        "hardware": "tpu-v5e",
        "topology": "2x2x1",
        "kernel": "pallas",
        "tiles": {"gate_up": [8, 1024, 1024], "down": [512, 1000, 1024]},
    }
    fields = ["target.topology", "target.tiles.gate_up", "target.tiles.down"]
    assert [(d.line, d.column, d.field) for d in check_rules(loaded_spec(choices))] == [
        (*position(choices, field), field) for field in fields
    ]


def test_example_tpu_spec_needs_its_topology() -> None:
    """The v5e example without its topology line is refused at the target key."""
    text = (REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml").read_text(encoding="utf-8")
    assert "  topology: 2x4\n" in text
    loaded = load_spec_bytes(text.replace("  topology: 2x4\n", "").encode(), "v5e.yaml", "v5e")
    [diagnostic] = check_rules(loaded)
    assert diagnostic.field == "target"
    assert diagnostic.message.startswith("tpu-v5e needs target.topology, one of: ")
