"""Twin parity, inside the worker: a shrunken module against the dense reference.

Each case (random routing; starved experts, where there are more experts than top_k) runs
the module's forward, its aux and the gradients of a loss over both, and the same through
`reference.dense_moe`, and compares them. The programs are traced and compiled once per
twin and shared by its cases (`ParityPrograms`): the cases differ in values only, so
compiling per case would compile the same programs again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from moegen.verify.messages import ParityCase
from moegen.verify.records.evidence import within_tolerance
from moegen.verify.reference.layer import ReferenceConfig, dense_moe
from moegen.verify.worker.compiled import CheckFailed

AUX_LOSSES = ("load_balance_loss", "router_z_loss")
AUX_COUNTS = ("tokens_per_expert", "dropped_per_expert")
# Rounding at bfloat16's 2^-8 flips a few in a thousand of the pre-activations that lie
# near a kink; a low-precision twin leaves out the largest 1% of element differences.
KINK_SHARE = 0.01


def relative_error(got: Any, want: Any, set_aside: float = 0.0, typical: float = 0.0) -> float:
    """|got - want| / |want|; infinite where `got` holds a NaN or an infinity, so that no
    comparison (NaN < tolerance is False, but so is NaN > anything) can pass it over.

    `set_aside`: the share of elements whose differences are left out, largest first (at
    least one element when above 0). `typical`: the size `want` has without the luck of
    its draw (typical_gradient_norms); |want| is not taken below it."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.isfinite(got).all():
        return math.inf
    scale = max(float(np.linalg.norm(want)), typical, 1e-30)
    differences = np.abs(got - want).ravel()
    if set_aside > 0.0 and differences.size > 1:
        kept = differences.size - max(1, math.ceil(set_aside * differences.size))
        differences = np.partition(differences, kept)[:kept]
    return float(np.linalg.norm(differences)) / scale


def set_aside_share(module: ModuleType) -> float:
    """The share of elements a twin's comparison leaves out: none in float32; in a lower
    precision, KINK_SHARE. There, rounding moves a pre-activation that lies near a kink
    (ReLU's 0, a clamp's limit) across it, and that element's whole gradient term appears
    or vanishes; a twin's bias gradient sums a few tokens, so one such term dominates a
    norm (one in 1,536 elements made 5.9e-2 of a drawn spec's grad_b_up). A wrong path
    moves most elements; the float32 twin compares every element, below 1e-5."""
    coarsest = max(jnp.finfo(module.COMPUTE_DTYPE).eps, jnp.finfo(module.PARAM_DTYPE).eps)
    return KINK_SHARE if coarsest > jnp.finfo(jnp.float32).eps else 0.0


def random_case(
    module: ModuleType, seed: int, input_shape: tuple[int, ...] | None = None
) -> tuple[dict, np.ndarray, np.ndarray]:
    input_shape = module.INPUT_SHAPE if input_shape is None else input_shape
    rng = np.random.default_rng(seed)
    # Parameters that start at zero (biases) get small random values: zeros would hide them;
    # those that start at one (norm weights, scales) random values around one, for the same
    # reason, positive.
    ones = getattr(module, "INIT_ONES", ())
    params = {
        name: (
            rng.uniform(0.5, 1.5, shape)
            if name in ones
            else rng.normal(0.0, module.INIT_SCALES[name] or 0.1, shape)
        ).astype(np.float32)
        for name, shape in module.PARAM_SHAPES.items()
    }
    x = rng.normal(0.0, 1.0, input_shape).astype(np.float32)
    cotangent = rng.normal(0.0, 1.0, input_shape).astype(np.float32)
    return params, x, cotangent


def starved_case(
    module: ModuleType, seed: int, input_shape: tuple[int, ...] | None = None
) -> tuple[dict, np.ndarray, np.ndarray, list[int]]:
    """Positive tokens and router columns of one sign: negative columns never win top-k.

    The odd experts of each group are starved, but never so many that a token's kept groups
    hold fewer than top_k fed experts: group-limited routing would then have to pick starved
    ones (4 experts in 2 groups, keep 1, top-2 can starve none).
    """
    params, x, cotangent = random_case(module, seed, input_shape)
    experts, top_k = module.NUM_EXPERTS, module.TOP_K
    groups, kept = getattr(module, "EXPERT_GROUPS", 1), getattr(module, "KEPT_GROUPS", 1)
    per_group = experts // groups
    fed_per_group = -(-top_k // kept)
    starved = [
        group * per_group + i
        for group in range(groups)
        for i in range(1, per_group, 2)[: per_group - fed_per_group]
    ]
    x = np.abs(x) + 0.1
    # Small logits keep the scores away from saturation, where gradients vanish.
    router = 0.25 * np.abs(params["router"])
    router[:, starved] *= -1.0
    params["router"] = router
    if "routing_bias" in params:
        params["routing_bias"] = np.zeros_like(params["routing_bias"])
    return params, x, cotangent, starved


def skewed_case(
    module: ModuleType, seed: int, input_shape: tuple[int, ...] | None = None
) -> tuple[dict, np.ndarray, np.ndarray, list[int]]:
    """As many copies as they can take to the experts with replicas (REPLICA_SPLIT), so that
    their copies split over several slots: positive tokens, and those experts' router columns
    well above the others'."""
    params, x, cotangent = random_case(module, seed, input_shape)
    hot = [expert for expert, _ in module.REPLICA_SPLIT]
    x = np.abs(x) + 0.1
    router = 0.05 * params["router"]
    router[:, hot] = 0.25 * np.abs(params["router"][:, hot]) + 0.05
    params["router"] = router
    if "routing_bias" in params:
        params["routing_bias"] = np.zeros_like(params["routing_bias"])
    return params, x, cotangent, hot


# Cotangents drawn to measure how large each gradient is without the luck of one draw, from
# a seed of their own (the cases draw from seeds 0, 1 and 2).
TYPICAL_DRAWS = 8
TYPICAL_SEED = 100


class Compared(NamedTuple):
    """One case through the module and the reference: what `parity_errors` compares."""

    aux: Any
    ref_aux: Any
    got: tuple  # (y, grads, grad_x)
    want: tuple  # (ref_y, ref_aux, ref_grads, ref_grad_x)
    inputs: tuple  # (params, x) as the module saw them (after any dtype rounding), on the host
    cotangent: Any
    # each gradient's norm without the luck of the draw, where asked (typical_gradient_norms)
    typical: dict[str, float] | None = None


class ParityPrograms:
    """The module's and the reference's forward and gradient programs for one layer, jitted
    once; the cotangent is an argument, so every case of the same shape reuses them."""

    def __init__(self, module: ModuleType, cfg: ReferenceConfig, layer: Callable[..., Any]):
        self.module = module
        self.mesh = mesh = module.make_mesh(jax.devices()[: module.NUM_DEVICES])

        # The balance losses join the loss, so that their gradients are checked too.
        def module_loss(p: dict, xs: Any, cotangent: Any) -> Any:
            y, aux = layer(p, xs, mesh=mesh)
            losses = [getattr(aux, name) for name in AUX_LOSSES if name in aux._fields]
            return jnp.sum(y.astype(jnp.float32) * cotangent) + sum(losses)

        def reference_loss(p: dict, xs: Any, cotangent: Any) -> tuple[Any, tuple]:
            y, aux = dense_moe(p, xs, cfg)
            return jnp.sum(y * cotangent) + aux.load_balance_loss + aux.router_z_loss, (y, aux)

        # The module's forward and gradients are two programs (a custom_vjp's primal and its
        # forward rule both run); the reference's, one: it has no such rule, and each compile
        # is most of a twin's time.
        self.forward = jax.jit(functools.partial(layer, mesh=mesh))
        self.gradients = jax.jit(jax.grad(module_loss, argnums=(0, 1)))
        self.reference = jax.jit(jax.grad(reference_loss, argnums=(0, 1), has_aux=True))

    def compare(self, params: dict, x: Any, cotangent: Any) -> Compared:
        """The module's forward, aux and gradients at (params, x), and the reference's at
        exactly the values the module saw (after any dtype rounding)."""
        placed_params, placed_x = self.place(params, x)
        with jax.set_mesh(self.mesh):
            y, aux = self.forward(placed_params, placed_x)
            grads, grad_x = self.gradients(placed_params, placed_x, cotangent)
        host_params = {k: np.asarray(v, np.float32) for k, v in placed_params.items()}
        host_x = np.asarray(placed_x, np.float32)
        (ref_grads, ref_grad_x), (ref_y, ref_aux) = self.reference(host_params, host_x, cotangent)
        want = (ref_y, ref_aux, ref_grads, ref_grad_x)
        inputs = (host_params, host_x)
        return Compared(aux, ref_aux, (y, grads, grad_x), want, inputs, cotangent)

    def with_typical_sizes(self, compared: Compared) -> Compared:
        """`compared` with each reference gradient's typical norm, for parity_errors."""
        norms = self.typical_gradient_norms(*compared.inputs, np.shape(compared.cotangent))
        return compared._replace(typical=norms)

    def typical_gradient_norms(self, params: dict, x: Any, shape: tuple) -> dict[str, float]:
        """Each reference gradient's root-mean-square norm over TYPICAL_DRAWS fresh random
        cotangents. A gradient that sums many tokens' terms (a scalar scale's, a bias's) can
        cancel to near zero for one cotangent: its value is then tiny beside the terms that
        round, and the relative error of a right result is large. Its size over many draws
        is what rounding is measured against; a wrong path misses by that size."""
        rng = np.random.default_rng(TYPICAL_SEED)
        squares: dict[str, float] = {}
        for _ in range(TYPICAL_DRAWS):
            cotangent = rng.normal(0.0, 1.0, shape).astype(np.float32)
            (grads, grad_x), _ = self.reference(params, x, cotangent)
            for name, value in (*(("grad_" + k, v) for k, v in grads.items()), ("grad_x", grad_x)):
                norm = float(np.linalg.norm(np.asarray(value, np.float64)))
                squares[name] = squares.get(name, 0.0) + norm**2 / TYPICAL_DRAWS
        return {name: math.sqrt(total) for name, total in squares.items()}

    def place(self, params: dict, x: Any) -> tuple[dict, Any]:
        from jax.sharding import NamedSharding

        # Rounded on the host (as jnp.asarray would) and placed from there: a device array
        # would be resharded by a program compiled for each shape.
        module, mesh = self.module, self.mesh
        placed = {
            name: jax.device_put(
                np.asarray(value, np.dtype(module.PARAM_DTYPE)),
                NamedSharding(mesh, module.PARAM_SPECS[name]),
            )
            for name, value in params.items()
        }
        host_x = np.asarray(x, np.dtype(module.COMPUTE_DTYPE))
        return placed, jax.device_put(host_x, module.input_sharding(mesh))


def parity_errors(compared: Compared, set_aside: float = 0.0) -> dict[str, float]:
    """The relative error of each output, gradient and loss (`set_aside`: relative_error's)."""
    aux = compared.aux
    (y, grads, grad_x), (ref_y, ref_aux, ref_grads, ref_grad_x) = compared.got, compared.want

    def error(a: Any, b: Any, name: str = "") -> float:
        return relative_error(a, b, set_aside, (compared.typical or {}).get(name, 0.0))

    errors = {"y": error(y, ref_y), "grad_x": error(grad_x, ref_grad_x, "grad_x")}
    errors |= {f"grad_{k}": error(grads[k], ref_grads[k], f"grad_{k}") for k in ref_grads}
    errors |= {
        name: relative_error(getattr(aux, name), getattr(ref_aux, name))
        for name in AUX_LOSSES
        if name in aux._fields
    }
    return errors


def check_parity(
    module: ModuleType,
    cfg: ReferenceConfig,
    params: dict,
    x: np.ndarray,
    cotangent: np.ndarray,
    tolerance: float,
    case: str,
    layer: Callable[..., Any] | None = None,
    programs: ParityPrograms | None = None,
) -> ParityCase:
    """Forward, aux and gradients of the module (its `layer`: moe_layer unless given)
    against the dense reference; `programs` when another case of the layer built them."""
    if programs is None:
        programs = ParityPrograms(module, cfg, module.moe_layer if layer is None else layer)
    compared = programs.compare(params, x, cotangent)
    aux, ref_aux = compared.aux, compared.ref_aux
    errors = parity_errors(compared, set_aside_share(module))
    for name in AUX_COUNTS:
        if name not in aux._fields:
            continue
        got, want = np.asarray(getattr(aux, name)), np.asarray(getattr(ref_aux, name))
        if not np.array_equal(got, want):
            raise CheckFailed(f"{case}: aux.{name} {got.tolist()} != {want.tolist()}")
    worst = max(errors, key=errors.get)
    if not within_tolerance(errors[worst], tolerance):
        # Before refusing: a gradient this draw cancels is measured against its typical size
        # (relative_error's floor only raises a denominator, so a pass stands without it).
        errors = parity_errors(programs.with_typical_sizes(compared), set_aside_share(module))
        worst = max(errors, key=errors.get)
    if not within_tolerance(errors[worst], tolerance):
        raise CheckFailed(
            f"{case}: {worst} differs from the dense reference: relative error "
            f"{errors[worst]:.3e} >= {tolerance:.0e}; all: "
            + ", ".join(f"{k}={v:.2e}" for k, v in errors.items())
        )
    dropped = None
    if "dropped_per_expert" in aux._fields:
        dropped = int(np.asarray(aux.dropped_per_expert).sum())
    counts = np.asarray(aux.tokens_per_expert)
    return ParityCase(case, errors[worst], tuple(counts.tolist()), dropped)


def twin_parity(
    module: ModuleType,
    layer: Callable[..., Any],
    input_shape: tuple[int, ...],
    cfg: ReferenceConfig,
    tolerance: float,
) -> tuple[ParityCase, ...]:
    """Every case of one twin layer: random routing, then starved experts where some can be
    starved (more experts than top_k), which must then receive no token, and where experts
    have replicas, a routing skewed to them."""
    programs = ParityPrograms(module, cfg, layer)
    random = random_case(module, 0, input_shape)
    results = [check_parity(module, cfg, *random, tolerance, "random routing", programs=programs)]
    if module.NUM_EXPERTS > module.TOP_K:
        params, x, cotangent, starved = starved_case(module, 1, input_shape)
        result = check_parity(
            module, cfg, params, x, cotangent, tolerance, "starved experts", programs=programs
        )
        if any(result.tokens_per_expert[e] for e in starved):
            raise CheckFailed(f"starved experts {starved} received tokens: {dict(result)}")
        results.append(dataclasses.replace(result, starved_experts=tuple(starved)))
    if hasattr(module, "REPLICA_SPLIT"):
        params, x, cotangent, hot = skewed_case(module, 2, input_shape)
        result = check_parity(
            module,
            cfg,
            params,
            x,
            cotangent,
            tolerance,
            "skewed to the replicas",
            programs=programs,
        )
        copies = result.tokens_per_expert[: module.NUM_EXPERTS]
        if not skewed_enough(copies, hot, module.TOP_K):
            raise CheckFailed(
                f"the replicated experts {hot} got under half the copies they could: {copies}"
            )
        results.append(result)
    return tuple(results)


def skewed_enough(copies: tuple[int, ...], hot: list[int], top_k: int) -> bool:
    """Whether the experts `hot` got at least half the copies they could: a token sends each
    expert one copy at most, so with more picks than hot experts (top_k > len(hot)) they can
    get len(hot) / top_k of the copies, not all."""
    most = sum(copies) * min(len(hot), top_k) / top_k
    return 2 * sum(copies[e] for e in hot) >= most
