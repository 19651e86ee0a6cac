"""The spec's parallelism section: the expert-parallel strategy, its overlap, and redundant
expert slots with their placement. `moegen.spec` builds the whole schema from it (and
re-exports it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_serializer, field_validator

from moegen.spec_placement import INT32_MAX, Size, _Section

# A placement names a file beside the spec: a plain file name, never a path.
PLACEMENT_FILE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.json$"
MAX_REDUNDANT_EXPERTS = 4096
SHARE_UNITS = 1024  # a replica's share of its expert's copies is planned in 1024ths


class Replica(_Section):
    """One redundant expert slot: the expert it holds and its share of that expert's copies."""

    expert: Annotated[int, Field(ge=0, le=INT32_MAX)] = Field(
        description="The expert whose replica the slot holds (0-based)."
    )
    share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = Field(
        description="The share of the expert's token copies this replica takes (each device "
        "splits its own copies of the expert by their rank; the expert's home slot keeps "
        "what its replicas leave, rounded to 1024ths)."
    )


Placement = list[list[Replica]]
PlacementFile = Annotated[str, Field(pattern=PLACEMENT_FILE_PATTERN)]


def _placement_kind(value: Any) -> str:
    """Which form a placement is written in: a file name, or the slots inline (a user sees
    the errors of that form only)."""
    return "placement-file" if isinstance(value, str) else "placement-inline"


PlacementField = Annotated[
    Annotated[Placement, Tag("placement-inline")] | Annotated[PlacementFile, Tag("placement-file")],
    Discriminator(_placement_kind),
]


class Parallelism(_Section):
    """How experts are spread over devices and how communication overlaps compute."""

    # Which strategies exist is the strategies stage's knowledge (moegen.strategies.registry,
    # after this schema): it refuses a name it does not hold, located, and `moegen schema`
    # writes its names and summaries into the JSON schema.
    experts: Annotated[str, Field(min_length=1, max_length=32)] = Field(
        "replicated",
        description="How the experts are spread over the devices: an expert-parallel "
        "strategy, by its registered name, or auto: chosen by `moegen tune`.",
    )
    overlap_chunks: Size | Literal["auto"] = Field(
        1,
        description="A strategy that overlaps its transfers (the ring of experts): split the "
        "embedding into this many chunks and overlap "
        "each chunk's token transfer with the previous chunk's grouped matmul (1 = no overlap). "
        "auto: chosen by `moegen tune`.",
    )
    redundant_experts: Annotated[int, Field(ge=0, le=MAX_REDUNDANT_EXPERTS)] = Field(
        0,
        description="Redundant expert slots (ragged_all_to_all): R more slots, R / expert on "
        "every device of the expert axis, each holding a replica of a hot expert so that its "
        "copies split over several devices. The replicas are gathered from the model's "
        "experts in the layer (parameters, checkpoints and gradients keep num_experts "
        "experts). Needs a placement. 0: none.",
    )
    placement: PlacementField | None = Field(
        None,
        description="redundant_experts only: per device of the expert axis, its extra slots "
        "as [{expert, share}, ...], or the name of a JSON file beside the spec holding them "
        "(written by `moegen rebalance --out`; its bytes are hashed with the spec's).",
    )

    # Deeply immutable once validated, like every section.
    @field_validator("placement", mode="after")
    @classmethod
    def _freeze_placement(
        cls, placement: Placement | str | None
    ) -> tuple[tuple[Replica, ...], ...] | str | None:
        if placement is None or isinstance(placement, str):
            return placement
        return tuple(tuple(device) for device in placement)

    @field_serializer("placement")
    def _serialize_placement(self, placement: tuple | str | None) -> list | str | None:
        if placement is None or isinstance(placement, str):
            return placement
        return [[replica.model_dump() for replica in device] for device in placement]

    @property
    def replica_slots(self) -> tuple[tuple[Replica, ...], ...]:
        """The placement written inline or read from its file (load resolves files)."""
        placement = self.placement
        return () if placement is None or isinstance(placement, str) else placement
