"""Rules of the experts' latent width (layer.latent_dim, layer.latent_bias)."""

from __future__ import annotations

from moegen.diagnostics import Diagnostic
from moegen.load import LoadedSpec
from moegen.sizes import nearest_multiples


def latent_bias_needs_a_latent_width(loaded: LoadedSpec) -> list[Diagnostic]:
    """The biases follow the latent projections: without a latent width there are none."""
    layer = loaded.spec.layer
    if not layer.latent_bias or layer.latent_dim:
        return []
    return [
        loaded.diagnostic(
            ("layer", "latent_bias"),
            "there are no latent projections to give biases to; set layer.latent_dim (the "
            "experts' latent width) or remove latent_bias",
        )
    ]


def latent_divisible_by_fsdp(loaded: LoadedSpec) -> list[Diagnostic]:
    """FSDP shards the expert weights along the latent width they contract or produce, as it
    shards the others along embed_dim: each shard must be whole."""
    spec = loaded.spec
    fsdp = spec.mesh.axes.get("fsdp", 1)
    latent = spec.layer.latent_dim
    if not latent or latent % fsdp == 0:
        return []
    nearest = " or ".join(map(str, nearest_multiples(latent, fsdp)))
    return [
        loaded.diagnostic(
            ("layer", "latent_dim"),
            f"{latent} is not divisible by fsdp = {fsdp} (the expert weights are sharded "
            f"along their latent width); nearest valid: {nearest}",
        )
    ]


LATENT_RULES = (latent_bias_needs_a_latent_width, latent_divisible_by_fsdp)
