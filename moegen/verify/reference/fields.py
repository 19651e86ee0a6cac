"""What the dense reference computes: its configuration, one field per feature of a spec
that changes the layer's math (`moegen.verify.reference.fields` is read by the verify stage,
which fills it from the plan, and by the reference itself)."""

from __future__ import annotations

from dataclasses import dataclass

SCORES = ("softmax", "sigmoid", "sqrtsoftplus")
DROP_POLICIES = ("probability", "position")
GATED_ACTIVATIONS = ("swiglu", "geglu")
ACTIVATIONS = (*GATED_ACTIVATIONS, "gelu", "relu", "relu2")


@dataclass(frozen=True)
class SharedGlu:
    """The shared expert's gated-activation parameters, where they are its own (all defaults:
    the plain activation)."""

    gate_limit: float | None = None
    up_limit: float | None = None
    sigmoid_scale: float = 1.0
    up_offset: float = 0.0
    gate_clamp_after: bool = False
    gate_softcap: float | None = None  # swiglu: cap * tanh(g / cap) * sigmoid(g)
    up_softcap: float | None = None  # up: cap * tanh(up / cap), after its clamp


@dataclass(frozen=True)
class ReferenceConfig:
    top_k: int
    score: str  # "softmax" | "sigmoid" | "sqrtsoftplus"
    renormalize: bool = False
    renormalize_epsilon: float = 0.0  # renormalize divides by (sum + this)
    bias_on_logits: bool = False  # the selection bias is added to the logits, not the scores
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    router_norm_eps: float | None = None  # router input: rms_norm * router_input_scale / sqrt(D)
    expert_norm_eps: float | None = None  # expert input: rms_norm * expert_input_norm
    output_norm_eps: float | None = None  # the output: rms_norm(y) * output_norm
    # each expert's output: rms_norm(out_e) * expert_output_norm[e], before its weight
    expert_output_norm_eps: float | None = None
    # the shared expert's output: rms_norm(s) * shared_output_norm, before its gate
    shared_output_norm_eps: float | None = None
    gelu_tanh: bool = False  # gelu / geglu: GELU's tanh approximation, not erf
    score_after_top_k: bool = False  # softmax only: top-k on raw logits, softmax over the k chosen
    routed_scaling: float = 1.0
    num_groups: int = 1  # 1 = no group-limited routing
    top_groups: int = 1
    capacity: int | None = None  # per expert, per token shard; None = dropless
    drop_policy: str = "probability"  # "probability" | "position"
    token_shards: int = 1  # contiguous equal token groups, each drops independently
    # with a sequence axis, each of those groups' sequences split into this many parts too:
    # a device holds a part of each of its sequences (seq_len says where sequences end)
    sequence_shards: int = 1
    seq_len: int | None = None
    load_balance_weight: float = 0.0
    load_balance_form: str = "switch"  # "switch" | "transformers" (load_balancing_loss_func)
    z_loss_weight: float = 0.0
    activation: str = "swiglu"  # "swiglu" | "geglu" | "gelu" | "relu" | "relu2"
    group_top_n: int = 2  # a group's score: the sum of its best n selection scores
    weights_on_input: bool = False  # the weight scales the expert's input, not its output
    gate_limit: float | None = None  # gated: gate = min(gate, limit)
    up_limit: float | None = None  # gated: up = clip(up, -limit, limit)
    sigmoid_scale: float = 1.0  # swiglu: gate * sigmoid(scale * gate)
    up_offset: float = 0.0  # gated: act(gate) * (up + offset)
    gate_clamp_after: bool = False  # gated: min(act(gate), gate_limit), not act(min(...))
    gate_softcap: float | None = None  # swiglu: cap * tanh(g / cap) * sigmoid(g)
    up_softcap: float | None = None  # gated: up = cap * tanh(up / cap), after its clamp
    shared_glu: SharedGlu | None = None  # the shared expert's own; None: the routed experts'
    identity_experts: int = 0  # router columns past the experts: a copy there returns its token
    zero_experts: int = 0  # router columns after those: a copy there contributes nothing
    weighed_shared_experts: int = 0  # the router's last columns weigh this many shared experts

    def __post_init__(self) -> None:
        # A config sent to a verify worker arrives as plain values: a mapping for shared_glu.
        if isinstance(self.shared_glu, dict):
            object.__setattr__(self, "shared_glu", SharedGlu(**self.shared_glu))


RouterConfig = ReferenceConfig  # the older name
