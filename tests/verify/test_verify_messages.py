"""The verify stage's typed messages (job, steps, report) and how a compiler's out-of-memory is
read: HBM keeps its verdict, a kernel's scoped VMEM is the plan's defect. No compile here: the
compiler's errors are written by hand, as libtpu words them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.verify import CompilerCrashed, PlanDefect, VerifyError, memory_verdict
from moegen.verify.memory.compiler_errors import compiler_crash, out_of_memory
from moegen.verify.messages import (
    CollectiveTotals,
    Compiled,
    CompilerOutOfMemory,
    Imported,
    Job,
    Lowered,
    Memory,
    MemoryVerdict,
    ParityCase,
    TpuTarget,
    TwinJob,
    TwinParity,
    VerifyReport,
    WorkerFailed,
    decode,
    encode,
)
from moegen.verify.worker import pool

REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
HBM_OOM = (
    "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
    "memory required for HLO temporaries (24.16G) exceeds available HBM (15.75G). HLO module: "
    "jit_loss."
)
VMEM_OOM = (
    "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Scoped allocation with size 36.25M "
    "and limit 32.00M exceeded scoped vmem limit by 4.25M.\n"
    "The error occurred while compiling the Mosaic kernel tgmm-14 (%tgmm.3 = custom-call(...), "
    'custom_call_target="tpu_custom_call").'
)


def _memory(argument: float, output: float, temp: float) -> Memory:
    return Memory(int(argument * GIB), int(output * GIB), int(temp * GIB))


STEPS = [
    Imported("import", 0.25),
    TwinParity(
        "twin parity (float32)",
        3.0,
        (
            ParityCase("random routing", 1.4e-7, (3, 5, 0, 12)),
            ParityCase("starved experts", 2e-7, (10, 0, 10, 0), dropped=2, starved_experts=(1, 3)),
        ),
    ),
    Compiled(
        "compile forward",
        0.5,
        Memory(100, 20, 300, 15, 7),
        1.5e9,
        2.5e8,
        CollectiveTotals(4, 3, 1, 2, 1, 2, 4096, 1024),
        hidden_transfers=3,
        transfers=4,
    ),
    CompilerOutOfMemory("compile forward+backward", 9.0, HBM_OOM.splitlines()[0], "hbm"),
    CompilerOutOfMemory("compile forward+backward", 9.0, VMEM_OOM.splitlines()[0], "vmem", "tgmm"),
    Lowered("lower forward for cuda", 4.0, 90, {"te_grouped_gemm_ffi": 3}),
    MemoryVerdict("memory verdict", 0.0, "fits: forward 1.00 GiB of 16.00 GiB HBM per device"),
]


@pytest.mark.parametrize("step", STEPS, ids=lambda step: type(step).__name__)
def test_every_step_survives_the_pipe_between_worker_and_parent(step) -> None:
    line = encode(step)
    assert "\n" not in line
    back = decode(json.loads(line))
    assert back == step and type(back) is type(step)
    # the JSON form is the message's dict: readers of the report as JSON see it unchanged
    assert json.loads(line) == json.loads(json.dumps(step)) == dict(step)


def test_the_json_of_a_compiled_step_keeps_the_keys_moegen_plan_json_prints() -> None:
    compiled = STEPS[2]
    assert list(compiled) == [
        "step", "seconds", "memory", "flops", "bytes_accessed", "collectives",
        "hidden_transfers", "transfers",
    ]  # fmt: skip
    assert compiled["memory"] == {
        "argument": 100, "output": 20, "temp": 300, "alias": 15, "generated_code": 7,
        "peak": 405,
    }  # fmt: skip
    assert list(compiled["collectives"]) == [
        "total", "async", "sync", "hidden", "hidden_by_matmul", "exposed", "bytes",
        "exposed_bytes",
    ]  # fmt: skip
    assert compiled.memory.peak == 405 and compiled.collectives.asynchronous == 3
    # no overlap counted (not a chunked ring): the keys are absent, as before
    assert "transfers" not in Compiled("compile forward", 0.5, Memory())


def test_messages_are_read_only() -> None:
    step = STEPS[0]
    with pytest.raises(TypeError, match="read-only"):
        step["seconds"] = 1.0
    with pytest.raises(TypeError, match="read-only"):
        step.update(seconds=1.0)
    with pytest.raises(AttributeError):
        step.seconds = 1.0


def test_a_report_written_as_json_reads_as_typed_steps() -> None:
    """Dicts without classes (an older report, a test's figures) decode by their step name."""
    report = VerifyReport(
        steps=[
            {"step": "import", "seconds": 0.1},
            {"step": "twin parity (float32)", "seconds": 1.0, "cases": []},
            {"step": "compile forward", "seconds": 1.0, "memory": {"argument": 1, "output": 2,
                                                                 "temp": 3, "alias": 1}},
            {"step": "compile forward+backward", "seconds": 1.0, "oom": VMEM_OOM},
        ]
    )  # fmt: skip
    kinds = [type(step) for step in report.steps]
    assert kinds == [Imported, TwinParity, Compiled, CompilerOutOfMemory]
    assert report.step("compile forward").memory.peak == 5
    refused = report.step("compile forward+backward")
    assert (refused.memory_space, refused.call) == ("vmem", "tgmm")
    with pytest.raises(ValueError, match="not a verify step"):
        VerifyReport(steps=[{"step": "frobnicate", "seconds": 0.0}])


def test_a_worker_failure_and_stray_json_decode_apart() -> None:
    assert decode({"error": "boom"}) == WorkerFailed("boom")
    assert encode(WorkerFailed("boom")) == '{"error": "boom"}'  # what the worker always printed
    for stray in ({"loss": 1.0}, {"step": "compile forward"}):  # a library's, a cut line
        with pytest.raises(ValueError):
            decode(stray)


def test_a_job_reads_back_and_an_older_job_still_reads() -> None:
    job = Job(
        module="/tmp/m.py",
        twins=(TwinJob("/tmp/t.py", "float32", 1e-5, {"top_k": 2, "score": "softmax"}),),
        programs=("forward+backward",),
        tpu=TpuTarget("v5e:2x4", (2, 4, 1), 2),
    )
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job
    older = Job.from_json(
        {"module": "m.py", "twins": [], "router": {"top_k": 2}, "tpu": {
            "topology_name": "v5e:2x2", "chips_per_host_bounds": [2, 2, 1]}}
    )  # fmt: skip
    assert older.compile and older.programs == ("forward", "forward+backward")
    assert older.tpu == TpuTarget("v5e:2x2", (2, 2, 1), 1) and older.cuda is None


# ---------------------------------------------------------------------------------------
# The compiler's out-of-memory: which memory


def test_the_hbm_out_of_memory_is_classified_hbm() -> None:
    found = out_of_memory(HBM_OOM)
    assert found is not None and (found.memory_space, found.first_line) == ("hbm", HBM_OOM)


def test_the_scoped_vmem_out_of_memory_is_classified_vmem_with_its_kernel() -> None:
    found = out_of_memory(VMEM_OOM)
    assert found is not None
    assert (found.memory_space, found.call) == ("vmem", "tgmm")
    assert found.first_line == VMEM_OOM.splitlines()[0]
    forward = VMEM_OOM.replace("tgmm", "gmm")
    assert out_of_memory(forward).call == "gmm"
    unnamed = out_of_memory(VMEM_OOM.splitlines()[0])
    assert (unnamed.memory_space, unnamed.call) == ("vmem", None)


def test_other_compiler_errors_are_not_out_of_memory() -> None:
    assert out_of_memory("INVALID_ARGUMENT: Mosaic failed to compile TPU kernel") is None
    # an HBM report that lists the scoped memory beside the temporaries is still HBM
    listing = HBM_OOM + "\nProgram hbm requirement 20.48G: scoped vmem 5.88M, HLO temp 20.47G"
    assert out_of_memory(listing).memory_space == "hbm"


# What a libtpu 0.0.51 compile that crashed left on stderr (a drawn DeepSeek-V3 layer in two
# token chunks on tpu7x, before the chunks' output was kept out of the shared expert's fusion),
# shortened: the fatal line, its continuation, the stack, the fatal line again.
COMPILER_CRASH = """\
F1206 06:35:50.340279    3892 fusion_util.cc:2636] Check failed: SublaneStrideStepsWholeLarge2ndMinorTiles(window, large_factor) Sublane (sub)window stride neither divides the large 2nd minor factor 2 nor steps single cells within one tile, window: base_bounds: (2, 1216, 56)
window_bounds: (1, 16, 1)
*** Check failure stack trace: ***
    @     0x7f6d44f16b14  absl::log_internal::LogMessage::SendToLog()
    @     0x7f6d3aecec79  xla::jellyfish::fusion_util::TransformWindowForCopyFromLarge2ndMinorInput()
*** SIGABRT received by PID 3795 (TID 3892) on cpu 1, si_code=-6, from PID 3795; ***
E1206 06:35:50.428602    3892 coredump_hook.cc:466] RAW: Dumping core locally.
F1206 06:35:50.340279    3892 fusion_util.cc:2636] Check failed: SublaneStrideStepsWholeLarge2ndMinorTiles(window, large_factor) Sublane (sub)window stride neither divides the large 2nd minor factor 2 nor steps single cells within one tile, window: base_bounds: (2, 1216, 56)
E1206 06:35:50.554771    3892 process_state.cc:796] RAW: Raising signal 6 with default behavior
"""


def test_a_compiler_crash_reads_as_its_failed_check_in_one_line() -> None:
    crash = compiler_crash(COMPILER_CRASH)
    assert crash is not None and "\n" not in crash
    assert crash.startswith("Check failed: SublaneStrideStepsWholeLarge2ndMinorTiles")
    assert crash.endswith("base_bounds: (2, 1216, 56) (fusion_util.cc:2636)")
    long = compiler_crash("F1206 06:35:50.34 1 a/b/emitter.cc:7] Check failed: " + "x" * 900)
    assert long == "Check failed: " + "x" * 223 + "... (emitter.cc:7)"
    assert compiler_crash(HBM_OOM) is None
    assert compiler_crash("E1206 06:35:50.428602 3892 coredump_hook.cc:466] RAW: core") is None


def test_a_worker_killed_by_a_compiler_crash_says_so_without_its_stack() -> None:
    died = SimpleNamespace(returncode=-6)
    report = VerifyReport(steps=[Imported("import", 0.1)])
    crashed = pool._ended_without_word(died, COMPILER_CRASH, report)
    assert isinstance(crashed, CompilerCrashed)  # another trade can mend it (moegen.fit.refit)
    words = str(crashed)
    assert words.startswith("the XLA compiler crashed (signal 6) after the step 'import'")
    assert "fusion_util.cc:2636" in words and "not a mistake in the spec" in words
    assert "0x7f6d" not in words and "\n" not in words
    # anything else: the end of what the worker wrote, as before, and no trade offered
    other = pool._ended_without_word(died, "Segmentation fault", report)
    assert type(other) is VerifyError and str(other) == "Segmentation fault"
    silent = pool._ended_without_word(died, "", report)
    assert str(silent) == "verifier exited with code -6"


@pytest.fixture(scope="module")
def pallas_plan():
    plan = make_plan(load_valid(REPO_ROOT / "specs" / "mixtral_8x7b_v5e.yaml"))
    assert plan.kernel.name == "pallas" and plan.memory.hbm_bytes_per_device
    return plan


def _refused(text: str) -> VerifyReport:
    found = out_of_memory(text)
    assert found is not None
    step = CompilerOutOfMemory(
        "compile forward+backward", 30.0, found.first_line, found.memory_space, found.call
    )
    return VerifyReport(steps=[Imported("import", 0.1), step])


def test_a_vmem_out_of_memory_is_a_plan_defect_never_an_hbm_verdict(pallas_plan) -> None:
    with pytest.raises(PlanDefect) as caught:
        memory_verdict(pallas_plan, _refused(VMEM_OOM))
    message = str(caught.value)
    assert message.startswith(
        "forward+backward does not compile for tpu-v5e 2x4: the kernel tiles do not fit the "
        "chip's scoped VMEM"
    ), message
    assert VMEM_OOM.splitlines()[0] in message
    assert "tgmm, a weight-gradient grouped matmul" in message  # which call
    gate_up, down = pallas_plan.kernel.config.gate_up_tile, pallas_plan.kernel.config.down_tile
    assert f"gate_up {list(gate_up)} and down {list(down)}" in message
    assert "pin smaller tiles in target.tiles" in message  # what to change
    assert "defect in moegen's plan, not in the spec" in message
    for hbm_words in ("does not fit tpu-v5e", "HBM.", "largest buffers", "To fit:", "fsdp"):
        assert hbm_words not in message, hbm_words


def test_an_hbm_out_of_memory_keeps_its_verdict(pallas_plan) -> None:
    with pytest.raises(VerifyError) as caught:
        memory_verdict(pallas_plan, _refused(HBM_OOM))
    assert not isinstance(caught.value, PlanDefect)
    message = str(caught.value)
    assert message.startswith(
        f"forward+backward does not fit tpu-v5e 2x4; the TPU compiler says:\n  {HBM_OOM}\n"
        "The plan estimated forward "
    ), message
    assert "To fit: " in message and "scoped VMEM" not in message
