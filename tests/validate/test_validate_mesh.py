"""Stage 2, `moegen.validate`: the mesh rules (batch axes, batch, fsdp and expert sharding, CPU device count), passing and failing, located."""

from __future__ import annotations

from validate_cases import (
    KEY,
    VALUE,
    Cases,
    rule_tests,
)

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "batch_axes_are_mesh_axes": [
        ({}, []),  # default batch axes
        ({"batch_axes": ["fsdp", "data"]}, []),  # any order
        ({"batch_axes": []}, []),  # empty is another rule's business
        (
            {"axes": {"data": 2}, "batch_axes": ["data", "fsdp"]},
            [("mesh.batch_axes[1]", VALUE, "'fsdp' is not a mesh axis (mesh.axes: data)")],
        ),
        (
            {"batch_axes": ["data", "fsdp", "data"]},
            [("mesh.batch_axes[2]", VALUE, "'data' is listed twice")],
        ),
        (
            {"axes": {"fsdp": 4}, "batch_axes": ["data", "data"]},
            [
                ("mesh.batch_axes[0]", VALUE, "'data' is not a mesh axis (mesh.axes: fsdp)"),
                ("mesh.batch_axes[1]", VALUE, "'data' is not a mesh axis (mesh.axes: fsdp)"),
            ],
        ),
    ],
    "data_parallel_axes_shard_batch": [
        ({}, []),
        ({"batch_axes": ["data", "fsdp"]}, []),
        ({"axes": {"fsdp": 4}, "batch_axes": ["fsdp"]}, []),
        ({"axes": {"data": 2, "expert": 2}, "strategy": "ragged_all_to_all"}, []),
        (
            {"batch_axes": ["data"]},
            [
                (
                    "mesh.batch_axes",
                    VALUE,
                    "mesh axes ['fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        (
            {"batch_axes": []},
            [
                (
                    "mesh.batch_axes",
                    VALUE,
                    "mesh axes ['data', 'fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        # the expert axis shards tokens as well as experts: it is a batch axis too
        (
            {
                "axes": {"data": 2, "expert": 2},
                "strategy": "ragged_all_to_all",
                "batch_axes": ["data"],
            },
            [
                (
                    "mesh.batch_axes",
                    VALUE,
                    "mesh axes ['expert'] must shard the batch too; write ['data', 'expert']",
                )
            ],
        ),
    ],
    "batch_divisible_by_batch_axes": [
        ({"batch": 4}, []),  # 4 % (2*2) == 0
        ({"batch": 2, "batch_axes": ["data"]}, []),  # only the listed axes count
        ({"batch": 6, "batch_axes": ["data", "data"]}, []),  # a repeated axis counts once
        (
            {"batch": 12, "axes": {"data": 2, "fsdp": 4}},
            [
                (
                    "shapes.batch",
                    VALUE,
                    "12 is not divisible by data*fsdp = 8; nearest valid: 8 or 16",
                )
            ],
        ),
        (
            {"batch": 3, "axes": {"data": 2, "fsdp": 4}},
            [("shapes.batch", VALUE, "3 is not divisible by data*fsdp = 8; nearest valid: 8")],
        ),
        (
            {"batch": 3, "axes": {"data": 2, "fsdp": 4}, "batch_axes": ["fsdp"]},
            [("shapes.batch", VALUE, "3 is not divisible by fsdp = 4; nearest valid: 4")],
        ),
        # the expert axis shards the batch like any other axis
        (
            {"batch": 6, "axes": {"data": 2, "expert": 2}, "strategy": "ragged_all_to_all"},
            [
                (
                    "shapes.batch",
                    VALUE,
                    "6 is not divisible by data*expert = 4; nearest valid: 4 or 8",
                )
            ],
        ),
    ],
    "embed_divisible_by_fsdp": [
        ({"embed": 63, "axes": {"data": 2}}, []),  # no fsdp axis: nothing is sharded
        ({"embed": 64, "axes": {"fsdp": 8}}, []),
        (
            {"embed": 500, "axes": {"fsdp": 8}},
            [
                (
                    "layer.embed_dim",
                    VALUE,
                    (
                        "500 is not divisible by fsdp = 8 (parameters are sharded along "
                        "embed_dim); nearest valid: 496 or 504"
                    ),
                )
            ],
        ),
        (
            {"embed": 3, "axes": {"data": 2, "fsdp": 4}},
            [
                (
                    "layer.embed_dim",
                    VALUE,
                    (
                        "3 is not divisible by fsdp = 4 (parameters are sharded along "
                        "embed_dim); nearest valid: 4"
                    ),
                )
            ],
        ),
    ],
    "expert_axis_matches_strategy": [
        ({}, []),  # replicated experts, no expert axis
        ({"axes": {"data": 2, "expert": 2}, "strategy": "ragged_all_to_all"}, []),
        ({"axes": {"expert": 4}, "strategy": "ring_of_experts"}, []),
        ({"strategy": "replicated"}, []),  # written out, as by default
        # an expert axis with replicated experts (the default): at the axis's key
        (
            {"axes": {"data": 2, "expert": 2}},
            [
                (
                    "mesh.axes.expert",
                    KEY,
                    (
                        "an expert axis shards experts, but parallelism.experts is replicated; "
                        "set it to ragged_all_to_all or ring_of_experts"
                    ),
                )
            ],
        ),
        (
            {"axes": {"expert": 4}, "strategy": "replicated"},
            [
                (
                    "mesh.axes.expert",
                    KEY,
                    (
                        "an expert axis shards experts, but parallelism.experts is replicated; "
                        "set it to ragged_all_to_all or ring_of_experts"
                    ),
                )
            ],
        ),
        (
            {"axes": {"data": 2, "expert": 1}},
            [
                (
                    "mesh.axes.expert",
                    KEY,
                    (
                        "an expert axis shards experts, but parallelism.experts is replicated; "
                        "set it to ragged_all_to_all or ring_of_experts; or remove the axis "
                        "(of size 1, it shards nothing)"
                    ),
                )
            ],
        ),
        # a strategy that moves tokens to experts, with no expert axis to shard them over
        (
            {"strategy": "ragged_all_to_all"},
            [
                (
                    "parallelism.experts",
                    VALUE,
                    (
                        "ragged_all_to_all shards experts over a mesh axis named expert; "
                        "add one to mesh.axes"
                    ),
                )
            ],
        ),
        (
            {"axes": {"data": 4}, "strategy": "ring_of_experts"},
            [
                (
                    "parallelism.experts",
                    VALUE,
                    (
                        "ring_of_experts shards experts over a mesh axis named expert; "
                        "add one to mesh.axes"
                    ),
                )
            ],
        ),
    ],
    "experts_divisible_by_expert_axis": [
        ({}, []),  # no expert axis
        ({"experts": 6, "axes": {"data": 4}}, []),  # replicated: any number of experts
        ({"experts": 8, "axes": {"expert": 4}, "strategy": "ragged_all_to_all"}, []),
        ({"experts": 4, "top_k": 1, "axes": {"expert": 4}, "strategy": "ring_of_experts"}, []),
        (
            {"experts": 6, "axes": {"expert": 4}, "strategy": "ragged_all_to_all"},
            [
                (
                    "layer.num_experts",
                    VALUE,
                    "6 experts do not split over expert = 4 devices; nearest valid: 4 or 8",
                )
            ],
        ),
        (
            {"experts": 10, "axes": {"data": 1, "expert": 4}, "strategy": "ring_of_experts"},
            [
                (
                    "layer.num_experts",
                    VALUE,
                    "10 experts do not split over expert = 4 devices; nearest valid: 8 or 12",
                )
            ],
        ),
        # fewer experts than devices: the only valid value is above
        (
            {"experts": 3, "axes": {"expert": 4}, "strategy": "ring_of_experts"},
            [
                (
                    "layer.num_experts",
                    VALUE,
                    "3 experts do not split over expert = 4 devices; nearest valid: 4",
                )
            ],
        ),
    ],
    "mesh_fits_cpu_target": [
        ({"batch": 256, "axes": {"data": 256}}, []),
        ({"batch": 256, "axes": {"data": 16, "fsdp": 16}}, []),
        (
            {"batch": 512, "axes": {"data": 32, "fsdp": 16}},
            [("mesh.axes", KEY, "512 devices; target cpu runs at most 256 host devices")],
        ),
        (
            {"batch": 514, "axes": {"data": 257}},
            [("mesh.axes", KEY, "257 devices; target cpu runs at most 256 host devices")],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
