"""The plan's prose: the one-sentence summary of a spec, and why shard_map's varying-axes check
is off for a module. Built from validated numbers and enums only (no free text of the spec)."""

from __future__ import annotations

from moegen import pins
from moegen.hardware import hardware
from moegen.kernels import kernel
from moegen.load import LoadedSpec
from moegen.spec import Capacity, Router


def vma_unchecked_reason(loaded: LoadedSpec) -> str:
    """Why shard_map's varying-axes check must be off for this module ('' when it can stay on)."""
    spec = loaded.spec
    reason = kernel(spec.target.kernel).vma_unchecked_reason
    if reason:
        return reason
    if spec.layer.activation in ("geglu", "gelu") and spec.layer.gelu_approximation == "none":
        return "XLA's erf polynomial carries no varying-axes types"
    return ""


def _topology_text(hardware_name: str, topology: str | None) -> str:
    if not topology:
        return "."
    chip = hardware(hardware_name)
    return f", {chip.devices(topology)} GPUs." if chip.platform == "gpu" else f" {topology}."


def summary(loaded: LoadedSpec) -> str:
    """One sentence stating the spec, built from validated numbers and enums only."""
    spec = loaded.spec
    router, layer = spec.router, spec.layer
    routing = f"{router.score} routing"
    if router.score_after_top_k:
        routing += " over the chosen logits"
    if router.group_limit:
        routing += f" in {router.group_limit.keep} of {router.group_limit.groups} groups"
    details = [
        "renormalised" if router.renormalize else "",
        f"scaled by {router.routed_scaling:g}" if router.routed_scaling != 1.0 else "",
        "balancing bias" if router.routing_bias else "",
        _balance_loss(router),
        f"z-loss {router.z_loss:g}" if router.z_loss else "",
        _capacity_text(router.capacity) if router.capacity else "",
    ]
    extras = "".join(f", {d}" for d in details if d)
    experts = f"{layer.num_experts} {layer.activation} experts"
    if layer.ffn_bias:
        experts += " with biases"
    widths = f"embed {layer.embed_dim}, ffn {layer.ffn_dim}"
    if layer.latent_dim:
        widths += f" in a latent width of {layer.latent_dim}"
    if layer.shared_ffn_dim:
        widths += f", shared expert ffn {layer.shared_ffn_dim}"
    mesh = " x ".join(f"{name} {size}" for name, size in spec.mesh.axes.items())
    return (
        f"MoE layer: {experts} ({widths}), top-{router.top_k} "
        f"{routing}{extras}, {spec.parallelism.experts} experts, "
        f"on a {mesh} mesh, kernel {spec.target.kernel}, target {spec.target.hardware}"
        + _topology_text(spec.target.hardware, spec.target.topology)
    )


def tested_with(hardware_name: str) -> str:
    """The versions a module for `hardware_name` is verified with, and where layers like it
    ran on a chip."""
    chip = hardware(hardware_name)
    tpu = chip.platform == "tpu"
    pinned = f"jax {pins.JAX}" + (f" and libtpu {pins.LIBTPU}" if tpu else "")
    compiled = f", compiled for {hardware_name}" if chip.platform != "cpu" else ""
    pinned += ", the versions moegen pins" if tpu else ", the version moegen pins"
    text = f"Tested with {pinned} (its twin on CPU{compiled})"
    if not tpu:
        return text + "."
    return (
        f"{text}; moegen's TPU device check runs layers generated like this one on "
        f"{pins.CHIP} with jax {pins.CHIP_JAX}."
    )


def _balance_loss(router: Router) -> str:
    if not router.load_balance_loss:
        return ""
    form = " (transformers' form)" if router.load_balance_form == "transformers" else ""
    return f"load-balancing loss {router.load_balance_loss:g}{form}"


def _capacity_text(capacity: Capacity) -> str:
    size = (
        f"capacity {capacity.copies} copies"
        if capacity.copies is not None
        else f"capacity factor {capacity.factor:g}"
    )
    per = " per sequence" if capacity.per == "sequence" else ""
    return f"{size}{per} (drop by {capacity.drop})"
