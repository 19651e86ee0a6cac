"""The dense reference's argument checks: a config and a parameter set that belong together
(`moegen.verify.reference.layer` calls `check_reference_args` before computing anything)."""

from __future__ import annotations

from moegen.verify.reference.fields import (
    ACTIVATIONS,
    DROP_POLICIES,
    GATED_ACTIVATIONS,
    SCORES,
    ReferenceConfig,
)


def check_reference_args(cfg: ReferenceConfig, params: dict, num_tokens: int) -> None:
    """ValueError naming what does not fit: unknown choices, sizes, parameter sets."""
    _check_choices(cfg)
    _check_routing_sizes(cfg, params, num_tokens)
    _check_parameter_set(cfg, params)


def _check_choices(cfg: ReferenceConfig) -> None:
    if cfg.score not in SCORES:
        raise ValueError(f"unknown score function {cfg.score!r}")
    if cfg.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {cfg.activation!r}")
    if cfg.drop_policy not in DROP_POLICIES:
        raise ValueError(f"unknown drop policy {cfg.drop_policy!r}")
    if cfg.score_after_top_k and cfg.score != "softmax":
        raise ValueError("score_after_top_k needs score 'softmax'")
    if cfg.capacity is not None and cfg.capacity < 0:
        raise ValueError(f"negative capacity {cfg.capacity}")


def _check_routing_sizes(cfg: ReferenceConfig, params: dict, num_tokens: int) -> None:
    """top_k, the groups, the router's columns and the token shards against the sizes."""
    columns = params["router"].shape[1]
    experts = columns - cfg.weighed_shared_experts  # the columns that can be chosen
    if not 1 <= cfg.top_k <= experts:
        raise ValueError(f"top_k {cfg.top_k} not in [1, {experts}]")
    if cfg.num_groups > 1:
        if experts % cfg.num_groups:
            raise ValueError(f"{experts} experts do not split into {cfg.num_groups} groups")
        if not 1 <= cfg.top_groups <= cfg.num_groups:
            raise ValueError(f"top_groups {cfg.top_groups} not in [1, {cfg.num_groups}]")
        if cfg.top_k > cfg.top_groups * (experts // cfg.num_groups):
            raise ValueError(f"top_k {cfg.top_k} exceeds the experts in the kept groups")
        if not 1 <= cfg.group_top_n <= experts // cfg.num_groups:
            raise ValueError(f"group_top_n {cfg.group_top_n} not in [1, group size]")
    computing = params["w_up"].shape[0] if "w_up" in params else experts
    past = cfg.identity_experts + cfg.zero_experts
    if columns != computing + past + cfg.weighed_shared_experts:
        raise ValueError(
            f"router has {columns} columns: {computing} experts + {cfg.identity_experts} "
            f"identity + {cfg.zero_experts} zero experts + {cfg.weighed_shared_experts} "
            "weighed shared experts expected"
        )
    if cfg.weighed_shared_experts and "shared_up" not in params:
        raise ValueError("weighed shared experts need a shared expert")
    if past and (cfg.capacity is not None or cfg.num_groups > 1):
        raise ValueError("identity and zero experts take neither a capacity nor expert groups")
    if cfg.token_shards < 1 or num_tokens % cfg.token_shards:
        raise ValueError(f"{num_tokens} tokens do not split into {cfg.token_shards} shards")


def _check_parameter_set(cfg: ReferenceConfig, params: dict) -> None:
    """The parameters the activation needs, optional groups whole, nothing unknown."""
    gated = cfg.activation in GATED_ACTIVATIONS
    expected = {"router", "w_up", "w_down"} | ({"w_gate"} if gated else set())
    optional = [
        {"router_bias"},
        {"routing_bias"},
        {"b_up", "b_down"} | ({"b_gate"} if gated else set()),
        {"shared_up", "shared_down"} | ({"shared_gate"} if gated else set()),
        {"shared_b_up", "shared_b_down"} | ({"shared_b_gate"} if gated else set()),
        {"router_input_scale"},
        {"per_expert_scale"},
        {"router_scale"},
        {"expert_input_norm"},
        {"output_norm"},
        {"expert_output_norm"},
        {"shared_output_norm"},
        {"latent_in", "latent_out"},
        {"latent_in_bias", "latent_out_bias"},
    ]
    keys = set(params)
    if not expected <= keys:
        raise ValueError(f"{cfg.activation}: missing parameters {sorted(expected - keys)}")
    for group in optional:
        if keys & group and not group <= keys:
            raise ValueError(f"parameters {sorted(group)} come all together or not at all")
    for name, eps in (
        ("router_input_scale", cfg.router_norm_eps),
        ("expert_input_norm", cfg.expert_norm_eps),
        ("output_norm", cfg.output_norm_eps),
        ("expert_output_norm", cfg.expert_output_norm_eps),
        ("shared_output_norm", cfg.shared_output_norm_eps),
    ):
        if (name in keys) != (eps is not None):
            raise ValueError(f"params[{name!r}] and its epsilon come together or not at all")
    for extra, needs in (
        ("shared_expert_gate", "shared_up"),
        ("shared_b_up", "shared_up"),
        ("shared_output_norm", "shared_up"),
        ("latent_in_bias", "latent_in"),
    ):
        if extra in keys and needs not in keys:
            raise ValueError(f"{extra} needs {needs}")
    unknown = keys - expected - set().union(*optional) - {"shared_expert_gate"}
    if unknown:
        raise ValueError(f"unexpected parameters for {cfg.activation}: {sorted(unknown)}")
