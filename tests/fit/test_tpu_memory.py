"""The TPU target's HBM verdict: the compiler's per-device memory against the slice, a spec too large for its slice refused, and memory_verdict's figures and advice."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import REPO_ROOT, assert_no_traceback, run_moegen, snapshot
from tpu_cases import FLOAT32_STEP, pallas_yaml, write_spec

from moegen.fit import TAKE_OFFER
from moegen.hardware import GIB
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.plan.model import TokenChunkOption
from moegen.verify import VerifyError, VerifyReport, memory_verdict, peak_bytes


def test_spec_the_plan_says_cannot_fit_is_refused_before_any_compile(tmp_path):
    """64 experts of 4096 x 8192 on a v5e 2x2 with the FFN whole: the plan needs 28.4 GiB of
    16, more than the ledger's error over HBM, so `moegen build` refuses it, located at
    memory.ffn_chunks, before any twin or compile (moegen.fit.refusal; it used to spend the twin
    and a forward compile before the compiler said so). Left to the plan, the FFN runs in
    slices and it fits. The compiler's own verdict is covered below, on reports."""
    name = "too_big_v5e"
    text = pallas_yaml(
        num_experts=64,
        embed_dim=4096,
        ffn_dim=8192,
        batch=4,
        seq_len=2048,
        axes={"fsdp": 4},
        dtypes=("float32", "bfloat16"),
    )
    write_spec(tmp_path, name, text + "memory:\n  ffn_chunks: 1\n")
    (tmp_path / "generated").mkdir()
    before = snapshot(tmp_path)
    plan = make_plan(load_valid(tmp_path / "specs" / f"{name}.yaml"))
    assert plan.memory.train_peak > 1.10 * plan.memory.hbm_bytes_per_device

    result = run_moegen("build", f"specs/{name}.yaml", cwd=tmp_path)
    err = result.stderr
    assert result.returncode == 3, result.stdout + err
    assert result.stdout == ""
    assert_no_traceback(result.stdout + err)
    assert snapshot(tmp_path) == before  # nothing written, generated/ still empty
    assert "verify:" not in err and "wrote" not in err
    assert f"specs/{name}.yaml:" in err and ": memory.ffn_chunks: the plan needs 28.35 GiB" in err
    assert "16.00 GiB HBM of tpu-v5e" in err
    assert "Would fit: memory.ffn_chunks 16 (" in err  # 2, 4 and 8 slices plan over HBM


def _mem(argument: float, output: float, temp: float, alias: float = 0.0) -> dict[str, int]:
    """A compiled step's memory figures, given in GiB; generated code is never counted."""
    figures = {"argument": argument, "output": output, "temp": temp, "alias": alias}
    return {k: int(v * GIB) for k, v in figures.items()} | {"generated_code": 7 * GIB}


def _report(*steps: dict) -> VerifyReport:
    return VerifyReport(
        steps=[
            {"step": "import", "seconds": 0.1},
            {"step": FLOAT32_STEP, "seconds": 1.0, "cases": []},
            *({"seconds": 1.0} | step for step in steps),
        ]
    )


@pytest.fixture
def v5e_plan(tmp_path):
    plan = make_plan(load_valid(write_spec(tmp_path, "verdict_v5e", pallas_yaml())))
    assert (plan.hardware, plan.mesh.topology) == ("tpu-v5e", "2x2")
    assert plan.memory.hbm_bytes_per_device == 16 * GIB
    return plan


def test_peak_bytes_is_arguments_outputs_temporaries_less_aliases():
    memory = {"argument": 100, "output": 20, "temp": 300, "alias": 15, "generated_code": 10**9}
    assert peak_bytes(memory) == 100 + 20 + 300 - 15


def test_memory_verdict_fits(v5e_plan):
    verdict = memory_verdict(
        v5e_plan,
        _report(
            {"step": "compile forward", "memory": _mem(1, 0.5, 2, 0.25), "flops": 1.0},
            # exactly the HBM: fits; and aliased outputs are not counted twice (18 - 2 = 16)
            {"step": "compile forward+backward", "memory": _mem(8, 8, 2, 2), "flops": 1.0},
        ),
    )
    assert verdict is not None and verdict.startswith("fits: "), verdict
    assert "forward 3.25 GiB, forward+backward 16.00 GiB of 16.00 GiB HBM per device" in verdict
    m = v5e_plan.memory
    assert (
        f"(plan estimate: forward {m.forward_peak / 2**30:.2f}, "
        f"forward+backward {m.train_peak / 2**30:.2f} GiB)" in verdict
    )


def test_memory_verdict_one_byte_over_fails(v5e_plan):
    over = _mem(8, 8, 0) | {"temp": 1}
    assert peak_bytes(over) == 16 * GIB + 1
    with pytest.raises(VerifyError, match="forward\\+backward does not fit tpu-v5e 2x2"):
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(1, 1, 1)},
                {"step": "compile forward+backward", "memory": over},
            ),
        )


def test_memory_verdict_too_large_names_figures_buffers_and_advice(v5e_plan):
    with pytest.raises(VerifyError) as caught:
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(6, 0.5, 11, 0.5)},  # 17 GiB
                {"step": "compile forward+backward", "memory": _mem(1, 1, 1)},
            ),
        )
    message = str(caught.value)
    assert message.startswith(
        "forward does not fit tpu-v5e 2x2: 17.00 GiB per device "
        "(arguments 6.00, outputs 0.50, temporaries 11.00) > 16.00 GiB HBM.\n"
    ), message
    assert "largest buffers by the plan: " in message
    for item, size in v5e_plan.memory.ledger[:4]:
        assert f"{item} {size / 2**30:.2f} GiB" in message
    assert "To fit: " in message and "larger fsdp axis" in message


def test_memory_verdict_reports_the_compilers_out_of_memory(v5e_plan):
    oom = (
        "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total "
        "memory required for HLO temporaries (24.16G) exceeds available HBM (15.75G)."
    )
    with pytest.raises(VerifyError) as caught:
        memory_verdict(
            v5e_plan,
            _report(
                {"step": "compile forward", "memory": _mem(1, 1, 1)},
                {"step": "compile forward+backward", "oom": oom},
            ),
        )
    message = str(caught.value)
    assert message.startswith(
        f"forward+backward does not fit tpu-v5e 2x2; the TPU compiler says:\n  {oom}\n"
        f"The plan estimated forward {v5e_plan.memory.forward_peak / GIB:.2f}, "
        f"forward+backward {v5e_plan.memory.train_peak / GIB:.2f} GiB per device; "
        "largest buffers by the plan: "
    ), message
    assert "To fit: " in message
    assert "Next candidates" not in message  # this small layer has no token chunk below it


def test_an_hbm_out_of_memory_offers_the_plans_next_candidates(v5e_plan):
    """The plan's token chunk counts planned lower than the layer, two at most, come first:
    they change no shape."""
    peak = v5e_plan.memory.train_peak
    lower = [TokenChunkOption(c, 1, peak // 8, peak // c, 0, 0) for c in (2, 4, 8)]
    candidates = replace(v5e_plan.chunk_candidates, token_chunks=tuple(lower))
    plan = replace(v5e_plan, chunk_candidates=candidates)
    oom = "RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM."
    with pytest.raises(VerifyError) as caught:
        memory_verdict(plan, _report({"step": "compile forward+backward", "oom": oom}))
    two, four = (f"memory.token_chunks: {c} ({peak // c / GIB:.2f} GiB planned)" for c in (2, 4))
    assert f"Next candidates of the plan: {two} or {four}; or set memory.token_chunks: auto" in (
        str(caught.value)
    )
    assert f"writes the fastest that fits into the spec.\n{TAKE_OFFER}\nTo fit: " in str(
        caught.value
    )


def test_memory_verdict_uses_the_slices_hbm(v5e_plan):
    """The same figures judged against another HBM size (as for another generation)."""
    report = _report(
        {"step": "compile forward", "memory": _mem(10, 1, 10)},
        {"step": "compile forward+backward", "memory": _mem(10, 10, 10)},
    )
    with pytest.raises(VerifyError):
        memory_verdict(v5e_plan, report)
    roomy = replace(v5e_plan, memory=replace(v5e_plan.memory, hbm_bytes_per_device=32 * GIB))
    assert memory_verdict(roomy, report).endswith(
        "forward 21.00 GiB, forward+backward 30.00 GiB of 32.00 GiB HBM per device"
        f" (plan estimate: forward {v5e_plan.memory.forward_peak / 2**30:.2f}, "
        f"forward+backward {v5e_plan.memory.train_peak / 2**30:.2f} GiB)"
    )


def test_memory_verdict_is_none_on_cpu():
    plan = make_plan(load_valid(REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"))
    assert plan.memory.hbm_bytes_per_device == 0
    report = _report({"step": "compile forward", "memory": _mem(1000, 1000, 1000)})
    assert memory_verdict(plan, report) is None
