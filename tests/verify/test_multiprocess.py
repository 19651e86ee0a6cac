"""A generated module under JAX's multi-controller runtime: several processes on loopback,
each with its own fake CPU devices, joined by jax.distributed (CPU collectives over gloo).

Each process places only its own shards (parameters with make_array_from_callback, x with the
module's input_from_process_data), runs the forward and the gradients over the global mesh,
and checks them, gathered, against the dense reference. Bounded in time; processes are killed
whatever happens.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from moegen.load import load_spec
from moegen.plan import make_plan
from moegen.render import render
from moegen.validate import validate
from moegen.verify import reference_config
from moegen.verify.twin import twin_of

PROCESS_SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess" / "run_process.py"
TIMEOUT_S = 300

# spec -> processes (the twin keeps the spec's mesh: its devices are split evenly among them)
CASES = {
    "mixtral_small_cpu": 2,  # data 2 x fsdp 4: each process holds one data replica
    "mixtral_8x7b_2slices_v5e": 2,  # the two-slice layer: one process per slice
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_processes_agree_with_the_dense_reference(name, tmp_path):
    processes = CASES[name]
    twin = twin_of(validate(load_spec(REPO_ROOT / "specs" / f"{name}.yaml")))
    plan = make_plan(twin, interpret=True)
    module = tmp_path / f"{name}_twin.py"
    module.write_text(render(plan), encoding="utf-8")
    local_devices = plan.mesh.num_devices // processes
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={local_devices}",
        PYTHONPATH=str(REPO_ROOT),
    )
    port = _free_port()
    outputs = [tmp_path / f"process_{i}.json" for i in range(processes)]
    reference = json.dumps(reference_config(plan))
    procs = [
        subprocess.Popen(
            [sys.executable, str(PROCESS_SCRIPT), str(i), str(processes), str(port),
             str(module), reference, str(outputs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(processes)
    ]  # fmt: skip
    logs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            logs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, f"process {i}:\n{logs[i][-3000:]}"

    results = [json.loads(path.read_text()) for path in outputs]
    covered = sorted(tuple(r["rows"]) for r in results)
    assert covered[0][0] == 0 and covered[-1][1] == plan.batch  # every row, once
    assert all(a[1] == b[0] for a, b in zip(covered[:-1], covered[1:], strict=True))
    for result in results:
        assert result["devices"] == plan.mesh.num_devices
        assert result["local_devices"] == local_devices
        assert result["counts_match"], result
        worst = max(result["errors"], key=result["errors"].get)
        assert result["errors"][worst] < 1e-5, (worst, result["errors"])
