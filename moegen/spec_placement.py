"""The spec's basic types and the sections that say where the layer runs: its static
shapes (and shape variants), dtypes and device mesh. `moegen.spec` builds the whole schema
from them (and re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

# Sizes above int32 would overflow the index arithmetic of every kernel we target.
INT32_MAX = 2**31 - 1
Size = Annotated[int, Field(gt=0, le=INT32_MAX)]

AxisName = Literal["data", "fsdp", "expert", "tensor", "sequence"]
# Axes that never shard the batch: tensor splits the expert FFN width (every tensor shard sees
# the same tokens), sequence splits each sequence's tokens (dimension 1 of x).
NON_BATCH_AXES = ("tensor", "sequence")
Dtype = Literal["float32", "bfloat16"]


class _Section(BaseModel):
    """Base for all spec sections: immutable, no unknown keys, no type coercion."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ShapeVariant(_Section):
    """Another static input shape for the same parameters (evaluation, prefill...)."""

    batch: Size = Field(description="Global batch size of this shape set.")
    seq_len: Size = Field(description="Sequence length of this shape set.")


class Shapes(_Section):
    """Static global input shape [batch, seq_len, embed_dim]."""

    batch: Size = Field(description="Global batch size.")
    seq_len: Size = Field(description="Sequence length.")
    variants: dict[Annotated[str, Field(max_length=64)], ShapeVariant] | None = Field(
        None,
        description="Other static input shapes for the same parameters, by name (a lowercase "
        "identifier), e.g. {eval: {batch: 32, seq_len: 512}}: each is planned, verified and "
        "compiled; the module adds moe_layer_NAME for each and moe_layer dispatches on "
        "x.shape. init_params and the parameter layout are shared. Omit: one shape.",
    )

    # Deeply immutable once validated: a plan must never see a spec change under it.
    @field_validator("variants", mode="after")
    @classmethod
    def _freeze_variants(
        cls, variants: dict[str, ShapeVariant] | None
    ) -> Mapping[str, ShapeVariant] | None:
        return None if variants is None else MappingProxyType(dict(variants))

    @field_serializer("variants")
    def _serialize_variants(
        self, variants: Mapping[str, ShapeVariant] | None
    ) -> dict[str, ShapeVariant] | None:
        return None if variants is None else dict(variants)


class Dtypes(_Section):
    """Storage and compute precision. Router math is always float32."""

    params: Dtype = Field("float32", description="Dtype parameters are stored in.")
    compute: Dtype = Field("bfloat16", description="Dtype of activations and expert matmuls.")


class Mesh(_Section):
    """Device mesh: axis name -> size, in device order (major to minor)."""

    axes: dict[AxisName, Size] = Field(
        min_length=1,
        description="Mesh axes and sizes; each axis's name is its role. data: pure data "
        "parallel; fsdp: data parallel with parameters sharded along embed_dim and gathered "
        "inside the layer; expert: experts sharded over it (tokens too), with "
        "parallelism.experts saying how tokens travel; tensor: expert tensor parallelism, the "
        "FFN width of the routed and shared experts sharded over it and the partial outputs "
        "summed (tokens are not sharded over it); sequence: tokens sharded along seq_len. No "
        "other axis is listed here; the model's mesh the layer runs in may hold further axes "
        "(pipeline, ...), and the layer runs replicated over them.",
    )
    batch_axes: list[AxisName] | None = Field(
        None,
        description="Axes the batch is sharded over (default: every mesh axis but tensor and "
        "sequence).",
    )
    dcn_axes: dict[AxisName, Size] | None = Field(
        None,
        description="Multi-slice targets: how many ways each axis is split across slices "
        "(over the data-center network, DCN); the rest of the axis is inside a slice (ICI). "
        "The product must equal target.slices, e.g. {data: 2} for data parallelism over 2 "
        "slices.",
    )
    expert_over_dcn: bool = Field(
        False,
        description="Allow the expert axis to cross slices: every token exchange then travels "
        "over the DCN, far slower than ICI.",
    )

    # Deeply immutable once validated: a plan must never see a spec change under it.
    @field_validator("axes", mode="after")
    @classmethod
    def _freeze_axes(cls, axes: dict[str, int]) -> Mapping[str, int]:
        return MappingProxyType(dict(axes))

    @field_validator("dcn_axes", mode="after")
    @classmethod
    def _freeze_dcn_axes(cls, axes: dict[str, int] | None) -> Mapping[str, int] | None:
        return None if axes is None else MappingProxyType(dict(axes))

    @field_serializer("dcn_axes")
    def _serialize_dcn_axes(self, axes: Mapping[str, int] | None) -> dict[str, int] | None:
        return None if axes is None else dict(axes)

    @field_validator("batch_axes", mode="after")
    @classmethod
    def _freeze_batch_axes(cls, axes: list[str] | None) -> tuple[str, ...] | None:
        return None if axes is None else tuple(axes)

    @field_serializer("axes")
    def _serialize_axes(self, axes: Mapping[str, int]) -> dict[str, int]:
        return dict(axes)

    @field_serializer("batch_axes")
    def _serialize_batch_axes(self, axes: tuple[str, ...] | None) -> list[str] | None:
        return None if axes is None else list(axes)
