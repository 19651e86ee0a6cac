"""The kinds of entry in the family table (moegen/families/table.py): each reads some config.json
keys of one decoder layer and gives spec choices, each with the key it came from.

A value may be a per-layer list (Hunyuan's moe_topk): `at_layer` takes the layer's element.
A key the table gives no default for must be in the file. A value the model family's
transformers block would not run as the spec does is refused (HfConfigError), naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moegen.families.config_file import MISSING, ConfigView, short


@dataclass(frozen=True)
class Choice:
    """One spec field (dotted: "router.top_k") and the comment that says where it came from."""

    field: str
    value: Any
    source: str


def at_layer(view: ConfigView, key: str, layer: int) -> Any:
    """The key's value for `layer`: a list holds one value per decoder layer."""
    value = view.raw(key)
    if type(value) is list:
        if layer >= len(value):
            raise view.fail(key, f"a per-layer list of {len(value)}, no value for layer {layer}")
        return value[layer]
    return value


def lookup(view: ConfigView, keys: tuple[str, ...], layer: int, default: Any) -> tuple[Any, str]:
    """(value, the key it came from) of the first present key, else (default, "default");
    a per_layer_config entry for the layer comes first, as transformers applies it last."""
    for key in keys:
        override = view.layer_override(key, layer)
        if override is not MISSING:
            return override, f"{view.prefix}per_layer_config[{layer}].{key}"
    key = view.first_key(keys)
    if key is not None:
        return at_layer(view, key, layer), view.prefix + key
    if default is MISSING:
        raise view.fail(" or ".join(keys), "missing, and the family has no default for it")
    return default, f"{keys[0]} (absent: the config class's default)"


def _read(view: ConfigView, key: str, value: Any, kind: str) -> Any:
    reader = {
        "flag": view.flag,
        "number": view.number,
        "size": view.size,
        # a size that may be 0, null meaning 0 (LongCat's zero_expert_num)
        "count": lambda key, value: 0 if value is None else view.size(key, value, zero=True),
        "text": view.text,
    }
    return reader[kind](key, value)


@dataclass(frozen=True)
class Size:
    """A size whose config keys moegen.families.layouts knows (list values per layer)."""

    field: str
    keys: tuple[str, ...]

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, self.keys, layer, MISSING)
        return [Choice(self.field, view.size(source, value), source)]


@dataclass(frozen=True)
class Copy:
    """A field that is the key's value, of `kind` flag, number, size, count (a size or 0)
    or text."""

    field: str
    keys: tuple[str, ...]
    default: Any
    kind: str

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, self.keys, layer, self.default)
        return [Choice(self.field, _read(view, self.keys[0], value, self.kind), source)]


@dataclass(frozen=True)
class SharedCopy(Copy):
    """A Copy of a field of the shared expert alone: none where `width`'s key says the shared
    expert is 0 wide (there is then no shared expert in the spec to give it to)."""

    width: tuple[str, ...] = ()

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        width, _ = lookup(view, self.width, layer, None)
        return [] if width == 0 else super().choices(view, layer)


@dataclass(frozen=True)
class Choose:
    """A field whose value the key's value picks from `table`; another value is refused."""

    field: str
    keys: tuple[str, ...]
    table: Mapping[Any, Any]
    default: Any = MISSING
    why: str = ""  # what the family's block does with a value the table lacks

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, self.keys, layer, self.default)
        if isinstance(value, (list, dict)) or value not in self.table:
            known = ", ".join(repr(v) for v in self.table)
            raise view.fail(
                self.keys[0], f"{short(value)} is not mapped (moegen maps {known}){self.why}"
            )
        return [Choice(self.field, self.table[value], f"{source}: {value}")]


@dataclass(frozen=True)
class Fixed:
    """A field the family's block always sets, whatever the config says."""

    field: str
    value: Any
    why: str

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        return [Choice(self.field, self.value, self.why)]


@dataclass(frozen=True)
class Expect:
    """A key the family's transformers block ignores or cannot run otherwise: refused unless
    absent or one of `allowed` (per-layer lists: every element)."""

    key: str
    allowed: tuple[Any, ...]
    why: str

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        if not view.has(self.key):
            return []
        value = at_layer(view, self.key, layer)
        if isinstance(value, (list, dict)) or value not in self.allowed:
            wanted = " or ".join(repr(v) for v in self.allowed)
            raise view.fail(self.key, f"is {short(value)}, not {wanted}: {self.why}")
        return []


@dataclass(frozen=True)
class SharedWidth:
    """layer.shared_ffn_dim = count x width (count absent from `count`: one shared expert);
    no shared expert when the count is 0 or null."""

    count: tuple[str, ...]
    width: tuple[str, ...]
    count_default: Any = 1

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        count, count_source = (
            (1, "") if not self.count else lookup(view, self.count, layer, self.count_default)
        )
        if count is None or count == 0:
            return []
        count = view.size(self.count[0] if self.count else "", count)
        width, width_source = lookup(view, self.width, layer, MISSING)
        if width == 0:  # Granite-MoE-Shared's shared_intermediate_size 0: no shared MLP
            return []
        width = view.size(width_source, width)
        source = f"{count_source} x {width_source}" if self.count else width_source
        return [Choice("layer.shared_ffn_dim", view.size(source, count * width), source)]


@dataclass(frozen=True)
class Groups:
    """router.group_limit from n_group and topk_group, when there is more than one group.
    `methods` (DeepSeek-V2's topk_method): value -> top_per_group, None for no groups."""

    groups: str
    keep: str
    groups_default: Any
    keep_default: Any
    top_per_group: int = 2  # DeepSeek-V3: the sum of each group's best 2 scores
    method: str | None = None
    methods: Mapping[str, int | None] | None = None
    method_default: str = ""

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        top_per_group, source = self.top_per_group, ""
        if self.method is not None and self.methods is not None:
            name, source = lookup(view, (self.method,), layer, self.method_default)
            if isinstance(name, (list, dict)) or name not in self.methods:
                known = ", ".join(map(repr, self.methods))
                raise view.fail(self.method, f"{short(name)} is not mapped (moegen maps {known})")
            if self.methods[name] is None:
                return []
            top_per_group, source = self.methods[name], f"{source}: {name}; "
        groups, groups_source = lookup(view, (self.groups,), layer, self.groups_default)
        if groups is None or groups == 1:
            return []  # one group: every expert is in it, no limit
        keep, keep_source = lookup(view, (self.keep,), layer, self.keep_default)
        limit = {
            "groups": view.size(self.groups, groups),
            "keep": view.size(self.keep, keep),
            "top_per_group": top_per_group,
        }
        return [Choice("router.group_limit", limit, f"{source}{groups_source}, {keep_source}")]


@dataclass(frozen=True)
class Clamp:
    """`field` (layer.glu, or the shared expert's layer.shared_glu) clamping both projections
    at the key's limit (DeepSeek-V4's swiglu_limit; Step 3.7's per-layer swiglu_limits). A
    value in `off` (absent, null or 0 by default; a null or empty list too) means no clamp:
    `field` is then `unclamped` (shared_glu: "plain") or left out. Any other limit must be
    positive: torch clamps at whatever it is given."""

    key: str
    default: float | None = None  # the config class's, where the key is absent
    field: str = "layer.glu"
    after_activation: bool = False  # Step 3.7: min(act(gate), limit), not act(min(gate, limit))
    unclamped: str | None = None
    off: tuple[Any, ...] = (None, 0)
    why: str = ""  # what the family's block does with a limit that is not positive

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        empty = view.raw(self.key) == []  # Step 3.7: an empty list clamps no layer
        limit = None if empty else lookup(view, (self.key,), layer, self.default)[0]
        if limit in self.off and type(limit) is not bool:
            return [] if self.unclamped is None else [Choice(self.field, self.unclamped, self.key)]
        limit = view.number(self.key, limit)
        if limit <= 0:
            raise view.fail(self.key, f"must be positive, not {limit}{self.why}")
        glu: dict[str, Any] = {"gate_limit": limit, "up_limit": limit}
        if self.after_activation:
            glu["gate_clamp"] = "after_activation"
        return [Choice(self.field, glu, f"{view.prefix}{self.key} (gate and up)")]


def step_clamps(routed_key: str, shared_key: str) -> tuple[Clamp, Clamp]:
    """Step 3.7's clamp after the activation, min(act(gate), L) and up in [-L, L]: the routed
    experts at the limit under `routed_key`, the shared expert at `shared_key`'s (unclamped:
    a plain shared expert). Ling/Ring (transformers 5.25) clamp the same way."""
    return (
        Clamp(routed_key, after_activation=True),
        Clamp(shared_key, field="layer.shared_glu", after_activation=True, unclamped="plain"),
    )


@dataclass(frozen=True)
class Positive:
    """A number field set from the key when its value is above 0; 0 or below (or null)
    leaves the field out, as the family's block skips the step (Laguna's softcap)."""

    field: str
    key: str
    default: float | None = None

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, (self.key,), layer, self.default)
        if value is None or view.number(self.key, value) <= 0:
            return []
        return [Choice(self.field, float(value), source)]


@dataclass(frozen=True)
class Softcaps:
    """Inkling2's soft-capped SwiGLU: cap * tanh(g / cap) * sigmoid(g) * (cap' * tanh(up /
    cap')), the two caps from their keys (the config class's defaults where absent)."""

    gate_key: str
    up_key: str
    defaults: tuple[float, float]

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        caps = []
        for key, default in zip((self.gate_key, self.up_key), self.defaults, strict=True):
            cap = view.number(key, lookup(view, (key,), layer, default)[0])
            if cap <= 0:
                raise view.fail(key, f"must be positive, not {cap}: tanh(x / cap) needs it")
            caps.append(cap)
        glu = {"gate_softcap": caps[0], "up_softcap": caps[1]}
        return [Choice("layer.glu", glu, f"{view.prefix}{self.gate_key}, {self.up_key}")]


@dataclass(frozen=True)
class GptOssGlu:
    """gpt-oss's clamped SwiGLU: the gpt_oss preset when the limit and alpha are its own."""

    limit: str
    alpha: str

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        limit = view.number(self.limit, lookup(view, (self.limit,), layer, 7.0)[0])
        alpha = view.number(self.alpha, lookup(view, (self.alpha,), layer, 1.702)[0])
        if limit <= 0 or alpha <= 0:
            raise view.fail(f"{self.limit} / {self.alpha}", "must be positive")
        source = f"{self.limit}: {limit:g}, {self.alpha}: {alpha:g}"
        if (limit, alpha) == (7.0, 1.702):
            return [Choice("layer.glu", "gpt_oss", source)]
        glu = {"gate_limit": limit, "up_limit": limit, "sigmoid_scale": alpha, "up_offset": 1.0}
        return [Choice("layer.glu", glu, source)]


@dataclass(frozen=True)
class LoadBalance:
    """router.load_balance_loss from the coefficient the causal-LM model trains with; `form`
    "transformers" where that model adds transformers' load_balancing_loss_func (the
    spec's router.load_balance_form then says so; omitted when the loss is 0)."""

    keys: tuple[str, ...]
    default: Any
    form: str | None = "transformers"

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, self.keys, layer, self.default)
        weight = view.number(self.keys[0], value)
        if weight < 0:
            raise view.fail(self.keys[0], f"must not be negative, not {weight}")
        logits, logits_source = lookup(view, ("output_router_logits",), layer, None)
        if self.form is not None and weight > 0 and logits is False:
            # Published configs mostly say false (the inference default) and training turns it
            # on: the loss is kept, and the comment says when transformers adds it.
            source = (
                f"{source}; transformers adds it only with output_router_logits: true "
                f"({logits_source} is false: set 0 to train without it)"
            )
        found = [Choice("router.load_balance_loss", weight, source)]
        if self.form is not None and weight > 0:
            why = "the causal LM adds load_balancing_loss_func (with output_router_logits)"
            found.append(Choice("router.load_balance_form", self.form, why))
        return found


@dataclass(frozen=True)
class Switch:
    """Rules the key's value picks (Cohere2-MoE's expert_selection_fn sets the score, where
    the softmax is taken and whether norm_topk_prob applies); another value is refused."""

    key: str
    cases: Mapping[Any, tuple[Any, ...]]  # value -> rules of this module
    default: Any

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        value, source = lookup(view, (self.key,), layer, self.default)
        if isinstance(value, (list, dict)) or value not in self.cases:
            known = ", ".join(repr(v) for v in self.cases)
            raise view.fail(self.key, f"{short(value)} is not mapped (moegen maps {known})")
        found = [choice for rule in self.cases[value] for choice in rule.choices(view, layer)]
        return [Choice(c.field, c.value, f"{c.source} ({source}: {value})") for c in found]


@dataclass(frozen=True)
class Latent:
    """layer.latent_dim from the width key (null or absent: the experts run on the hidden
    size); with a width, layer.latent_bias from the projections' bias flag."""

    width: tuple[str, ...]
    bias: tuple[str, ...]

    def choices(self, view: ConfigView, layer: int) -> list[Choice]:
        width, source = lookup(view, self.width, layer, None)
        if width is None:
            return []
        out = [Choice("layer.latent_dim", view.size(source, width), source)]
        bias, bias_source = lookup(view, self.bias, layer, False)
        if view.flag(self.bias[0], bias):
            out.append(Choice("layer.latent_bias", True, bias_source))
        return out
