"""Which checkpoint tensors feed which module parameters, and every reason to refuse.

Everything is decided here, from the checkpoint's names, shapes, dtypes and config.json,
before a single weight is read: a load either has a source of the right shape and a float
dtype for every parameter of the module and leaves nothing of the layer's MoE block unused, or
it stops with a CheckpointError naming the key, the file and what to change.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from moegen.checkpoints.families import FAMILIES, Loadable
from moegen.checkpoints.names import QUANTIZED_SUFFIXES, SPEC_FIELD
from moegen.checkpoints.reader import FLOAT_DTYPES, Checkpoint, CheckpointError
from moegen.families import Layout, Source, full_key

MAX_LISTED = 8  # keys listed in a message before "..."
REQUIRED = ("router", "w_gate", "w_up", "w_down")  # every family's checkpoint has these


@dataclass(frozen=True)
class Target:
    """What a generated module needs: its parameters, their shapes, sizes and dtype."""

    shapes: Mapping[str, tuple[int, ...]]
    specs: Mapping[str, Any]
    sizes: Mapping[str, int]  # e, d, f and (with a shared expert) s
    dtype: np.dtype
    constants: Mapping[str, int]  # NUM_EXPERTS, EMBED_DIM, FFN_DIM, TOP_K


@dataclass(frozen=True)
class Match:
    """The layout found for one layer and the full key prefix of its MoE block."""

    family: Loadable
    layout: Layout
    block: str  # e.g. "model.layers.3.block_sparse_moe."
    sources: Mapping[str, Source]  # each module parameter's source


def covered() -> str:
    return ", ".join(f"{f.name} ({f.title})" for f in FAMILIES.values())


def family_named(name: Any, config: Mapping[str, Any] | None, config_path: Any) -> Loadable:
    """The family `name` says, or (None) the one config.json's model_type says."""
    if name is None:
        model_type = config.get("model_type") if config is not None else None
        if not isinstance(model_type, str):
            raise CheckpointError(
                f"no family given and no model_type in {config_path or 'config.json (absent)'}: "
                f"pass family=... (covered: {covered()})"
            )
        found = _by_model_type(model_type)
        if found is None:
            raise CheckpointError(
                f"{config_path}: model_type {model_type[:80]!r} is not a covered family "
                f"(covered: {covered()})"
            )
        return found
    if not isinstance(name, str):
        raise CheckpointError(f"family must be a name (str), got {type(name).__name__}")
    found = FAMILIES.get(name.strip().lower().replace("-", "_")) or _by_model_type(name)
    if found is None:
        raise CheckpointError(f"family {name[:80]!r} is not covered; covered: {covered()}")
    return found


def _by_model_type(model_type: str) -> Loadable | None:
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    return None


# -- config.json -------------------------------------------------------------------------

_SIZES = (
    ("experts", "NUM_EXPERTS", "layer.num_experts"),
    ("embed", "EMBED_DIM", "layer.embed_dim"),
    ("ffn", "FFN_DIM", "layer.ffn_dim"),
    ("top_k", "TOP_K", "router.top_k"),
)


def check_config(family: Loadable, ckpt: Checkpoint, target: Target, layer: int) -> None:
    """config.json (when there is one) agrees with the module's sizes and top-k."""
    config, path = ckpt.config, ckpt.config_path
    if config is None:
        return
    check_model_type(family, config, path)
    for field, constant, spec_key in _SIZES:
        found = _config_value(config, family.size_keys(field), layer, path)
        if found is None:
            continue
        key, value = found
        if value != target.constants[constant]:
            raise CheckpointError(
                f"{path}: {key} is {value} but the module has {constant} = "
                f"{target.constants[constant]}; a module for this checkpoint needs "
                f"{spec_key}: {value} in its spec"
            )


def check_model_type(family: Loadable, config: Mapping[str, Any], path: Any) -> None:
    """config.json's model_type, when it has one, is one of `family`'s."""
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type not in family.model_types:
        other = _by_model_type(model_type)
        fix = f"pass family={other.name!r}" if other else f"covered families: {covered()}"
        raise CheckpointError(
            f"{path}: model_type is {model_type[:80]!r}, not {family.title}'s "
            f"({', '.join(family.model_types)}); {fix}"
        )


def _config_value(
    config: Mapping[str, Any], keys: Sequence[str], layer: int, path: Any
) -> tuple[str, int] | None:
    for scope, prefix in ((config, ""), (config.get("text_config"), "text_config.")):
        if not isinstance(scope, Mapping):
            continue
        for key in keys:
            value: Any = scope
            for part in key.split("."):
                value = value.get(part) if isinstance(value, Mapping) else None
            if value is None:
                continue
            name = prefix + key
            if isinstance(value, list):  # per layer (Hunyuan)
                if layer >= len(value):
                    raise CheckpointError(
                        f"{path}: {name} lists {len(value)} layers; there is no layer {layer}"
                    )
                value, name = value[layer], f"{name}[{layer}]"
            if type(value) is not int:
                raise CheckpointError(f"{path}: {name} must be an integer, got {value!r:.80}")
            return name, value
    return None


# -- the layer's MoE block ---------------------------------------------------------------


def _pattern(source: Source) -> re.Pattern[str]:
    return re.compile(re.escape(source.key).replace(re.escape("{i}"), r"(0|[1-9][0-9]*)"))


def _listed(keys: Sequence[str]) -> str:
    shown = ", ".join(keys[:MAX_LISTED])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > MAX_LISTED else "")


def find_block(family: Loadable, ckpt: Checkpoint, layer: int) -> tuple[Layout, str]:
    """The layout and full block prefix of `layer`'s MoE weights."""
    found = []
    for layer_prefix in family.layers:
        prefix = layer_prefix.format(L=layer)
        for layout in family.layouts:
            block = f"{prefix}{layout.block}."
            if block + layout.params["w_down"].key_of(0) in ckpt.files:
                found.append((layout, block))
    if len(found) > 1:
        raise CheckpointError(
            f"{ckpt.description}: layer {layer} holds MoE weights in more than one layout ("
            + ", ".join(f"{layout.name} under {block}" for layout, block in found)
            + "); keep one: the checkpoint is a mix of two saves"
        )
    if found:
        return found[0]
    for layer_prefix in family.layers:
        for layout in family.layouts:
            block = f"{layer_prefix.format(L=layer)}{layout.block}."
            under = [key for key in ckpt.files if key.startswith(block)]
            _refuse_quantized(ckpt, under, f"{ckpt.description}, layer {layer} (under {block})")
    markers = [(layout, layout.params["w_down"].key_of(0)) for layout in family.layouts]
    moe_layers = moe_layers_in(family, ckpt)
    layer_keys = sorted(
        k for k in ckpt.files for p in family.layers if k.startswith(p.format(L=layer))
    )
    expected = " or ".join(
        f"{family.layers[0].format(L=layer)}{layout.block}.{marker}" for layout, marker in markers
    )
    if moe_layers:
        where = f"its {family.title} MoE layers are {ranges(moe_layers)}"
    else:
        where = (
            f"it has no {family.title} MoE layer at all (is it another family? covered: "
            f"{covered()})"
        )
    seen = f"; layer {layer} has: {_listed(layer_keys)}" if layer_keys else ""
    raise CheckpointError(
        f"{ckpt.description}: no {family.title} MoE weights for layer {layer} (looked for "
        f"{expected}); {where}{seen}"
    )


def moe_layers_in(family: Loadable, ckpt: Checkpoint) -> list[int]:
    """The layers whose first expert's down projection is in the checkpoint, in any layout
    (the marker find_block looks for), sorted."""
    patterns = [
        re.compile(
            re.escape(layer_prefix).replace(re.escape("{L}"), r"(0|[1-9][0-9]*)")
            + re.escape(f"{layout.block}.{layout.params['w_down'].key_of(0)}")
        )
        for layer_prefix in family.layers
        for layout in family.layouts
    ]
    found = {
        int(match.group(1))
        for key in ckpt.files
        for pattern in patterns
        if (match := pattern.fullmatch(key))
    }
    return sorted(found)


def ranges(numbers: Sequence[int]) -> str:
    runs, start = [], numbers[0]
    for previous, current in zip(numbers, [*numbers[1:], None], strict=True):
        if current != previous + 1:
            runs.append(f"{start}" if start == previous else f"{start}-{previous}")
            start = current
    return ", ".join(runs)


def match_layer(family: Loadable, ckpt: Checkpoint, target: Target, layer: int) -> Match:
    """Every module parameter's source in layer `layer`, or the first reason to refuse."""
    layout, block = find_block(family, ckpt, layer)
    where = (
        f"{ckpt.description}, layer {layer} ({family.title}, {layout.name} layout under {block})"
    )
    under = sorted(k[len(block) :] for k in ckpt.files if k.startswith(block))
    _refuse_special(family, layout, ckpt, block, under, where)
    _refuse_unknown(family, layout, under, block, where, target)
    ignored: dict[str, list[str]] = {}  # fix -> the keys it is for
    for name, source in layout.params.items():
        key = full_key(block, source.key_of(0))
        if name not in target.shapes and key in ckpt.files:
            keys = ignored.setdefault(_fix_for_missing_param(name, ckpt, key, source), [])
            if key not in keys:
                keys.append(key)
    if ignored:
        raise CheckpointError(
            f"{where}: the module would ignore "
            + "; ".join(f"{', '.join(keys)} ({fix})" for fix, keys in ignored.items())
        )
    sources = {}
    for name in target.shapes:
        source = layout.params.get(name)
        if source is None:
            raise CheckpointError(
                f"{where}: the module has params[{name!r}] but {family.title} checkpoints hold "
                f"no such weights; remove {SPEC_FIELD.get(name, name)} from the spec"
            )
        _check_source(ckpt, block, name, source, target, where)
        sources[name] = source
    return Match(family, layout, block, sources)


def _fix_for_missing_param(name: str, ckpt: Checkpoint, key: str, source: Source) -> str:
    if name.startswith("shared_b_"):
        return "the shared expert has biases; the spec must say layer.shared_ffn_bias: true"
    if name.startswith("shared_") and name != "shared_expert_gate":
        axis = source.axes.index("s")
        width = ckpt.shape(key)[axis] if len(ckpt.shape(key)) == len(source.axes) else "?"
        return f"the module has no shared expert; the spec must say layer.shared_ffn_dim: {width}"
    if name == "w_gate":
        return "the experts are gated; the spec must say layer.activation: swiglu"
    return f"the module has no params[{name!r}]; the spec must say {SPEC_FIELD[name]}"


def _refuse_special(
    family: Loadable, layout: Layout, ckpt: Checkpoint, block: str, under: list[str], where: str
) -> None:
    for key in under:
        if key in family.refuse:
            raise CheckpointError(f"{where}: {block}{key}: {family.refuse[key]}")
    # A key the layout reads is a weight whatever its name ends with (Ergo's Hub names its
    # norm weights `...norm.scale`); its dtype is still checked.
    weights = {block + source.key for source in layout.params.values()}
    _refuse_quantized(ckpt, [block + key for key in under], where, weights)


def _refuse_quantized(
    ckpt: Checkpoint, keys: Sequence[str], where: str, weights: Collection[str] = ()
) -> None:
    """Refuse keys named as quantized weights' parts (other than `weights`, the keys a layout
    reads) and keys of a dtype moegen does not load."""
    quantized = [key for key in keys if key.endswith(QUANTIZED_SUFFIXES) and key not in weights]
    low = [key for key in keys if ckpt.dtype(key) not in FLOAT_DTYPES]
    if not (quantized or low):
        return
    found = quantized or low
    kinds = sorted({ckpt.dtype(key) for key in found})
    mxfp4 = any(key.endswith(("_blocks", "_scales")) for key in found)
    raise CheckpointError(
        f"{where}: the weights are quantized ({_listed(found)}: {', '.join(kinds)}"
        + (", gpt-oss's MXFP4 blocks and scales" if mxfp4 else "")
        + "); moegen loads float32, float16 and bfloat16 weights only and does not dequantize: "
        "dequantize first (e.g. load with transformers, whose quantizer dequantizes, and "
        "save_pretrained) or use a bf16 release of the model"
    )


def _refuse_unknown(
    family: Loadable, layout: Layout, under: list[str], block: str, where: str, target: Target
) -> None:
    patterns = [(_pattern(source), source) for source in layout.params.values()]
    experts = target.sizes["e"]
    unknown = []
    for key in under:
        hit = next(((p.fullmatch(key), s) for p, s in patterns if p.fullmatch(key)), None)
        if hit is None:
            unknown.append(block + key)
        elif hit[1].per_expert and int(hit[0].group(1)) >= experts:
            raise CheckpointError(
                f"{where}: {block}{key} is expert {hit[0].group(1)}, but the module has "
                f"NUM_EXPERTS = {experts}; the spec's layer.num_experts must match the checkpoint"
            )
    if unknown:
        raise CheckpointError(
            f"{where}: {_listed(unknown)} would be ignored: no parameter of a moegen module "
            f"holds {'it' if len(unknown) == 1 else 'them'} (a {family.title} MoE block in the "
            f"{layout.name} layout has only "
            f"{', '.join(sorted({s.key for s in layout.params.values()}))}); this layer does not "
            "fit a moegen layer"
        )


def _check_source(
    ckpt: Checkpoint, block: str, name: str, source: Source, target: Target, where: str
) -> None:
    expected = source.shape(target.sizes)
    experts = range(target.sizes["e"]) if source.per_expert else [None]
    for expert in experts:
        key = full_key(block, source.key_of(expert))
        if key not in ckpt.files:
            fix = (
                "the checkpoint is incomplete (a shard left out of the index?)"
                if name in REQUIRED
                else f"if the checkpoint has none, the spec must not say {SPEC_FIELD[name]}"
            )
            raise CheckpointError(
                f"{where}: {key} is missing from the checkpoint; the module's params[{name!r}] "
                f"is read from it: {fix}"
            )
        shape = ckpt.shape(key)
        if shape != expected:
            raise CheckpointError(
                f"{where}: {key} (in {ckpt.files[key].name}) has shape {list(shape)}; the "
                f"module's params[{name!r}] needs {list(expected)} = {source.shape_text()}"
                f"{' per expert' if source.per_expert else ''}: the spec's sizes differ from the "
                "checkpoint's"
            )
