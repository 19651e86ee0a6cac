"""The spec schema: what a user may write in a moegen YAML file (version 1).

Field-level constraints live here (types, enums, positive sizes); rules that relate
several fields live in `moegen.validate`, each as a named function.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_serializer, field_validator, model_validator

from moegen.hardware import CATALOGUE
from moegen.spec_glu import GLU_PRESETS, Glu
from moegen.spec_parallelism import Parallelism, Replica
from moegen.spec_placement import (
    INT32_MAX,
    NON_BATCH_AXES,
    AxisName,
    Dtype,
    Dtypes,
    Mesh,
    Shapes,
    ShapeVariant,
    Size,
    _Section,
)
from moegen.spec_router import Capacity, GroupLimit, Router

__all__ = [
    "GATED_ACTIVATIONS", "INT32_MAX", "NON_BATCH_AXES", "AxisName", "Capacity", "Dtype",
    "Dtypes", "Glu", "GroupLimit", "Layer", "Memory", "Mesh", "Parallelism", "Replica", "Router",
    "ShapeVariant", "Shapes", "Size", "Spec", "Target", "Tiles",
]  # fmt: skip

GATED_ACTIVATIONS = ("swiglu", "geglu")  # a gate projection beside up

# An RMSNorm's epsilon: x / sqrt(mean(x^2) + eps)
NormEpsilon = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class Layer(_Section):
    """The MoE layer itself."""

    num_experts: Size = Field(description="Number of routed experts.")
    embed_dim: Size = Field(description="Model (embedding) width D.")
    ffn_dim: Size = Field(description="Hidden width F of each expert's FFN.")
    activation: Literal["swiglu", "geglu", "gelu", "relu", "relu2"] = Field(
        "swiglu",
        description="Expert FFN. Gated: swiglu = down(silu(x @ gate) * (x @ up)), "
        "geglu = down(gelu(x @ gate) * (x @ up)); plain: gelu = down(gelu(x @ up)), "
        "relu = down(relu(x @ up)), relu2 = down(relu(x @ up)^2) (Nemotron-H). gelu is the "
        "exact (erf) form.",
    )
    gelu_approximation: Literal["none", "tanh"] = Field(
        "none",
        description="gelu and geglu: none = the exact (erf) GELU; tanh = its tanh "
        "approximation (Gemma's gelu_pytorch_tanh).",
    )
    glu: Glu | Literal["gpt_oss"] | None = Field(
        None,
        description="Gated activations only: clamps, sigmoid scale and up offset of the "
        "activation, for the routed and the shared experts (clamps after the biases). "
        "gpt_oss: gate_limit 7, up_limit 7, sigmoid_scale 1.702, up_offset 1. Omit: plain.",
    )
    shared_glu: Glu | Literal["gpt_oss", "plain"] | None = Field(
        None,
        description="The shared expert's gated-activation parameters where they differ from "
        "the routed experts' (glu): plain = none (HY-V4 clamps its routed experts only), or "
        "its own (Step 3.7 clamps its shared expert at 16, its routed ones at 7). Omit: the "
        "same as glu.",
    )
    ffn_bias: bool = Field(
        False, description="Add a per-expert bias after each projection of the routed experts."
    )
    latent_dim: Size | None = Field(
        None,
        description="The routed experts run in this latent width L instead of embed_dim: "
        "each token is projected down (latent_in [embed_dim, L]) before it is routed, and "
        "its experts' combined output back up (latent_out [L, embed_dim]); the router and "
        "the shared expert see the full width (Nemotron-H's moe_latent_size). Omit: the "
        "experts run on the tokens as they are.",
    )
    latent_bias: bool = Field(
        False,
        description="latent_dim only: add a bias after each latent projection (Nemotron-H "
        "with mlp_bias).",
    )
    shared_ffn_dim: Size | None = Field(
        None,
        description="Hidden width of the always-on shared expert beside the routed ones "
        "(same activation, no bias; n shared experts of width F are one of width n*F). "
        "Omit for none.",
    )
    expert_input_norm_eps: NormEpsilon | None = Field(
        None,
        description="The experts (routed and shared) run on rms_norm(x) * "
        "expert_input_norm, a learned [embed_dim] weight (ones at init), with this epsilon, "
        "while the router sees x (Gemma 4's pre_feedforward_layernorm_2). Omit: x.",
    )
    shared_ffn_bias: bool = Field(
        False,
        description="Add a bias after each projection of the shared expert (ERNIE 4.5 with "
        "use_bias).",
    )
    shared_expert_gate: bool = Field(
        False,
        description="Scale the shared expert's output per token by sigmoid(x @ "
        "shared_expert_gate), a learned [embed_dim] vector (Qwen1.5/Qwen2-MoE, Qwen3-Next).",
    )
    shared_experts: Size = Field(
        1,
        description="router.weighs_shared_experts only: shared_ffn_dim is this many shared "
        "experts of equal width, each weighed by the router on its own (Inkling: "
        "n_shared_experts).",
    )
    output_norm_eps: NormEpsilon | None = Field(
        None,
        description="The layer's output (routed and shared experts summed) becomes "
        "rms_norm(y) * output_norm, a learned [embed_dim] weight (ones at init), with this "
        "epsilon, computed in float32 (A.X-K1's post_mlp_layernorm). Omit: y.",
    )
    expert_output_norm_eps: NormEpsilon | None = Field(
        None,
        description="Each routed expert's output (after its down projection and bias) "
        "becomes rms_norm(out) * expert_output_norm[expert], a learned [num_experts, "
        "embed_dim] weight (latent_dim wide with a latent width; ones at init), with "
        "this epsilon, in float32 and then the compute dtype, before its combine weight "
        "(Ergo's ErgoExpertNorm). Omit: out.",
    )
    shared_output_norm_eps: NormEpsilon | None = Field(
        None,
        description="shared_ffn_dim only: the shared expert's output (after its down "
        "projection and bias, before shared_expert_gate's scale) becomes rms_norm(s) * "
        "shared_output_norm, a learned [embed_dim] weight (ones at init), with this "
        "epsilon, in float32 (Ergo's shared expert norm). Omit: s.",
    )

    @property
    def routed_dim(self) -> int:
        """The width the routed experts see: latent_dim, else embed_dim."""
        return self.latent_dim or self.embed_dim

    @property
    def routed_field(self) -> str:
        """The field that sets routed_dim: "latent_dim", else "embed_dim"."""
        return "latent_dim" if self.latent_dim else "embed_dim"

    @property
    def glu_params(self) -> Glu | None:
        """The activation parameters with a preset resolved (None: the plain activation)."""
        return GLU_PRESETS[self.glu] if isinstance(self.glu, str) else self.glu

    @property
    def shared_glu_params(self) -> Glu | None:
        """The shared expert's activation parameters, resolved (None: plain)."""
        if self.shared_glu is None:
            return self.glu_params
        if self.shared_glu == "plain":
            return None
        return GLU_PRESETS[self.shared_glu] if isinstance(self.shared_glu, str) else self.shared_glu


Tile = Annotated[list[Size], Field(min_length=3, max_length=3)]


class Tiles(_Section):
    """Pinned megablox tiles [rows, contraction, output] per projection (else moegen picks)."""

    gate_up: Tile | None = Field(None, description="Tiles of the gate and up projections.")
    down: Tile | None = Field(None, description="Tiles of the down projection.")

    @field_validator("gate_up", "down", mode="after")
    @classmethod
    def _freeze(cls, tile: list[int] | None) -> tuple[int, ...] | None:
        return None if tile is None else tuple(tile)

    @field_serializer("gate_up", "down")
    def _serialize(self, tile: tuple[int, ...] | None) -> list[int] | None:
        return None if tile is None else list(tile)


def _default_by_hardware(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # the default depends on target.hardware (Target._kernel)


class Target(_Section):
    """Hardware the module is compiled for and the grouped-matmul kernel it uses."""

    @model_validator(mode="before")
    @classmethod
    def _kernel(cls, data: Any) -> Any:
        # Measured on one v5e chip (bench/TPU_CHECK.md): megablox ran Mixtral 8x7B 1.75x and
        # Qwen3-30B-A3B 1.18x faster than XLA's ragged_dot, so a TPU target defaults to it.
        if isinstance(data, dict) and "kernel" not in data:
            name = data.get("hardware", "cpu")
            # a name not in the table: the hardware field refuses it, located
            chip = CATALOGUE.get(name) if isinstance(name, str) else None
            tpu = chip is not None and chip.platform == "tpu"
            return {**data, "kernel": "pallas" if tpu else "xla"}
        return data

    @field_validator("topology", mode="after")
    @classmethod
    def _topology_text(cls, topology: str | int | None) -> str | None:
        # `topology: 8` (a GPU count) reads as an integer; every rule compares text
        return None if topology is None else str(topology)

    hardware: Literal[
        "cpu",
        "tpu-v5e",
        "tpu-v5p",
        "tpu-v6e",
        "tpu7x",
        "gpu-a100",
        "gpu-h100",
        "gpu-h200",
        "gpu-b200",
    ] = Field("cpu", description="Compile target.")
    topology: Annotated[str, Field(max_length=32)] | Annotated[int, Field(gt=0, le=4096)] | None = (
        Field(
            None,
            description="TPU slice shape, e.g. 2x4 (v5e, v6e) or 2x2x1 (v5p); GPUs: their count, "
            "e.g. 8 (one NVLink node) or 4x8 (4 nodes of 8).",
        )
    )
    slices: Annotated[int, Field(gt=0, le=64)] = Field(
        1,
        description="TPU slices of this topology joined by the data-center network "
        "(multi-slice); mesh.dcn_axes says which axes cross them.",
    )
    # Which kernels exist is the kernels stage's knowledge (moegen.kernels.registry, after
    # this schema): it refuses a name it does not hold, located, and `moegen schema` writes
    # its names and summaries into the JSON schema.
    kernel: Annotated[str, Field(min_length=1, max_length=32)] = Field(
        "xla",
        description="The grouped-matmul kernel that runs the experts, by its registered name "
        "(omit: pallas on a TPU target, the kernel measured fastest there; xla elsewhere).",
        json_schema_extra=_default_by_hardware,
    )
    quantization: Literal["none", "fp8", "mxfp8"] = Field(
        "none",
        description="Expert matmuls in fp8 (current scaling, Hopper or newer) or mxfp8 (block "
        "scaling, Blackwell), on a kernel that quantizes (Transformer Engine's); none = the "
        "compute dtype.",
    )
    tiles: Tiles | Literal["auto"] | None = Field(
        None,
        description="Pin a tiled kernel's tiles (megablox's; omit: moegen picks them; auto: "
        "`moegen tune` compiles candidates and writes the best here).",
    )


class Memory(_Section):
    """Memory traded for recomputation (omit a field: the plan decides)."""

    ffn_chunks: Size | Literal["auto"] | None = Field(
        None,
        description="Run the expert FFN in this many slices of its width, one at a time, each "
        "recomputed in the backward pass with its weights gathered again: the FFN's "
        "activations and gathered weights shrink to one slice, for about a third more expert "
        "FLOPs. With token_chunks, each chunk runs the FFN slice by slice. 1 = no slicing. "
        "Omit: 1, unless the layer would not fit the target's memory: then the fewest slices "
        "that leave the ledger's headroom (30% of HBM) free, unless token chunks that leave it "
        "free are faster by the plan's step time (with token chunks: 1). "
        "auto: chosen by `moegen tune`, by XLA's own memory figure of each candidate.",
    )
    token_chunks: Size | Literal["auto"] | None = Field(
        None,
        description="Run the routed experts on this many chunks of each device's tokens, one "
        "after another: the exchange, the expert FFN and the combine of one chunk at a time, "
        "each chunk's buffers certified for the chunk alone and recomputed in the backward "
        "pass up to the experts' outputs, which are kept. Buffers shrink to one chunk's, for "
        "the gate and up matmuls run twice. Drops what the whole layer drops: nothing when "
        "dropless, the same copies with a router capacity. 1 = one chunk. "
        "auto: chosen by `moegen tune` (with only memory choices left to it, by XLA's own "
        "memory figure of each candidate). Omit: the plan chooses, per shape: 1 when the layer "
        "fits the target's memory with its FFN whole (or the slices the spec pins); else, of "
        "the plan's FFN slices and each chunk count, those that leave the ledger's headroom "
        "(30% of HBM) free, the fastest by the plan's step time; else the one planned lowest "
        "that fits.",
    )
    weight_casts: Literal["once", "per_slice"] = Field(
        "once",
        description="How FFN slices cast float32 expert weights to bfloat16. once: XLA casts "
        "the stored weights once, before the slices' loop (it moves each slice's cast there), "
        "and a bfloat16 copy of every expert weight stays live. per_slice: each slice's "
        "weights are rounded as the slice uses them (the same bits, in integer arithmetic "
        "that XLA does not move), so only one slice's copy is live. Needs ffn_chunks > 1, "
        "dtypes.params float32 and dtypes.compute bfloat16.",
    )
    fit_check: Literal["assigned", "plan", "compile"] = Field(
        "assigned",
        description="What refuses a layer too big for the target's HBM, and what chooses the "
        "memory trades the spec leaves out. plan: refused before "
        "any twin or compile when the plan puts it more than 10% over HBM (under a second); "
        "the plan's ledger chooses the trades. "
        "assigned: the same, but on a TPU target a refusal the plan does not prove stands "
        "only where XLA's buffer assignment of the full-size programs (read in seconds, no "
        "code generated) agrees, and a layer the plan puts over HBM by less than 10% is "
        "refused where XLA finds it out of HBM; a layer XLA fits goes on to the build. Where "
        "the spec leaves ffn_chunks or token_chunks out and the layer does not fit whole by "
        "the ledger, the trades are ranked by the plan's step time and read by XLA's buffer "
        "assignment in that order: the first that fits is built (needs libtpu). "
        "compile: the ledger chooses the trades; refused "
        "before compiling only where that is proved (the parameters and their gradients alone "
        "over HBM, or the plan more than 200% over it: three times HBM, where its estimate has "
        "been measured up to 124% above the compiler's on generated TPU layers); nearer HBM, "
        "the full-size compile's memory verdict decides.",
    )


# Choices people reach for that moegen refuses on purpose: (field, value) -> why.
UNSUPPORTED_CHOICES = {
    (("router", "score"), "sparsemixer"): "Phi-3.5-MoE's sparsemixer is not supported: its "
    "deterministic form weighs each chosen expert by a softmax over the logits within 2 * "
    "jitter_eps of the best, usually the best alone, so the weight is 1.0 and the router "
    "learns nothing; the model trains with Gumbel sampling and a Heun-method gradient "
    "estimator that a static layer does not reproduce; its closest trainable router is "
    "softmax with top_k: 2",
}

AUTO_FIELDS = (
    ("parallelism", "experts"),
    ("parallelism", "overlap_chunks"),
    ("target", "tiles"),
    ("memory", "token_chunks"),
    ("memory", "ffn_chunks"),
)


class Spec(_Section):
    """One MoE layer, fully static."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        title="moegen spec",
        json_schema_extra={"$schema": "https://json-schema.org/draft/2020-12/schema"},
    )

    version: Literal[1] = Field(description="Spec format version.")
    description: str = Field("", max_length=500, description="Free text, kept as a constant.")
    layer: Layer
    router: Router
    shapes: Shapes
    dtypes: Dtypes = Dtypes()
    mesh: Mesh
    parallelism: Parallelism = Parallelism()
    target: Target = Target()
    memory: Memory = Memory()

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_integer_one(cls, version: Any) -> Any:
        # Literal[1] alone would take true and 1.0 (both == 1).
        if type(version) is not int or version != 1:
            raise ValueError("must be 1, the only spec version so far")
        return version

    def auto_fields(self) -> list[tuple[str, str]]:
        """The fields left to `moegen tune` (written `auto`)."""
        return [path for path in AUTO_FIELDS if getattr(getattr(self, path[0]), path[1]) == "auto"]

    @property
    def batch_axes(self) -> tuple[str, ...]:
        if self.mesh.batch_axes is None:
            return tuple(a for a in self.mesh.axes if a not in NON_BATCH_AXES)
        return tuple(self.mesh.batch_axes)

    @property
    def tensor_shards(self) -> int:
        """Ways the experts' FFN width is split (the tensor axis; 1 without one)."""
        return self.mesh.axes.get("tensor", 1)

    @property
    def sequence_shards(self) -> int:
        """Ways each sequence's tokens are split (the sequence axis; 1 without one)."""
        return self.mesh.axes.get("sequence", 1)
