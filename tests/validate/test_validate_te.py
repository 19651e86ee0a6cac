"""Stage 2, `moegen.validate`: kernel te (Transformer Engine) on NVIDIA GPU targets, and its quantization."""

from __future__ import annotations

from validate_cases import (
    H100_8,
    TE_OFF_GPU,
    VALUE,
    Cases,
    rule_tests,
)

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
TOKAMAX = {
    "hardware": "gpu-h100", "topology": 8, "kernel": "tokamax", "axes": {"fsdp": 8},
    "embed": 128, "ffn": 256,
}  # fmt: skip

CASES: Cases = {
    "te_runs_on_nvidia_gpus": [
        ({**H100_8, "kernel": "te"}, []),
        ({"kernel": "te", "hardware": "gpu-a100", "topology": 4, "axes": {"fsdp": 4}}, []),
        ({"hardware": "gpu-h100", "topology": 4, "axes": {"fsdp": 4}}, []),  # xla on a GPU
        (
            {"kernel": "te"},
            [("target.kernel", VALUE, TE_OFF_GPU.format(target="cpu", other="xla"))],
        ),
        (
            {"kernel": "te", "hardware": "tpu-v5e", "topology": "2x2", "axes": {"fsdp": 4}},
            [("target.kernel", VALUE, TE_OFF_GPU.format(target="tpu-v5e", other="pallas or xla"))],
        ),
    ],
    "quantization_needs_te": [
        ({"quantization": "none"}, []),
        ({**H100_8, "kernel": "te", "quantization": "fp8"}, []),
        (
            {"quantization": "fp8", "hardware": "gpu-h100", "topology": 4, "axes": {"fsdp": 4}},
            [
                (
                    "target.quantization",
                    VALUE,
                    (
                        "quantization fp8 needs kernel: te (an NVIDIA GPU target); kernel xla "
                        "computes in dtypes.compute: set quantization: none"
                    ),
                )
            ],
        ),
    ],
    "quantization_fits_the_gpu": [
        ({**H100_8, "kernel": "te", "quantization": "fp8"}, []),
        ({**H100_8, "kernel": "te", "quantization": "mxfp8", "hardware": "gpu-b200"}, []),
        ({**H100_8, "kernel": "te", "quantization": "none", "hardware": "gpu-a100"}, []),
        # MXFP8 on Hopper
        (
            {**H100_8, "kernel": "te", "quantization": "mxfp8"},
            [
                (
                    "target.quantization",
                    VALUE,
                    (
                        "mxfp8 needs Blackwell (SM 10.0) or newer; gpu-h100 is SM 9.0: use "
                        "quantization fp8 or none, or target gpu-b200"
                    ),
                )
            ],
        ),
        # FP8 before Hopper
        (
            {**H100_8, "kernel": "te", "quantization": "fp8", "hardware": "gpu-a100"},
            [
                (
                    "target.quantization",
                    VALUE,
                    (
                        "fp8 needs Hopper (SM 9.0) or newer; gpu-a100 is SM 8.0: use quantization "
                        "none, or target gpu-h100 or gpu-h200 or gpu-b200"
                    ),
                )
            ],
        ),
    ],
    "quantized_widths_fit": [
        ({**H100_8, "kernel": "te", "quantization": "fp8"}, []),  # 64 and 128
        ({**H100_8, "kernel": "te", "quantization": "fp8", "embed": 48}, []),  # 16 x 3
        (
            {
                **H100_8,
                "kernel": "te",
                "quantization": "mxfp8",
                "embed": 48,
                "hardware": "gpu-b200",
            },
            [
                (
                    "layer.embed_dim",
                    VALUE,
                    (
                        "embed_dim = 48 is not a multiple of 32, as mxfp8 GEMMs need; "
                        "nearest: 32 or 64"
                    ),
                )
            ],
        ),
        (
            {**H100_8, "kernel": "te", "quantization": "fp8", "ffn": 136, "embed": 72},
            [
                (
                    "layer.embed_dim",
                    VALUE,
                    "embed_dim = 72 is not a multiple of 16, as fp8 GEMMs need; nearest: 64 or 80",
                ),
                (
                    "layer.ffn_dim",
                    VALUE,
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
                    "target.kernel",
                    VALUE,
                    (
                        "kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) trains on Hopper "
                        "(SM 9.0: gpu-h100 or gpu-h200) only: tokamax 0.0.17's Mosaic GPU "
                        "ragged_dot has no weight-gradient (ragged-contracting) kernel for SM 10.0, "
                        "so the backward pass of gpu-b200 cannot be built; use kernel: te or xla, "
                        "or target gpu-h100 or gpu-h200"
                    ),
                )
            ],
        ),
        (
            {**TOKAMAX, "hardware": "tpu-v5e", "topology": "2x4"},
            [
                (
                    "target.kernel",
                    VALUE,
                    (
                        "kernel tokamax (tokamax's Pallas Mosaic GPU ragged_dot) runs on NVIDIA "
                        "Hopper targets only (gpu-h100 or gpu-h200), not tpu-v5e; use kernel: "
                        "pallas or xla"
                    ),
                )
            ],
        ),
    ],
    "tokamax_multiplies_bfloat16": [
        ({**TOKAMAX}, []),
        (
            {**TOKAMAX, "compute_dtype": "float32"},
            [
                (
                    "dtypes.compute",
                    VALUE,
                    (
                        "kernel tokamax multiplies bfloat16 operands only (its Mosaic GPU kernels "
                        "are bf16 x bf16 with float32 accumulation), not float32; set compute: "
                        "bfloat16, or use kernel: xla or te"
                    ),
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
                    "layer.ffn_dim",
                    VALUE,
                    (
                        "ffn_dim = 200 is not a multiple of 128, as kernel tokamax's tiles need; "
                        "nearest: 128 or 256"
                    ),
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)
