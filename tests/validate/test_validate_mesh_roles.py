"""Stage 2, `moegen.validate`: the mesh-role rules (tensor and sequence axes), passing and
failing, located."""

from __future__ import annotations

from validate_cases import (
    VALUE,
    Cases,
    rule_tests,
)

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "batch_axes_leave_out_tensor_and_sequence": [
        ({"axes": {"data": 2, "tensor": 2}}, []),  # by default neither shards the batch
        ({"axes": {"data": 2, "sequence": 2}, "batch_axes": ["data"]}, []),
        (
            {"axes": {"data": 2, "tensor": 2}, "batch_axes": ["data", "tensor"]},
            [
                (
                    "mesh.batch_axes[1]",
                    VALUE,
                    (
                        "'tensor' cannot shard the batch: the tensor axis splits each expert's FFN "
                        "width, every tensor shard needs the same tokens; remove it from "
                        "mesh.batch_axes"
                    ),
                )
            ],
        ),
        (
            {"axes": {"sequence": 2, "data": 2}, "batch_axes": ["sequence", "data"]},
            [
                (
                    "mesh.batch_axes[0]",
                    VALUE,
                    (
                        "'sequence' cannot shard the batch: the sequence axis splits each sequence "
                        "along seq_len; remove it from mesh.batch_axes"
                    ),
                )
            ],
        ),
    ],
    "ffn_divisible_by_tensor": [
        ({"axes": {"data": 2, "tensor": 4}}, []),
        ({"axes": {"tensor": 2}, "shared_ffn": 96}, []),
        (
            {"ffn": 130, "axes": {"data": 2, "tensor": 4}},
            [
                (
                    "layer.ffn_dim",
                    VALUE,
                    (
                        "ffn_dim = 130 does not split over the tensor axis of 4; nearest widths "
                        "that do: 128 or 132"
                    ),
                )
            ],
        ),
        (
            {"axes": {"tensor": 8}, "shared_ffn": 100},
            [
                (
                    "layer.shared_ffn_dim",
                    VALUE,
                    (
                        "shared_ffn_dim = 100 does not split over the tensor axis of 8; nearest "
                        "widths that do: 96 or 104"
                    ),
                )
            ],
        ),
    ],
    "seq_len_divisible_by_sequence": [
        ({"axes": {"data": 2, "sequence": 4}}, []),
        ({"axes": {"data": 2}, "seq_len": 31}, []),  # no sequence axis: any length
        (
            {"axes": {"data": 2, "sequence": 3}, "seq_len": 32},
            [
                (
                    "shapes.seq_len",
                    VALUE,
                    "seq_len 32 does not split over the sequence axis of 3; nearest: 30 or 33",
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
