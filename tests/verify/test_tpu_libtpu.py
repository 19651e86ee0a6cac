"""libtpu for the TPU target: a clear message without it, the devices of every catalogue slice, and libtpu shared between processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib

import pytest
from conftest import REPO_ROOT, assert_no_traceback
from tpu_cases import fake_cpu_env, last_json, pallas_yaml, write_spec

import moegen.pipeline
import moegen.verify.verification
from moegen.hardware import CATALOGUE
from moegen.pipeline import generate
from moegen.verify import verify

# ---------------------------------------------------------------------------------------
# Without libtpu: a clear message, not a crash

NO_LIBTPU_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys, types

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "libtpu" or name.startswith("libtpu."):
            return None  # as on a machine without moegen[tpu]
        return real_find_spec(name, *args, **kwargs)

    importlib.util.find_spec = find_spec

    from moegen.verify.worker import child as worker

    tpu = json.loads(sys.argv[2])
    try:
        worker.target_devices(types.SimpleNamespace(NUM_DEVICES=4), tpu)
    except worker.CheckFailed as err:
        print(json.dumps({"target_devices": str(err)}), flush=True)
    else:
        print(json.dumps({"target_devices": None}), flush=True)
    sys.exit(worker.main(sys.argv[1]))  # the whole worker on a job without twins
    """
)


def test_missing_libtpu_says_to_install_the_tpu_extra(tmp_path):
    generated = generate(write_spec(tmp_path, "no_libtpu", pallas_yaml()))
    plan = generated.plan
    module = tmp_path / "no_libtpu.py"
    module.write_text(generated.source, encoding="utf-8")
    tpu = {"topology_name": plan.mesh.tpu_topology_name, "chips_per_host_bounds": [2, 2, 1]}
    assert plan.mesh.tpu_topology_name == "v5e:2x2" and plan.mesh.chips_per_host_bounds == (2, 2, 1)
    job = {
        "module": str(module),
        "twins": [],
        "router": {
            "top_k": plan.router.top_k,
            "score": plan.router.score,
            "renormalize": plan.router.renormalize,
        },
        "tpu": tpu,
    }
    job_path = tmp_path / "job.json"
    job_path.write_text(json.dumps(job), encoding="utf-8")
    script = tmp_path / "no_libtpu_worker.py"
    script.write_text(NO_LIBTPU_SCRIPT, encoding="utf-8")

    result = subprocess.run(
        [sys.executable, str(script), str(job_path), json.dumps(tpu)],
        env=fake_cpu_env(plan.mesh.num_devices),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    direct = events[0]["target_devices"]
    assert direct is not None, "target_devices found TPU devices without libtpu"
    pin = next(
        dep
        for dep in tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]["tpu"]
        if dep.startswith("libtpu")
    )
    assert "compiling for TPU needs libtpu" in direct
    assert "pip install 'moegen[tpu]'" in direct and pin in direct, direct

    # The worker reports it as its one error (what `moegen build` shows), after the import.
    assert result.returncode == 1, result.stdout + result.stderr[-4000:]
    assert [e["step"] for e in events if "step" in e] == ["import"]
    assert events[-1] == {"error": direct}
    assert_no_traceback(result.stdout)


# ---------------------------------------------------------------------------------------
# The slice catalogue, and libtpu shared between processes

TOPOLOGY_SCRIPT = textwrap.dedent(
    """
    import json
    from jax.experimental import topologies
    from moegen.hardware import CATALOGUE

    found = {}
    for name, chip in CATALOGUE.items():
        if chip.platform != "tpu":
            continue
        for topology in chip.topologies:
            devices = topologies.get_topology_desc(
                platform="tpu",
                topology_name=f"{chip.topology_prefix}:{topology}",
                chip_config_name="default",
                chips_per_host_bounds=chip.chips_per_host_bounds(topology),
                num_slices=1,
            ).devices
            found[f"{name} {topology}"] = len(devices)
    print(json.dumps(found), flush=True)
    """
)


@pytest.mark.slow
def test_every_catalogue_slice_has_the_devices_the_rules_assume():
    """libtpu's compile-only devices for every (generation, topology) a spec may name."""
    result = subprocess.run(
        [sys.executable, "-c", TOPOLOGY_SCRIPT],
        env=fake_cpu_env(1),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    found = last_json(result.stdout)
    expected = {
        f"{name} {topology}": chip.devices(topology)
        for name, chip in CATALOGUE.items()
        if chip.platform == "tpu"
        for topology in chip.topologies
    }
    assert found == expected


LOCK_HOLDER = textwrap.dedent(
    """
    import sys
    from jax.experimental import topologies

    topologies.get_topology_desc(
        platform="tpu", topology_name="v5e:2x2", chip_config_name="default",
        chips_per_host_bounds=(2, 2, 1), num_slices=1,
    )
    print("ready", flush=True)
    sys.stdin.read()  # hold libtpu (and its lockfile) until the test is done
    """
)


def _hold_libtpu(env: dict[str, str]) -> subprocess.Popen[str] | None:
    """A process that holds libtpu as another verification would, or None when another
    process already holds it (this test process, or a build elsewhere on the machine):
    the situation under test holds either way."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    if holder.stdout.readline().strip() == "ready":
        return holder
    holder.stdin.close()
    holder.wait(timeout=60)
    return None


@pytest.mark.slow
def test_concurrent_tpu_verifications_do_not_collide(tmp_path, monkeypatch):
    """Another process holding libtpu (another `moegen build`, a parallel test run) must not
    make a compile-only verification fail: libtpu takes the exclusive /tmp/libtpu_lockfile
    unless ALLOW_MULTIPLE_LIBTPU_LOAD=1, and compile-only devices need no exclusive hold."""
    monkeypatch.delenv("ALLOW_MULTIPLE_LIBTPU_LOAD", raising=False)  # moegen must set it
    monkeypatch.chdir(tmp_path)
    generated = generate(write_spec(tmp_path, "concurrent", pallas_yaml()).relative_to(tmp_path))
    monkeypatch.setattr(
        moegen.verify.verification, "_twins", lambda loaded: []
    )  # the compile collides
    env = fake_cpu_env(1)
    env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
    holder = _hold_libtpu(env)
    try:
        report = verify(generated.loaded, generated.source, timeout_s=300)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait(timeout=60)
    assert report.step("memory verdict")["verdict"].startswith("fits")
