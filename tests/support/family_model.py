"""What an entry of the tests' family cases (tests/support/families.py) is: one case of a model family
of moegen's family table (moegen.families, which says its transformers classes and the config
keys of its sizes), its routing as spec choices, and each test harness's tiny sizes of it,
which make both the config's arguments and the spec's choices (so a size is written once for
both)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from moegen.families import FAMILIES, Family, Transformers


class Keys(NamedTuple):
    """The config's names of the sizes; a dotted name is a key inside a dict argument."""

    experts: str
    top_k: str
    ffn: str
    hidden: str = "hidden_size"


@dataclass(frozen=True)
class Tiny:
    """One harness's tiny model of a family."""

    experts: int
    top_k: int
    shared: int | None = None  # the shared expert's width (spec shared_ffn)
    scaling: float | None = None  # routed_scaling_factor = routed_scaling
    groups: tuple[int, int] | None = None  # (n_group, topk_group) = group_limit
    config: dict[str, Any] = field(default_factory=dict)  # the config's other arguments
    spec: dict[str, Any] = field(default_factory=dict)  # more spec choices of this model
    block_args: tuple[Any, ...] = ()  # oracle: the block's arguments after the config

    def config_kwargs(self, keys: Keys, embed: int, ffn: int) -> dict[str, Any]:
        """The config class's keyword arguments of these sizes."""
        kwargs: dict[str, Any] = {}
        sizes = {keys.hidden: embed, keys.ffn: ffn, keys.experts: self.experts}
        for key, value in (sizes | {keys.top_k: self.top_k}).items():
            outer, _, inner = key.partition(".")
            if inner:
                kwargs.setdefault(outer, {})[inner] = value
            else:
                kwargs[key] = value
        if self.scaling is not None:
            kwargs["routed_scaling_factor"] = self.scaling
        if self.groups is not None:
            kwargs["n_group"], kwargs["topk_group"] = self.groups
        return _merged(kwargs, self.config)

    def spec_choices(self, routing: dict[str, Any], embed: int, ffn: int) -> dict[str, Any]:
        """The spec choices of a moegen layer of these sizes with the family's routing."""
        choices = routing | {"experts": self.experts, "embed": embed, "ffn": ffn}
        choices["top_k"] = self.top_k
        if self.shared is not None:
            choices["shared_ffn"] = self.shared
        if self.scaling is not None:
            choices["routed_scaling"] = self.scaling
        if self.groups is not None:  # routing may say how groups are ranked (top_per_group)
            groups = dict(zip(("groups", "keep"), self.groups, strict=True))
            choices["group_limit"] = groups | routing.get("group_limit", {})
        return choices | self.spec


def _merged(kwargs: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """kwargs updated with more, dict arguments (dbrx's ffn_config) merged one level down."""
    out = dict(kwargs)
    for key, value in more.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = out[key] | value if both else value
    return out


@dataclass(frozen=True)
class ModelFamily:
    name: str
    routing: dict[str, Any]  # spec choices of the family's routing and FFN
    oracle: Tiny
    checkpoint: Tiny | None = None  # None: the oracle alone checks this family
    checkpoint_block: str = "model.layers.1.mlp"  # the path from the model to layer 1's block
    fused_differs: bool = True  # the in-memory (state_dict) names differ from save_pretrained's
    # where transformers keeps router and experts in the decoder layer (`block` names it):
    # the block the oracle composes from it (tests/support/oracle/composed.py)
    oracle_block: str | None = None
    # --from-hf: this block's config.json is the same file as that family's (one config, two
    # blocks: a modality's sparse block inside a model's), whose spec it must give
    config_of: str | None = None
    # the family table's entry this case is of (its config class's model_type); None: `name`
    model_type: str | None = None
    # a case of another MoE block than the entry's (a modality's, an encoder's)
    other_block: str | None = None
    # the config's names of the sizes where the case sets others than the entry's first keys
    config_keys: Keys | None = None
    # the classes of a family the table does not hold (one `moegen init --from-hf` refuses)
    classes: Transformers | None = None

    @property
    def family(self) -> Family:
        """The family table's entry."""
        return FAMILIES[self.model_type or self.name]

    @property
    def transformers(self) -> Transformers:
        return self.classes or self.family.transformers

    @property
    def folder(self) -> str:
        """transformers/models/<folder>/ (modeling_<folder>.py, configuration_...)."""
        return self.transformers.folder

    @property
    def config(self) -> str:
        """The config class."""
        return self.transformers.config

    @property
    def block(self) -> str:
        """The MoE block class (the oracle runs it)."""
        return self.other_block or self.transformers.block

    @property
    def model(self) -> str | None:
        """The causal LM class (the checkpoint tests save one)."""
        return self.transformers.model

    @property
    def keys(self) -> Keys:
        """The config's names of the sizes: the entry's first key of each."""
        if self.config_keys is not None:
            return self.config_keys
        sizes = self.family.sizes
        return Keys(sizes.experts[0], sizes.top_k[0], sizes.ffn[0], sizes.embed[0])
