"""Handwritten scheduled HLO (a module around a body, its instructions) for the tests of `moegen.verify.hlo.counters`."""

from __future__ import annotations

HEADER = "HloModule jit_f, is_scheduled=true, entry_computation_layout={(bf16[8,128]{1,0})->bf16[8,128]{1,0}}"

FUSED = """\
%fused_dot (p0: bf16[8,128], p1: bf16[128,128]) -> bf16[8,128] {
  %p0 = bf16[8,128]{1,0} parameter(0)
  %p1 = bf16[128,128]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[8,128]{1,0:T(8,128)(2,1)} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%fused_add (q0: bf16[8,128]) -> bf16[8,128] {
  %q0 = bf16[8,128]{1,0} parameter(0)
  ROOT %add.1 = bf16[8,128]{1,0} add(%q0, %q0)
}

%wrapped_all_to_all (w0: bf16[8,128]) -> bf16[8,128] {
  %w0 = bf16[8,128]{1,0} parameter(0)
  ROOT %all-to-all.9 = bf16[8,128]{1,0} all-to-all(%w0), channel_id=3, replica_groups={{0,1}}, dimensions={0}
}

%collective_fusion_body (c0: bf16[4,128]) -> bf16[8,128] {
  %c0 = bf16[4,128]{1,0} parameter(0)
  ROOT %all-gather.9 = bf16[8,128]{1,0} all-gather(%c0), channel_id=4, replica_groups={{0,1}}, dimensions={0}
}

%acf_start (s0: bf16[4,128]) -> (bf16[4,128], bf16[8,128], u32[]) {
  %s0 = bf16[4,128]{1,0} parameter(0)
  %all-gather.10 = bf16[8,128]{1,0} all-gather(%s0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %custom-call.10 = (bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) custom-call(%all-gather.10), custom_call_target="AsyncCollectiveStart"
}

%acf_step (k0: bf16[4,128], k1: bf16[8,128], k2: u32[], k3: bf16[8,128], k4: bf16[128,128]) -> (bf16[8,128], bf16[4,128], bf16[8,128], u32[]) {
  %k0 = bf16[4,128]{1,0} parameter(0)
  %k1 = bf16[8,128]{1,0} parameter(1)
  %k2 = u32[] parameter(2)
  %k3 = bf16[8,128]{1,0} parameter(3)
  %k4 = bf16[128,128]{1,0} parameter(4)
  %all-gather.11 = bf16[8,128]{1,0} all-gather(%k0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  %convolution.11 = bf16[8,128]{1,0} convolution(%k3, %k4), dim_labels=bf_io->bf
  ROOT %tuple.11 = (bf16[8,128]{1,0}, bf16[4,128]{1,0}, bf16[8,128]{1,0}, u32[]) tuple(%convolution.11, %k0, %all-gather.11, %k2)
}

%acf_done (d0: bf16[4,128], d1: bf16[8,128], d2: u32[]) -> bf16[8,128] {
  %d0 = bf16[4,128]{1,0} parameter(0)
  %d1 = bf16[8,128]{1,0} parameter(1)
  %d2 = u32[] parameter(2)
  %all-gather.12 = bf16[8,128]{1,0} all-gather(%d0), channel_id=6, replica_groups={{0,1}}, dimensions={0}, frontend_attributes={chain_id="0"}
  ROOT %custom-call.12 = bf16[8,128]{1,0} custom-call(%d0, %d1, %all-gather.12, %d2), custom_call_target="AsyncCollectiveDone"
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.2 = f32[] add(%a, %b)
}

%loop_body (lp: (s32[], bf16[8,128])) -> (s32[], bf16[8,128]) {
  %lp = (s32[], bf16[8,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%lp), index=0
  %v = bf16[8,128]{1,0} get-tuple-element(%lp), index=1
  %collective-permute-start.7 = (bf16[8,128]{1,0}, bf16[8,128]{1,0}, u32[], u32[]) collective-permute-start(%v), channel_id=5, source_target_pairs={{0,1},{1,0}}
  %fusion.7 = bf16[8,128]{1,0} fusion(%v), kind=kLoop, calls=%fused_add
  %collective-permute-done.7 = bf16[8,128]{1,0} collective-permute-done(%collective-permute-start.7)
  ROOT %t = (s32[], bf16[8,128]{1,0}) tuple(%i, %collective-permute-done.7)
}

%loop_cond (cp: (s32[], bf16[8,128])) -> pred[] {
  %cp = (s32[], bf16[8,128]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %limit = s32[] constant(4)
  ROOT %lt = pred[] compare(%ci, %limit), direction=LT
}
"""


def module(*body: str) -> str:
    lines = [
        HEADER,
        "",
        FUSED,
        "ENTRY %main (param: bf16[8,128], w: bf16[128,128]) -> bf16[8,128] {",
        "  %param = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)",
        "  %w = bf16[128,128]{1,0:T(8,128)(2,1)} parameter(1)",
        *(f"  {line}" for line in body),
        "}",
        "",
    ]
    return "\n".join(lines)


AG_START = (
    "%all-gather-start.1 = (bf16[4,128]{1,0:T(8,128)(2,1)S(1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) "
    "all-gather-start(%param), channel_id=1, replica_groups={{0,1}}, dimensions={0}, "
    'backend_config={"flag_configs":[]}'
)
AG_DONE = "%all-gather-done.1 = bf16[8,128]{1,0:T(8,128)(2,1)} all-gather-done(%all-gather-start.1)"
DOT_FUSION = "%fusion.1 = bf16[8,128]{1,0} fusion(%param, %w), kind=kOutput, calls=%fused_dot"
ADD_FUSION = "%fusion.2 = bf16[8,128]{1,0} fusion(%param), kind=kLoop, calls=%fused_add"
GMM = (
    '%gmm.1 = bf16[8,128]{1,0} custom-call(%param, %w), custom_call_target="tpu_custom_call", '
    'metadata={op_name="jit(f)/jit(gmm)/pallas_call"}'
)
ALLOCATE = (
    '%custom-call.3 = u32[4]{0:T(128)S(1)} custom-call(), custom_call_target="AllocateBuffer"'
)


def only(counters: dict) -> dict:
    assert len(counters["items"]) == 1, counters["items"]
    return counters["items"][0]
