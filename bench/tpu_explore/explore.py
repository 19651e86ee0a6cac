"""Exploration on one TPU chip (2026-12-06): peers, kernel tile sweeps, permutation pieces, variants.

Runs where only jax is installed; reads the modules `moegen build --no-verify` renders from the
specs beside it (see README.md). Figures to $OUT/explore.json.
"""

# The code that ran on the chip, kept as it ran (formatting aside): loop closures and
# one-letter names included.
# ruff: noqa: B023, E741, E731, E501

import importlib.util
import json
import os
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(__file__))
import variants as L  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
DEADLINE = time.time() + float(os.environ.get("EXP_BUDGET_S", "500"))
RESULTS = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "rows": []}
F32, BF16 = jnp.float32, jnp.bfloat16


def save():
    with open(os.path.join(OUT, "explore.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def record(**row):
    RESULTS["rows"].append(row)
    print(json.dumps(row), flush=True)
    save()


def timeit(fn, *args, n=10):
    compiled = jax.jit(fn).lower(*args).compile()
    out = compiled(*args)
    jax.block_until_ready(out)
    out = compiled(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    del out
    return statistics.median(times) * 1e3


def load_module(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fwd_bwd(layer_fn, ct):
    def loss(p, x):
        return jnp.sum(layer_fn(p, x).astype(F32) * ct)

    return jax.grad(loss, argnums=(0, 1))


def relerr(a, b):
    a, b = a.astype(F32), b.astype(F32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


TINY = bool(os.environ.get("EXP_TINY"))


def shapes_for(case):
    if TINY:
        return dict(E=8, D=256, F=128, K=2, T=64, pdt=F32 if case == "qwen3" else BF16)
    return {
        "qwen3": dict(E=128, D=2048, F=768, K=8, T=8192, pdt=F32),
        "mixtral": dict(E=8, D=4096, F=14336, K=2, T=8192, pdt=BF16),
    }[case]


def make_inputs(s, seed=0):
    ks = jax.random.split(jax.random.key(seed), 6)
    E, D, F = s["E"], s["D"], s["F"]
    params = {
        "router": jax.random.normal(ks[0], (D, E), F32) * D**-0.5,
        "w_gate": (jax.random.normal(ks[1], (E, D, F), F32) * D**-0.5).astype(s["pdt"]),
        "w_up": (jax.random.normal(ks[2], (E, D, F), F32) * D**-0.5).astype(s["pdt"]),
        "w_down": (jax.random.normal(ks[3], (E, F, D), F32) * F**-0.5).astype(s["pdt"]),
    }
    x = jax.random.normal(ks[4], (s["T"], D), F32).astype(BF16)
    ct = jax.random.normal(ks[5], (s["T"], D), F32)
    return params, x, ct


def flops(s):
    return 2 * s["T"] * s["K"] * s["D"] * s["F"] * 3


def time_layer(case, name, fn, params, x, ct, s, extra=None):
    if time.time() > DEADLINE:
        record(case=case, name=name, skipped="deadline")
        return None
    try:
        f = timeit(fn, params, x)
        fb = timeit(fwd_bwd(fn, ct), params, x)
        row = dict(
            case=case,
            name=name,
            fwd_ms=round(f, 3),
            fwdbwd_ms=round(fb, 3),
            fwd_tfs=round(flops(s) / f / 1e9, 1),
            fwdbwd_tfs=round(3 * flops(s) / fb / 1e9, 1),
        )
        row.update(extra or {})
        record(**row)
        return row
    except Exception as e:  # noqa: BLE001
        record(case=case, name=name, error=f"{type(e).__name__}: {str(e)[:300]}")
        return None


def kernel_sweep(case, s, params, x, aligns, tiles_by_kernel):
    """Time each grouped matmul of the layer alone at realistic (padded) group sizes."""
    E, D, F, K, T = s["E"], s["D"], s["F"], s["K"], s["T"]
    w, ids = jax.jit(lambda p, x: L.route(x, p["router"], K))(params, x)
    best = {}
    for align in aligns:
        rows_total = T * K + (E * align if align else 0)
        if align:
            sizes = jax.jit(lambda i: L.plan_rows(i, E, align, rows_total)[3])(ids)
        else:
            sizes = jnp.bincount(ids.reshape(-1), length=E).astype(jnp.int32)
        lhs_d = jax.random.normal(jax.random.key(1), (rows_total, D), F32).astype(BF16)
        lhs_2f = jax.random.normal(jax.random.key(2), (rows_total, 2 * F), F32).astype(BF16)
        lhs_f = jax.random.normal(jax.random.key(5), (rows_total, F), F32).astype(BF16)
        w_gu = jax.random.normal(jax.random.key(3), (E, D, 2 * F), F32).astype(BF16)
        w_d = jax.random.normal(jax.random.key(4), (E, F, D), F32).astype(BF16)
        I = dict(interpret=L.INTERPRET)
        kernels = {
            "gu_fwd": (lambda t, a, b, g: L.backend.gmm(a, b, g, BF16, t, **I), (lhs_d, w_gu)),
            "gu_dlhs": (
                lambda t, a, b, g: L.backend.gmm(a, b, g, BF16, t, transpose_rhs=True, **I),
                (lhs_2f, w_gu),
            ),
            "gu_drhs": (
                lambda t, a, b, g: L.backend.tgmm(a.T, b, g, BF16, t, num_actual_groups=E, **I),
                (lhs_d, lhs_2f),
            ),
            "down_fwd": (lambda t, a, b, g: L.backend.gmm(a, b, g, BF16, t, **I), (lhs_f, w_d)),
            "down_dlhs": (
                lambda t, a, b, g: L.backend.gmm(a, b, g, BF16, t, transpose_rhs=True, **I),
                (lhs_d, w_d),
            ),
            "down_drhs": (
                lambda t, a, b, g: L.backend.tgmm(a.T, b, g, BF16, t, num_actual_groups=E, **I),
                (lhs_f, lhs_d),
            ),
        }
        for kname, (call, arrays) in kernels.items():
            for tile in tiles_by_kernel(kname, align):
                if time.time() > DEADLINE:
                    return best
                try:
                    ms = timeit(lambda a, b, g, t=tile: call(t, a, b, g), *arrays, sizes)
                    record(case=case, sweep=kname, align=align, tile=tile, ms=round(ms, 3))
                    key = (align, kname)
                    if key not in best or ms < best[key][1]:
                        best[key] = (tile, ms)
                except Exception as e:  # noqa: BLE001
                    record(case=case, sweep=kname, align=align, tile=tile, error=str(e)[:200])
    return best


def module_layer(mod):
    mesh = mod.make_mesh()

    def fn(p, x):
        y, _ = mod.moe_layer(p, x, mesh=mesh)
        return y.reshape(-1, y.shape[-1])

    return fn, mesh


def module_params(mod, params, mesh):
    from jax.sharding import NamedSharding

    out = {}
    for n in mod.PARAM_SHAPES:
        if n == "w_gate_up":
            v = jnp.concatenate([params["w_gate"], params["w_up"]], axis=2)
        else:
            v = params[n]
        out[n] = jax.device_put(v.astype(mod.PARAM_DTYPE), NamedSharding(mesh, mod.PARAM_SPECS[n]))
    return out


def micro(case, s, params, x):
    E, K, T, D = s["E"], s["K"], s["T"], s["D"]
    w, ids = jax.jit(lambda p, x: L.route(x, p["router"], K))(params, x)
    flat = ids.reshape(-1)
    order = jnp.argsort(flat).astype(jnp.int32)
    src, src_copy, dest, sizes = jax.jit(lambda i: L.plan_rows_fast(i, E))(ids)
    rows = jax.random.normal(jax.random.key(7), (T * K, D), F32).astype(BF16)
    items = {
        "route": (lambda p, x: L.route(x, p["router"], K), (params, x)),
        "argsort": (lambda f: jnp.argsort(f), (flat,)),
        "bincount": (lambda f: jnp.bincount(f, length=E), (flat,)),
        "onehot_sizes": (
            lambda f: jnp.sum(f[:, None] == jnp.arange(E, dtype=f.dtype), axis=0, dtype=jnp.int32),
            (flat,),
        ),
        "scatter_dest": (
            lambda o: (
                jnp.zeros_like(o)
                .at[o]
                .set(jnp.arange(o.shape[0], dtype=o.dtype), unique_indices=True)
            ),
            (order,),
        ),
        "argsort_dest": (lambda o: jnp.argsort(o), (order,)),
        "gather_rows": (lambda x, s: x[s], (x, src)),
        "gather_rows_concat0": (lambda x, s, d: L.gather_rows(x, s, d), (x, src, dest)),
        "combine_fwd": (lambda o, w, d, c: L.combine(o, w, d, c), (rows, w, dest, src_copy)),
        "combine_bwd": (
            lambda o, w, d, c, g: jax.vjp(lambda o, w: L.combine(o, w, d, c), o, w)[1](g),
            (rows, w, dest, src_copy, x.astype(F32)),
        ),
        "gather_bwd": (
            lambda x, s, d, g: jax.vjp(lambda x: L.gather_rows(x, s, d), x)[1](g),
            (x, src, dest, rows),
        ),
        "cast_weights": (
            lambda p: [p[n].astype(BF16) for n in ("w_gate", "w_up", "w_down")],
            (params,),
        ),
        "concat_gu": (
            lambda p: jnp.concatenate([p["w_gate"].astype(BF16), p["w_up"].astype(BF16)], axis=2),
            (params,),
        ),
    }
    for name, (fn, args) in items.items():
        if time.time() > DEADLINE:
            return
        try:
            record(case=case, micro=name, ms=round(timeit(fn, *args), 3))
        except Exception as e:  # noqa: BLE001
            record(case=case, micro=name, error=str(e)[:200])


def rows_micro(case):
    """Run 3 (not yet run): the DMA row kernels of row_kernels.py against XLA's gather and
    combine at Qwen3 shapes, the views' relayout copies included."""
    import row_kernels as R

    s = shapes_for(case)
    params, x, _ = make_inputs(s)
    E, K, T, D = s["E"], s["K"], s["T"], s["D"]
    w, ids = jax.jit(lambda p, x: L.route(x, p["router"], K))(params, x)
    src, src_copy, dest, sizes = jax.jit(lambda i: L.plan_rows_fast(i, E))(ids)
    rows = jax.random.normal(jax.random.key(7), (T * K, D), F32).astype(BF16)
    items = {
        "xla_gather_rows": (lambda x, s: x[s], (x, src)),
        "dma_gather_rows": (lambda x, s: R.gather_rows(x, s), (x, src)),
        "xla_combine_fwd": (
            lambda o, w, d: jnp.einsum("tkd,tk->td", o[d], w, preferred_element_type=F32),
            (rows, w, dest),
        ),
        "dma_combine_fwd": (lambda o, w, d: R.combine_rows(o, d, w), (rows, w, dest)),
    }
    for name, (fn, args) in items.items():
        try:
            record(case=case, micro=name, ms=round(timeit(fn, *args), 3))
        except Exception as e:  # noqa: BLE001
            record(case=case, micro=name, error=str(e)[:300])


def run_case(case, modules, aligns, tiles_by_kernel, variants):
    s = shapes_for(case)
    params, x, ct = make_inputs(s)
    K = s["K"]
    # f32 reference and its gradients (checkpointed scan over experts)
    ref_fn = lambda p, x: L.reference(p, x, top_k=K)  # noqa: E731
    try:
        y_ref = jax.jit(ref_fn)(params, x)
        g_ref = jax.jit(fwd_bwd(ref_fn, ct))(params, x)
    except Exception as e:  # noqa: BLE001
        record(case=case, name="reference", error=str(e)[:300])
        y_ref = None

    def parity(name, fn, p, xin=None):
        if y_ref is None:
            return
        xin = x if xin is None else xin
        y = jax.jit(fn)(p, xin)
        g = jax.jit(fwd_bwd(fn, ct))(p, xin)
        errs = {"y": relerr(y, y_ref), "dx": relerr(g[1].reshape(g_ref[1].shape), g_ref[1])}
        for k in g[0]:
            if k in g_ref[0]:
                errs["d" + k] = relerr(g[0][k], g_ref[0][k])
        record(case=case, parity=name, **{k: float(f"{v:.3g}") for k, v in errs.items()})

    time_layer(case, "ceiling", lambda p, x: L.dense_ceiling(p, x, top_k=K), params, x, ct, s)
    time_layer(case, "maxtext", lambda p, x: L.maxtext_peer(p, x, top_k=K), params, x, ct, s)
    time_layer(case, "ragged_dot", lambda p, x: L.ragged_peer(p, x, top_k=K), params, x, ct, s)
    for mname in modules:
        try:
            mod = load_module(os.path.join(os.path.dirname(__file__), mname + ".py"))
            fn, mesh = module_layer(mod)
            p = module_params(mod, params, mesh)
            xm = jax.device_put(x.reshape(mod.INPUT_SHAPE), mod.input_sharding(mesh))
            time_layer(case, "module:" + mname, fn, p, xm, ct, s)
            if time.time() < DEADLINE and mname.endswith(("pallas", "xla")):
                parity("module:" + mname, fn, p, xm)
        except Exception:  # noqa: BLE001
            record(case=case, name="module:" + mname, error=traceback.format_exc()[-600:])
    micro(case, s, params, x)
    best = kernel_sweep(case, s, params, x, aligns, tiles_by_kernel)
    RESULTS.setdefault("best", {})[case] = {f"{a}:{k}": v for (a, k), v in best.items()}
    save()
    for vname, kw in variants(best).items():
        fn = lambda p, x, kw=kw: L.layer(p, x, top_k=K, **kw)  # noqa: E731
        row = time_layer(case, vname, fn, params, x, ct, s, extra={"kw": repr(kw)})
        if row and time.time() < DEADLINE:
            parity(vname, fn, params)


def qwen3_tiles(kname, align):
    tms = [align] if align else [512, 256]
    out = []
    for tm in tms:
        if kname == "gu_fwd":
            out += [(tm, 2048, 768), (tm, 1024, 1536), (tm, 2048, 512), (tm, 512, 1536)]
        elif kname == "gu_dlhs":  # contraction 1536, output 2048
            out += [(tm, 1536, 1024), (tm, 768, 2048), (tm, 1536, 512), (tm, 512, 2048)]
        elif kname == "gu_drhs":  # out [2048, 1536]
            out += [(tm, 2048, 768), (tm, 1024, 1536), (tm, 512, 1536), (tm, 1024, 768)]
        elif kname == "down_fwd":  # contraction 768, output 2048
            out += [(tm, 768, 2048), (tm, 768, 1024), (tm, 768, 512)]
        elif kname == "down_dlhs":  # contraction 2048, output 768
            out += [(tm, 2048, 768), (tm, 1024, 768), (tm, 512, 768)]
        elif kname == "down_drhs":  # out [768, 2048]
            out += [(tm, 768, 2048), (tm, 768, 1024), (tm, 768, 512)]
    return out


def mixtral_tiles(kname, align):
    tms = [align] if align else [512]
    out = []
    for tm in tms:
        if kname.endswith("fwd") or kname.endswith("dlhs"):
            out += [(tm, 1024, 1024), (tm, 512, 2048), (tm, 2048, 512), (tm, 512, 1024)]
        else:
            out += [(tm, 1024, 1024), (tm, 512, 2048), (tm, 2048, 512), (tm, 1024, 512)]
    return out


def variants_for(case, K, T, E):
    def make(best):
        out = {}
        plain = (512, 768, 768) if case == "qwen3" else (512, 1024, 1024)
        out["v_plain_vjp"] = dict(
            align=0,
            gu_tiles=plain,
            down_tiles=plain,
            fuse=False,
            cast_weights=True,
            rows_total=T * K,
        )
        for align in sorted({a for a, _ in best}):
            pick = lambda k: best.get((align, k), (None,))[0]  # noqa: E731
            gu = (pick("gu_fwd"), pick("gu_dlhs"), pick("gu_drhs"))
            dn = (pick("down_fwd"), pick("down_dlhs"), pick("down_drhs"))
            if None in gu or None in dn:
                continue
            rows_total = T * K + (E * align if align else 0)
            out[f"v_align{align}_fused_best"] = dict(
                align=align,
                gu_tiles=gu,
                down_tiles=dn,
                fuse=True,
                cast_weights=True,
                rows_total=rows_total,
            )
        return out

    return make


def qwen3_variants(best):
    gu = ((256, 2048, 768), (256, 1536, 1024), (256, 2048, 768))
    dn = ((256, 768, 2048), (256, 2048, 768), (256, 768, 2048))
    base = dict(align=0, gu_tiles=gu, down_tiles=dn, fuse=True, cast_weights=True, rows_total=65536)
    gu32 = ((256, 1024, 768), (256, 768, 1024), (256, 1024, 768))
    dn32 = ((256, 768, 1024), (256, 1024, 768), (256, 768, 1024))
    return {
        "v_fused256": base,
        "v_fused256_fast": dict(base, fast=True),
        "v_f32inplace_fast": dict(
            base, fast=True, fuse=False, cast_weights=False, gu_tiles=gu32, down_tiles=dn32
        ),
        "v_unfused256_fast": dict(
            base,
            fast=True,
            fuse=False,
            gu_tiles=((256, 2048, 768), (256, 768, 1024), (256, 2048, 768)),
        ),
    }


def mixtral_variants(best):
    pick = lambda k: best.get((0, k), ((512, 1024, 1024),))[0]  # noqa: E731
    gu = (pick("gu_fwd"), pick("gu_dlhs"), pick("gu_drhs"))
    dn = (pick("down_fwd"), pick("down_dlhs"), pick("down_drhs"))
    plain = (512, 1024, 1024)
    base = dict(
        align=0, gu_tiles=gu, down_tiles=dn, fuse=False, cast_weights=True, rows_total=16384
    )
    return {
        "v_plain_vjp": dict(base, gu_tiles=plain, down_tiles=plain),
        "v_best_fast": dict(base, fast=True),
        "v_best_fast_fused": dict(base, fast=True, fuse=True),
    }


def main():
    which = sys.argv[1:] or ["qwen3", "mixtral"]
    if TINY:
        L.INTERPRET = True
        jax.config.update("jax_platforms", "cpu")
        global qwen3_tiles, mixtral_tiles
        qwen3_tiles = mixtral_tiles = lambda k, a: [(a or 32, 128, 128)]
        run_case("qwen3", [], [0, 32], qwen3_tiles, variants_for("qwen3", 2, 64, 8))
        return
    if "rows" in which:  # run 3: the DMA row kernels
        rows_micro("qwen3")
    if "qwen3-sweep" in which:  # run 1: every kernel's tiles, groups unpadded and padded
        run_case("qwen3", [], [0, 128, 256, 512], qwen3_tiles, variants_for("qwen3", 8, 8192, 128))
    if "qwen3" in which:  # run 2: modules, the permutation's pieces, the variants
        run_case("qwen3", ["q_pallas", "q_xla", "q_tc4"], [], qwen3_tiles, qwen3_variants)
    if "mixtral" in which:
        run_case(
            "mixtral", ["m_pallas", "m_xla", "m_fs2", "m_tc4"], [0], mixtral_tiles, mixtral_variants
        )
    print("peak bytes", jax.devices()[0].memory_stats().get("peak_bytes_in_use"))


if __name__ == "__main__":
    main()
