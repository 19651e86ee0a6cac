"""Stage 2, `moegen.validate`: the mesh rules (batch axes, batch, fsdp and expert sharding, CPU device count), passing and failing, located."""

from __future__ import annotations

from validate_cases import rule_tests

from moegen.validate import MAX_CPU_DEVICES

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))].
CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "batch_axes_are_mesh_axes": [
        ({}, []),  # default batch axes
        ({"batch_axes": "[fsdp, data]"}, []),  # any order
        ({"batch_axes": "[]"}, []),  # empty is another rule's business
        (
            {"axes": "{data: 2}", "batch_axes": "[data, fsdp]"},
            [(14, 22, "mesh.batch_axes[1]", "'fsdp' is not a mesh axis (mesh.axes: data)")],
        ),
        (
            {"batch_axes": "[data, fsdp, data]"},
            [(14, 28, "mesh.batch_axes[2]", "'data' is listed twice")],
        ),
        (
            {"axes": "{fsdp: 4}", "batch_axes": "[data, data]"},
            [
                (14, 16, "mesh.batch_axes[0]", "'data' is not a mesh axis (mesh.axes: fsdp)"),
                (14, 22, "mesh.batch_axes[1]", "'data' is not a mesh axis (mesh.axes: fsdp)"),
            ],
        ),
    ],
    "data_parallel_axes_shard_batch": [
        ({}, []),
        ({"batch_axes": "[data, fsdp]"}, []),
        ({"axes": "{fsdp: 4}", "batch_axes": "[fsdp]"}, []),
        ({"axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"}, []),
        (
            {"batch_axes": "[data]"},
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        (
            {"batch_axes": "[]"},
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['data', 'fsdp'] must shard the batch too; write ['data', 'fsdp']",
                )
            ],
        ),
        # the expert axis shards tokens as well as experts: it is a batch axis too
        (
            {
                "axes": "{data: 2, expert: 2}",
                "strategy": "ragged_all_to_all",
                "batch_axes": "[data]",
            },
            [
                (
                    14,
                    15,
                    "mesh.batch_axes",
                    "mesh axes ['expert'] must shard the batch too; write ['data', 'expert']",
                )
            ],
        ),
    ],
    "batch_divisible_by_batch_axes": [
        ({"batch": 4}, []),  # 4 % (2*2) == 0
        ({"batch": 2, "batch_axes": "[data]"}, []),  # only the listed axes count
        ({"batch": 6, "batch_axes": "[data, data]"}, []),  # a repeated axis counts once
        (
            {"batch": 12, "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    "12 is not divisible by data*fsdp = 8; nearest valid: 8 or 16",
                )
            ],
        ),
        (
            {"batch": 3, "axes": "{data: 2, fsdp: 4}"},
            [(10, 10, "shapes.batch", "3 is not divisible by data*fsdp = 8; nearest valid: 8")],
        ),
        (
            {"batch": 3, "axes": "{data: 2, fsdp: 4}", "batch_axes": "[fsdp]"},
            [(10, 10, "shapes.batch", "3 is not divisible by fsdp = 4; nearest valid: 4")],
        ),
        # the expert axis shards the batch like any other axis
        (
            {"batch": 6, "axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"},
            [
                (
                    10,
                    10,
                    "shapes.batch",
                    "6 is not divisible by data*expert = 4; nearest valid: 4 or 8",
                )
            ],
        ),
    ],
    "embed_divisible_by_fsdp": [
        ({"embed": 63, "axes": "{data: 2}"}, []),  # no fsdp axis: nothing is sharded
        ({"embed": 64, "axes": "{fsdp: 8}"}, []),
        (
            {"embed": 500, "axes": "{fsdp: 8}"},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    (
                        "500 is not divisible by fsdp = 8 (parameters are sharded along "
                        "embed_dim); nearest valid: 496 or 504"
                    ),
                )
            ],
        ),
        (
            {"embed": 3, "axes": "{data: 2, fsdp: 4}"},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
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
        ({"axes": "{data: 2, expert: 2}", "strategy": "ragged_all_to_all"}, []),
        ({"axes": "{expert: 4}", "strategy": "ring_of_experts"}, []),
        ({"strategy": "replicated"}, []),  # written out, as by default
        # an expert axis with replicated experts (the default): at the axis's key
        (
            {"axes": "{data: 2, expert: 2}"},
            [
                (
                    13,
                    19,
                    "mesh.axes.expert",
                    "an expert axis shards experts, but parallelism.experts is replicated; "
                    "set it to ragged_all_to_all or ring_of_experts",
                )
            ],
        ),
        (
            {"axes": "{expert: 4}", "strategy": "replicated"},
            [
                (
                    13,
                    10,
                    "mesh.axes.expert",
                    "an expert axis shards experts, but parallelism.experts is replicated; "
                    "set it to ragged_all_to_all or ring_of_experts",
                )
            ],
        ),
        # a strategy that moves tokens to experts, with no expert axis to shard them over
        (
            {"strategy": "ragged_all_to_all"},
            [
                (
                    15,
                    24,
                    "parallelism.experts",
                    "ragged_all_to_all shards experts over a mesh axis named expert; "
                    "add one to mesh.axes",
                )
            ],
        ),
        (
            {"axes": "{data: 4}", "strategy": "ring_of_experts"},
            [
                (
                    15,
                    24,
                    "parallelism.experts",
                    "ring_of_experts shards experts over a mesh axis named expert; "
                    "add one to mesh.axes",
                )
            ],
        ),
    ],
    "experts_divisible_by_expert_axis": [
        ({}, []),  # no expert axis
        ({"experts": 6, "axes": "{data: 4}"}, []),  # replicated: any number of experts
        ({"experts": 8, "axes": "{expert: 4}", "strategy": "ragged_all_to_all"}, []),
        ({"experts": 4, "top_k": 1, "axes": "{expert: 4}", "strategy": "ring_of_experts"}, []),
        (
            {"experts": 6, "axes": "{expert: 4}", "strategy": "ragged_all_to_all"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "6 experts do not split over expert = 4 devices; nearest valid: 4 or 8",
                )
            ],
        ),
        (
            {"experts": 10, "axes": "{data: 1, expert: 4}", "strategy": "ring_of_experts"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "10 experts do not split over expert = 4 devices; nearest valid: 8 or 12",
                )
            ],
        ),
        # fewer experts than devices: the only valid value is above
        (
            {"experts": 3, "axes": "{expert: 4}", "strategy": "ring_of_experts"},
            [
                (
                    3,
                    16,
                    "layer.num_experts",
                    "3 experts do not split over expert = 4 devices; nearest valid: 4",
                )
            ],
        ),
    ],
    "mesh_fits_cpu_target": [
        ({"batch": 256, "axes": f"{{data: {MAX_CPU_DEVICES}}}"}, []),
        ({"batch": 256, "axes": "{data: 16, fsdp: 16}"}, []),
        (
            {"batch": 512, "axes": "{data: 32, fsdp: 16}"},
            [(13, 3, "mesh.axes", "512 devices; target cpu runs at most 256 host devices")],
        ),
        (
            {"batch": 514, "axes": "{data: 257}"},
            [(13, 3, "mesh.axes", "257 devices; target cpu runs at most 256 host devices")],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
