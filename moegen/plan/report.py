"""The text `moegen plan` prints."""

from __future__ import annotations

from moegen.kernels import kernel
from moegen.plan.model import Plan
from moegen.plan.params import PartitionSpec
from moegen.strategies import strategy

# Of the programs of `python -m bench.ledger --population 60 --seed 0` and `--seed 1`, the share
# whose planned peak is over 10% off the compiled one (tests/fit/test_ledger_population.py holds it
# to the records).
LEDGER_MISSES_PERCENT = 31


def format_plan(plan: Plan) -> str:
    """Human-readable plan for `moegen plan`."""
    c, mesh = plan.cost, plan.mesh
    axes = " x ".join(f"{name}={size}" for name, size in mesh.axes)
    lines = [
        f"{plan.spec_display} -> {plan.module_name}.py",
        f"  {plan.summary}",
        f"  mesh            {axes} ({mesh.num_devices} devices); batch over {mesh.batch_axes}"
        + ("; physical axes split (no whole ones fit)" if mesh.splits_physical_axes else ""),
        f"  input           [{plan.batch}, {plan.seq_len}, {plan.embed_dim}] {plan.compute_dtype}"
        f" -> per device [{plan.local_batch}, {plan.local_seq_len}, {plan.embed_dim}]",
        f"  tokens/device   {plan.local_tokens}; routed rows {plan.routed_rows} "
        f"(x top_{plan.router.top_k}, {_dropping_text(plan)})" + _padding_text(plan),
        f"  experts         {plan.num_experts} ({plan.local_experts} per device, "
        f"{plan.experts.strategy}); kernel {plan.kernel.name}; target {plan.hardware}"
        + (f" {plan.mesh.topology}" if plan.mesh.topology else ""),
        *_expert_lines(plan),
        "  parameters:",
    ]
    for p in plan.params:
        lines.append(
            f"    {p.name:<8} {list(p.shape)} {plan.param_dtype} "
            f"spec {_spec_text(p.partition)} -> per device {list(p.local_shape)}"
        )
    lines += [
        "  per device, forward:",
        f"    FLOPs          router {c.router_flops:.3e}, experts {c.expert_flops:.3e}, "
        + (f"shared expert {c.shared_expert_flops:.3e}, " if c.shared_expert_flops else "")
        + f"total {c.forward_flops:.3e} (train ~{c.train_flops:.3e})",
        f"    parameters     {_gib(c.param_bytes)} stored, "
        f"{_gib(c.gathered_weight_bytes)} gathered",
        f"    routed buffers {_gib(c.routed_buffer_bytes)}; activations {_gib(c.activation_bytes)}",
        f"    fsdp gather    {_gib(c.gather_bytes_received)} received",
    ]
    if plan.kernel.config is not None:
        lines += kernel(plan.kernel.name).report_lines(plan.kernel.config)
    lines += _network_lines(plan)
    lines += _roofline_lines(plan)
    lines += _step_time_lines(plan)
    m = plan.memory
    hbm = f" of {_gib(m.hbm_bytes_per_device)} HBM" if m.hbm_bytes_per_device else ""
    lines.append(
        f"  memory estimate forward {_gib(m.forward_peak)}, forward+backward "
        f"{_gib(m.train_peak)}{hbm} per device"
    )
    if m.hbm_bytes_per_device:  # what the figure is worth, where it decides a trade
        lines += [
            "    (an estimate of XLA's buffer assignment: on two generated populations of TPU "
            "layers it was over 10% off the compiled peak",
            f"     on about {LEDGER_MISSES_PERCENT}% of the programs; {_compilers_figure(plan)})",
        ]
    lines += [f"    {_gib(size):>12}  {name}" for name, size in m.ledger]
    lines += _ffn_slice_lines(plan)
    lines += _token_chunk_lines(plan)
    lines += _sliced_token_chunk_lines(plan)
    lines += _variant_lines(plan)
    return "\n".join(lines)


def _compilers_figure(plan: Plan) -> str:
    """Where the user finds the compiler's own figure: on a TPU slice, in seconds."""
    if plan.mesh.tpu_topology_name is not None:
        return "`moegen plan --assigned` reads the compiler's figure in seconds"
    return "`moegen plan --compile` shows the compiler's figure"


def _variant_lines(plan: Plan) -> list[str]:
    """shapes.variants: each variant's shape, what its own plan sizes, and its memory."""
    if not plan.variants:
        return []
    lines = [f"  shape variants  {len(plan.variants)}, the same parameters, each planned whole:"]
    for variant in plan.variants:
        v = variant.plan
        receive = (
            f"receive buffer {v.experts.receive_rows} rows"
            if v.experts.receive_rows
            else "no receive buffer"
        )
        lines += [
            f"    {variant.name:<12} x {list(variant.input_shape)} -> per device "
            f"[{v.local_batch}, {v.local_seq_len}, {v.embed_dim}], {variant.function}",
            f"    {'':<12} tokens/device {v.local_tokens}; routed rows {v.routed_rows} "
            f"({_dropping_text(v)}); {receive}",
            f"    {'':<12} memory estimate forward {_gib(v.memory.forward_peak)}, "
            f"forward+backward {_gib(v.memory.train_peak)} per device"
            + (f", FFN slices {v.ffn.chunks}" if v.ffn.chunks > 1 else "")
            + (f", token chunks {v.experts.token_chunks}" if v.experts.chunks_tokens else ""),
        ]
    return lines


def _ffn_slice_lines(plan: Plan) -> list[str]:
    """memory.ffn_chunks: what each slice count costs in memory and in recomputed FLOPs."""
    ffn = plan.ffn
    if len(ffn.chunk_options) < 2:
        return []
    chosen = f"{ffn.chunks} ({ffn.chunk_width} columns each"
    chosen += ", each slice's weights cast as it runs)" if ffn.casts_per_slice else ")"
    lines = [f"  FFN slices      {chosen}; memory.ffn_chunks options, forward+backward:"]
    for option in ffn.chunk_options:
        mark = "  <- this spec" if option.chunks == ffn.chunks else ""
        lines.append(
            f"    {option.chunks:>3} slices  peak {_gib(option.train_peak):>10}  "
            f"recomputed FLOPs {option.recompute_flops:.3e}{mark}"
        )
    if ffn.whole_forward:
        lines.append(
            "    forward pass   whole, as with 1 slice (in slices, their float32 sum would hold "
            "more); the backward pass slice by slice"
        )
    return lines


def _token_chunk_lines(plan: Plan) -> list[str]:
    """memory.token_chunks: each chunk count's planned peaks, training FLOPs and step time."""
    options = plan.chunk_candidates.token_chunks
    if len(options) < 2:
        return []
    chosen = plan.experts.token_chunks
    lines = [
        f"  token chunks    {chosen} ({plan.experts.call_tokens} tokens each); "
        "memory.token_chunks options, forward / forward+backward peak, training FLOPs, "
        "forward+backward time:"
    ]
    for option in options:
        mark = "  <- this spec" if option.chunks == chosen else ""
        slices = f", {option.ffn_chunks} FFN slices" if option.ffn_chunks > 1 else ""
        time = f"  step ~{_ms(option.train_s)}" if option.train_s else ""
        lines.append(
            f"    {option.chunks:>3} chunks  peak {_gib(option.forward_peak):>10} / "
            f"{_gib(option.train_peak):>10}  FLOPs {option.train_flops:.3e}{time}{slices}{mark}"
        )
    return lines


def _sliced_token_chunk_lines(plan: Plan) -> list[str]:
    """memory.token_chunks with memory.ffn_chunks: a grid of planned forward+backward peaks
    (chunk counts down, slice counts across), then the FLOPs and what the chunks cost in
    communication (each chunk gathers every slice's weights under fsdp)."""
    options = plan.chunk_candidates.sliced_token_chunks
    if not options:
        return []
    slices = sorted({o.ffn_chunks for o in options})
    chunks = sorted({o.chunks for o in options})
    peaks = {(o.chunks, o.ffn_chunks): o.train_peak for o in options}
    lines = [
        "  token chunks with FFN slices (both set: each chunk runs the FFN slice by slice), "
        "forward+backward peak:",
        "    " + " " * 10 + "".join(f"{f'{s} slices':>12}" for s in slices),
    ]
    for count in chunks:
        cells = "".join(f"{_gib(peaks[count, s]):>12}" for s in slices)
        lines.append(f"    {f'{count} chunks':>10}{cells}")
    flops = sorted({o.train_flops for o in options})
    ici = {o.chunks: o.ici_bytes for o in options}
    lines.append(
        f"    training FLOPs {flops[0]:.3e}"
        + (f" to {flops[-1]:.3e}" if len(flops) > 1 else "")
        + "; ICI forward+backward: "
        + ", ".join(f"{count} chunks {_gib(ici[count])}" for count in chunks)
    )
    return lines


def _dropping_text(plan: Plan) -> str:
    router = plan.router
    if router.capacity is None:
        return "dropless"
    per = " of each sequence" if router.capacity_per_sequence else ""
    return f"at most {router.capacity} per expert{per} kept, drop by {router.drop_policy}"


def _padding_text(plan: Plan) -> str:
    rows = plan.experts.ffn_rows
    padding = plan.kernel.row_padding
    if padding and padding.padded_rows > rows:
        return (
            f"; grouped-matmul calls of {rows} rows padded to {padding.padded_rows} "
            f"(a multiple of {padding.row_alignment}: whole row tiles)"
        )
    if padding and padding.row_alignment > 1:
        return f"; grouped-matmul calls of {rows} rows, already whole row tiles"
    return f"; grouped-matmul calls of {rows} rows, no padding (groups of any size)"


def _expert_lines(plan: Plan) -> list[str]:
    experts = plan.experts
    if not strategy(experts.strategy).shards_experts:
        return []
    calls = f" x {experts.ffn_calls} ring steps" if experts.ffn_calls > 1 else ""
    capacity = plan.experts.capacity
    bound = "dropless" if capacity is None else f"capacity {capacity} per expert"
    lines = [f"  expert FFN rows {experts.ffn_rows}{calls} per device, worst case ({bound})"]
    if experts.receive_rows:
        why = (
            "every token of the expert group sending min(top_k, local experts) copies here"
            if capacity is None
            else "the lesser of every group token sending min(top_k, local experts) copies "
            "here and every device sending each local expert its capacity"
        )
        lines.append(f"  receive buffer  {experts.receive_rows} rows: {why}; no per-expert padding")
    if experts.overlap_chunks > 1:
        lines.append(
            f"  overlap         {experts.overlap_chunks} chunks of {experts.chunk_width} columns "
            "(ring of ppermute steps, transfer of the next block under the grouped matmul)"
        )
    for name, size in experts.communication_bytes:
        chosen = " (chosen)" if name == experts.strategy else ""
        lines.append(f"  comm forward    {name:<18} {_gib(size)} per device{chosen}")
    return lines + _replica_lines(plan)


def _replica_lines(plan: Plan) -> list[str]:
    replicas = plan.experts.replicas
    if not replicas.active:
        return []
    held = "; ".join(
        f"device {device}: "
        + ", ".join(
            f"{e} ({u}/{replicas.share_units})" for e, u in zip(experts, units, strict=True)
        )
        for device, (experts, units) in enumerate(
            zip(replicas.experts, replicas.shares, strict=True)
        )
    )
    return [
        f"  redundant       {replicas.extra_per_device} extra slot(s) per device, "
        f"{replicas.slots} slots; replicas (expert (its share of the copies)): {held}",
        f"  replica weights {_gib(replicas.moved_bytes)} received per device per step "
        f"({len(replicas.rounds)} ppermute rounds), the same sent back as gradients; "
        f"{_gib(2 * replicas.moved_bytes)} more memory (weights and their gradients)",
    ]


def _network_lines(plan: Plan) -> list[str]:
    net = plan.network
    if not net.transfers:
        return []
    total = net.ici_bytes + net.dcn_bytes
    share = f" ({100 * net.dcn_bytes / total:.1f}% over DCN)" if net.slices > 1 else ""
    lines = [
        f"  communication per device, forward+backward: ICI {_gib(net.ici_bytes)}, "
        f"DCN {_gib(net.dcn_bytes)}{share}"
    ]
    if net.slices > 1:
        lines.append(
            f"    {net.slices} slices: in-slice mesh {list(net.ici_mesh_shape)}, "
            f"across slices {list(net.dcn_mesh_shape)}"
        )
    for t in net.transfers:
        lines.append(
            f"    {t.name:<42} {t.axis:<7} ICI {_gib(t.ici_bytes):>12}  DCN {_gib(t.dcn_bytes):>12}"
        )
    return lines


def _step_time_lines(plan: Plan) -> list[str]:
    """The routed path's estimated time as run, and what the trade costs over the layer whole."""
    step, whole = plan.roofline.step, plan.roofline.whole_step
    if not step.train_s:
        return []
    traded = plan.experts.token_chunks > 1 or plan.ffn.chunks > 1
    multiple = f" ({step.train_s / whole.train_s:.2f}x the layer whole)" if traded else ""
    return [
        f"  step time (estimate, moegen.plan.step_time): forward {_ms(step.forward_s)}, "
        f"forward+backward {_ms(step.train_s)}{multiple}"
    ]


def _roofline_lines(plan: Plan) -> list[str]:
    r = plan.roofline
    head = "  roofline per device"
    if r.peak_flops_per_s:
        head += (
            f" ({plan.hardware}: {r.peak_flops_per_s / 1e12:.0f} TFLOP/s, HBM "
            f"{r.hbm_bytes_per_s / 1e9:.0f} GB/s, ICI {r.ici_bytes_per_s / 1e9:.0f} GB/s"
            + (f", DCN {r.dcn_bytes_per_s / 1e9:.2f} GB/s" if plan.mesh.slices > 1 else "")
            + "):"
        )
    else:
        head += " (no peak figures for cpu: counts only):"
    lines = [head]
    for p in r.passes:
        waste = (p.kernel_flops - p.useful_flops) / p.useful_flops if p.useful_flops else 0.0
        lines.append(
            f"    {p.name:<17} FLOPs useful {p.useful_flops:.3e} (router {p.router_flops:.2e}, "
            f"routed {p.routed_flops:.2e}, shared {p.shared_flops:.2e}); kernels run "
            f"{p.kernel_flops:.3e} (+{100 * waste:.0f}% on worst-case buffers)"
        )
        lines.append(
            f"    {'':<17} HBM {_gib(p.hbm_bytes)}, ICI {_gib(p.ici_bytes)}, "
            f"DCN {_gib(p.dcn_bytes)}"
        )
        if r.peak_flops_per_s:
            lines.append(
                f"    {'':<17} lower bounds: compute {_ms(p.compute_s)}, HBM {_ms(p.hbm_s)}, "
                f"ICI {_ms(p.ici_s)}, DCN {_ms(p.dcn_s)}; exposed communication "
                f"{_ms(p.exposed_comm_s)}; layer >= {_ms(p.bound_s)} ({p.bound_by}-bound)"
            )
    return lines


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _spec_text(partition: PartitionSpec) -> str:
    return "P(" + ", ".join(repr(entry) for entry in partition) + ")"


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
