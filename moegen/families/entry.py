"""What one entry of the family table (moegen/families/table.py) is: everything moegen knows of
one config.json model_type, declared once.

- `sizes`: the config keys of the experts, widths and top-k (dotted paths; the first present
  key wins; a list value is per decoder layer);
- `rules`: which config keys give each other spec field, and which values are refused
  (moegen.families.rules), as the family's transformers MoE block runs them;
- `layers`: which decoder layers are MoE layers (moegen.families.layer_rules and layer_types);
- `checkpoint`: where its checkpoints keep one layer's MoE weights, for the families whose
  checkpoints moegen loads (moegen.families.layouts);
- `transformers`: the family's transformers classes (config, MoE block, causal LM);
- `text_config`: a multimodal config, whose text model's keys sit under text_config.

`moegen init --from-hf` reads the sizes, rules and layers; the checkpoint loader
(moegen.checkpoints) the sizes, layers and checkpoint. Adding a model family is one entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from moegen.families.layer_types import LayerRule
from moegen.families.layouts import Layout
from moegen.families.rules import (
    Choose,
    Clamp,
    Copy,
    Expect,
    Fixed,
    GptOssGlu,
    Groups,
    Latent,
    LoadBalance,
    Positive,
    SharedCopy,
    SharedWidth,
    Switch,
)

Rule = (
    Choose
    | Clamp
    | Copy
    | Expect
    | Fixed
    | GptOssGlu
    | Groups
    | Latent
    | LoadBalance
    | Positive
    | SharedCopy
    | SharedWidth
    | Switch
)
SIZE_NAMES = ("experts", "embed", "ffn", "top_k")


@dataclass(frozen=True)
class Sizes:
    """The config.json keys of a family's sizes; for each, the first present key wins."""

    experts: tuple[str, ...]
    embed: tuple[str, ...]
    ffn: tuple[str, ...]
    top_k: tuple[str, ...]

    def keys(self, name: str) -> tuple[str, ...]:
        """The keys of one size, by SIZE_NAMES' name."""
        if name not in SIZE_NAMES:
            raise KeyError(f"{name!r} is not a size ({', '.join(SIZE_NAMES)})")
        keys: tuple[str, ...] = getattr(self, name)
        return keys

    def but(self, **keys: tuple[str, ...]) -> Sizes:
        """These sizes with some sizes' keys replaced."""
        return replace(self, **keys)

    def also(self, **keys: tuple[str, ...]) -> Sizes:
        """These sizes with more keys after some sizes' own (what newer configs write)."""
        return replace(self, **{name: (*self.keys(name), *more) for name, more in keys.items()})


# the key sets most families' configs use
MIXTRAL_SIZES = Sizes(
    ("num_local_experts",), ("hidden_size",), ("intermediate_size",), ("num_experts_per_tok",)
)
DEEPSEEK_SIZES = Sizes(
    ("n_routed_experts",), ("hidden_size",), ("moe_intermediate_size",), ("num_experts_per_tok",)
)
QWEN_SIZES = DEEPSEEK_SIZES.but(experts=("num_experts",))
OLMOE_SIZES = QWEN_SIZES.but(ffn=("intermediate_size",))
GPT_OSS_SIZES = MIXTRAL_SIZES.also(top_k=("experts_per_token",))
ERNIE_SIZES = Sizes(("moe_num_experts",), ("hidden_size",), ("moe_intermediate_size",), ("moe_k",))
HUNYUAN_SIZES = Sizes(("num_experts",), ("hidden_size",), ("intermediate_size",), ("moe_topk",))
DBRX_SIZES = Sizes(
    ("ffn_config.moe_num_experts",),
    ("d_model",),
    ("ffn_config.ffn_hidden_size",),
    ("ffn_config.moe_top_k",),
)

# where a decoder layer's keys start in a checkpoint ({L}: its index)
LAYER_PREFIXES = (
    "model.layers.{L}.",
    "layers.{L}.",
    "model.language_model.layers.{L}.",
    "language_model.model.layers.{L}.",
)


@dataclass(frozen=True)
class CheckpointKeys:
    """Where a family's checkpoints keep one MoE layer's weights."""

    layouts: tuple[Layout, ...]  # told apart by the key of the experts' down projection
    prefixes: tuple[str, ...] = LAYER_PREFIXES
    # keys (relative to the block) that make a layer unloadable, with the reason
    refuse: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Transformers:
    """The family's classes in transformers (transformers/models/<folder>/): the config of its
    text model, the MoE block whose behaviour the entry's rules reproduce, and the causal LM
    that holds it (the test oracle builds each; moegen imports none of them)."""

    folder: str
    config: str
    block: str
    model: str | None  # None: no causal LM holds the block alone
    # where the block and the causal LM are defined, when the family runs another family's
    # modeling code (Sarvam's models run GLM-4.5's); None: `folder`
    modeling: str | None = None

    @property
    def block_folder(self) -> str:
        """transformers/models/<block_folder>/modeling_<block_folder>.py defines the block."""
        return self.modeling or self.folder


@dataclass(frozen=True)
class Family:
    title: str
    sizes: Sizes
    rules: tuple[Rule, ...]
    layers: LayerRule  # which decoder layers build the MoE block
    transformers: Transformers
    checkpoint: CheckpointKeys | None = None  # None: moegen does not load its checkpoints
    text_config: bool = False  # multimodal: the text model's keys are under text_config
    # what the spec alone does not say about where the layer sits (Gemma 4's MoE block runs
    # beside a dense MLP): the written spec's description and header carry it
    note: str = ""
