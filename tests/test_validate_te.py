"""Stage 2, `moegen.validate`: kernel te (Transformer Engine) on NVIDIA GPU targets, and its quantization."""

from __future__ import annotations

from validate_cases import (
    H100_8,
    TE_OFF_GPU,
    rule_tests,
)

# rule name -> [(spec overrides, expected diagnostics: (line, column, field, message))].
TOKAMAX = {
    "hardware": "gpu-h100", "topology": "8", "kernel": "tokamax", "axes": "{fsdp: 8}",
    "embed": 128, "ffn": 256,
}  # fmt: skip

CASES: dict[str, list[tuple[dict, list[tuple[int, int, str, str]]]]] = {
    "te_runs_on_nvidia_gpus": [
        ({"kernel": "te", **H100_8}, []),
        ({"kernel": "te", "hardware": "gpu-a100", "topology": 4, "axes": "{fsdp: 4}"}, []),
        ({"hardware": "gpu-h100", "topology": 4, "axes": "{fsdp: 4}"}, []),  # xla on a GPU
        (
            {"kernel": "te"},
            [(20, 11, "target.kernel", TE_OFF_GPU.format(target="cpu", other="xla"))],
        ),
        (
            {"kernel": "te", "hardware": "tpu-v5e", "topology": "2x2", "axes": "{fsdp: 4}"},
            [(20, 11, "target.kernel", TE_OFF_GPU.format(target="tpu-v5e", other="pallas or xla"))],
        ),
    ],
    "quantization_needs_te": [
        ({"quantization": "none"}, []),
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),
        (
            {"quantization": "fp8", "hardware": "gpu-h100", "topology": 4, "axes": "{fsdp: 4}"},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "quantization fp8 needs kernel: te (an NVIDIA GPU target); kernel xla "
                    "computes in dtypes.compute: set quantization: none",
                )
            ],
        ),
    ],
    "quantization_fits_the_gpu": [
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),
        ({"kernel": "te", "quantization": "mxfp8", **H100_8, "hardware": "gpu-b200"}, []),
        ({"kernel": "te", "quantization": "none", **H100_8, "hardware": "gpu-a100"}, []),
        # MXFP8 on Hopper
        (
            {"kernel": "te", "quantization": "mxfp8", **H100_8},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "mxfp8 needs Blackwell (SM 10.0) or newer; gpu-h100 is SM 9.0: use "
                    "quantization fp8 or none, or target gpu-b200",
                )
            ],
        ),
        # FP8 before Hopper
        (
            {"kernel": "te", "quantization": "fp8", **H100_8, "hardware": "gpu-a100"},
            [
                (
                    21,
                    17,
                    "target.quantization",
                    "fp8 needs Hopper (SM 9.0) or newer; gpu-a100 is SM 8.0: use quantization "
                    "none, or target gpu-h100 or gpu-h200 or gpu-b200",
                )
            ],
        ),
    ],
    "quantized_widths_fit": [
        ({"kernel": "te", "quantization": "fp8", **H100_8}, []),  # 64 and 128
        ({"kernel": "te", "quantization": "fp8", "embed": 48, **H100_8}, []),  # 16 x 3
        (
            {
                "kernel": "te",
                "quantization": "mxfp8",
                "embed": 48,
                **H100_8,
                "hardware": "gpu-b200",
            },
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    "embed_dim = 48 is not a multiple of 32, as mxfp8 GEMMs need; "
                    "nearest: 32 or 64",
                )
            ],
        ),
        (
            {"kernel": "te", "quantization": "fp8", "ffn": 136, "embed": 72, **H100_8},
            [
                (
                    4,
                    14,
                    "layer.embed_dim",
                    "embed_dim = 72 is not a multiple of 16, as fp8 GEMMs need; nearest: 64 or 80",
                ),
                (
                    5,
                    12,
                    "layer.ffn_dim",
                    "ffn_dim = 136 is not a multiple of 16, as fp8 GEMMs need; nearest: 128 or 144",
                ),
            ],
        ),
    ],
    # kernel tokamax: Hopper only (no SM 10.0 weight-gradient kernel), bfloat16, 128-wide
    "tokamax_runs_on_hopper": [
        ({**TOKAMAX}, []),
        ({**TOKAMAX, "hardware": "gpu-h200"}, []),
        (
            {**TOKAMAX, "hardware": "gpu-b200"},
            [
                (
                    20,
                    11,
                    "target.kernel",
                    "kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) trains on Hopper "
                    "(SM 9.0: gpu-h100 or gpu-h200) only: tokamax 0.0.17's Mosaic GPU "
                    "ragged_dot has no weight-gradient (ragged-contracting) kernel for SM 10.0, "
                    "so the backward pass of gpu-b200 cannot be built; use kernel: te or xla, "
                    "or target gpu-h100 or gpu-h200",
                )
            ],
        ),
        (
            {**TOKAMAX, "hardware": "tpu-v5e", "topology": "2x4"},
            [
                (
                    20,
                    11,
                    "target.kernel",
                    "kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) runs on NVIDIA "
                    "Hopper targets only (gpu-h100 or gpu-h200), not tpu-v5e; use kernel: "
                    "pallas or xla",
                )
            ],
        ),
    ],
    "tokamax_multiplies_bfloat16": [
        ({**TOKAMAX}, []),
        (
            {**TOKAMAX, "compute": "float32"},
            [
                (
                    25,
                    12,
                    "dtypes.compute",
                    "kernel tokamax multiplies bfloat16 operands only (its Mosaic GPU kernels "
                    "are bf16 x bf16 with float32 accumulation), not float32; set compute: "
                    "bfloat16, or use kernel: xla or te",
                )
            ],
        ),
    ],
    "tokamax_widths_fit": [
        ({**TOKAMAX}, []),
        (
            {**TOKAMAX, "ffn": 200},
            [
                (
                    5,
                    12,
                    "layer.ffn_dim",
                    "ffn_dim = 200 is not a multiple of 128, as kernel tokamax's tiles need; "
                    "nearest: 128 or 256",
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
