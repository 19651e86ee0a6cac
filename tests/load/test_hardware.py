"""`moegen.hardware`: the catalogue is consistent with itself, with the spec schema, with the
tile arithmetic, and (for a few slices) with libtpu's own idea of each topology."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import typing

import pytest

from moegen.hardware import CATALOGUE, hardware
from moegen.kernels.tiling import DEFAULT_TILE, Tile, usable_vmem, vmem_bytes
from moegen.spec import Target

TPUS = [name for name, hw in CATALOGUE.items() if hw.platform == "tpu"]
PLANAR = {"tpu-v5e", "tpu-v6e"}  # 2-D torus slices
CUBIC = {"tpu-v5p", "tpu7x"}  # 3-D torus slices


def dims(topology: str) -> list[int]:
    return [int(d) for d in topology.split("x")]


def test_catalogue_names_are_the_schema_choices() -> None:
    choices = typing.get_args(Target.model_fields["hardware"].annotation)
    assert sorted(choices) == sorted(CATALOGUE)
    for name, hw in CATALOGUE.items():
        assert hw.name == name
        assert hardware(name) is hw
    assert set(TPUS) == PLANAR | CUBIC


def test_cpu_has_no_slice_and_no_fixed_memory() -> None:
    cpu = hardware("cpu")
    assert (cpu.platform, cpu.topology_prefix, cpu.topologies) == ("cpu", "", ())
    assert cpu.hbm_bytes_per_device == 0
    assert cpu.vmem_bytes_for_tiles == 0


def test_topology_prefixes_are_libtpu_names() -> None:
    prefixes = {name: CATALOGUE[name].topology_prefix for name in TPUS}
    assert prefixes == {"tpu-v5e": "v5e", "tpu-v5p": "v5p", "tpu-v6e": "v6e", "tpu7x": "tpu7x"}


@pytest.mark.parametrize("name", TPUS)
def test_every_tpu_has_topologies(name: str) -> None:
    hw = hardware(name)
    assert hw.topologies, name
    assert len(set(hw.topologies)) == len(hw.topologies), "a topology listed twice"
    rank = 2 if name in PLANAR else 3
    chips = []
    for topology in hw.topologies:
        assert all(d > 0 for d in dims(topology)), topology
        assert len(dims(topology)) == rank, topology
        assert topology == "x".join(map(str, dims(topology))), topology  # canonical spelling
        chips.append(hw.chips(topology))
    # listed smallest first, and no two slices of a generation have the same size
    assert chips == sorted(chips)
    assert len(set(chips)) == len(chips)


@pytest.mark.parametrize("name", TPUS)
def test_device_counts(name: str) -> None:
    hw = hardware(name)
    assert hw.devices_per_chip == (2 if name == "tpu7x" else 1)
    for topology in hw.topologies:
        product = 1
        for d in dims(topology):
            product *= d
        assert hw.chips(topology) == product
        assert hw.devices(topology) == product * hw.devices_per_chip


def test_device_counts_by_hand() -> None:
    assert hardware("tpu-v5e").devices("2x4") == 8
    assert hardware("tpu-v6e").devices("16x16") == 256
    assert hardware("tpu-v5p").devices("2x2x2") == 8
    assert hardware("tpu7x").chips("2x2x1") == 4
    assert hardware("tpu7x").devices("2x2x1") == 8  # two TensorCores, two JAX devices a chip
    assert hardware("tpu7x").devices("4x4x4") == 128


@pytest.mark.parametrize("name", TPUS)
def test_chips_per_host_bounds_divide_the_slice(name: str) -> None:
    hw = hardware(name)
    for topology in hw.topologies:
        bounds = hw.chips_per_host_bounds(topology)
        assert isinstance(bounds, tuple) and len(bounds) == 3, bounds
        assert all(isinstance(b, int) and b > 0 for b in bounds), bounds
        shape = (dims(topology) + [1, 1])[:3]
        for bound, dim in zip(bounds, shape, strict=True):
            assert dim % bound == 0, (topology, bounds)
        hosts_chips = bounds[0] * bounds[1] * bounds[2]
        assert hosts_chips <= 8, (topology, bounds)  # at most 8 chips behind one host
        assert hw.chips(topology) % hosts_chips == 0


def test_chips_per_host_bounds_by_hand() -> None:
    assert hardware("tpu-v5e").chips_per_host_bounds("1x1") == (1, 1, 1)
    assert hardware("tpu-v5e").chips_per_host_bounds("2x2") == (2, 2, 1)
    assert hardware("tpu-v5e").chips_per_host_bounds("2x4") == (2, 4, 1)
    assert hardware("tpu-v6e").chips_per_host_bounds("16x16") == (2, 4, 1)
    assert hardware("tpu-v5p").chips_per_host_bounds("2x2x1") == (2, 2, 1)
    assert hardware("tpu-v5p").chips_per_host_bounds("4x4x8") == (2, 2, 1)
    assert hardware("tpu7x").chips_per_host_bounds("2x2x2") == (2, 2, 1)


@pytest.mark.parametrize("name", TPUS)
def test_memory_figures(name: str) -> None:
    hw = hardware(name)
    assert hw.hbm_bytes_per_chip > 0
    assert hw.hbm_bytes_per_device == hw.hbm_bytes_per_chip // hw.devices_per_chip
    assert hw.hbm_bytes_per_device * hw.devices_per_chip == hw.hbm_bytes_per_chip
    # every generation has between 8 and 256 GiB of HBM a chip
    assert 8 * 2**30 <= hw.hbm_bytes_per_chip <= 256 * 2**30
    # scoped VMEM: whole MiB, and megablox's default tile runs in bfloat16 everywhere,
    # backward included, within the usable three quarters (12 MiB needed; 12 or 24 usable)
    assert hw.vmem_bytes_for_tiles % 2**20 == 0
    assert vmem_bytes(Tile(*DEFAULT_TILE), "bfloat16") <= usable_vmem(hw.vmem_bytes_for_tiles)
    assert hw.peak_bf16_flops_per_chip > 0
    assert hw.hbm_bytes_per_s_per_chip > 0
    assert hw.ici_bytes_per_s_per_chip > 0


def test_tpu7x_memory_is_split_between_its_two_devices() -> None:
    tpu7x = hardware("tpu7x")
    assert tpu7x.hbm_bytes_per_device * 2 == tpu7x.hbm_bytes_per_chip


def test_catalogue_is_frozen() -> None:
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        hardware("tpu-v5e").devices_per_chip = 2  # type: ignore[misc]


# ---------------------------------------------------------------------------------------
# libtpu agrees: compile-only devices of a few slices (no TPU needed)

LIBTPU_PAIRS = [("tpu-v5e", "2x4"), ("tpu-v6e", "4x4"), ("tpu-v5p", "2x2x2"), ("tpu7x", "2x2x1")]

_PROBE = """
import json, sys
from jax.experimental import topologies
result = {}
for key, prefix, topology, bounds in json.loads(sys.argv[1]):
    desc = topologies.get_topology_desc(
        platform="tpu",
        topology_name=f"{prefix}:{topology}",
        chip_config_name="default",
        chips_per_host_bounds=tuple(bounds),
        num_slices=1,
    )
    result[key] = len(desc.devices)
print("MOEGEN-PROBE " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def libtpu_device_counts() -> dict[str, int]:
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install 'moegen[tpu]')")
    jobs = [
        (
            f"{name}:{topology}",
            hardware(name).topology_prefix,
            topology,
            list(hardware(name).chips_per_host_bounds(topology)),
        )
        for name, topology in LIBTPU_PAIRS
    ]
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only TPU devices need no TPU backend
    # libtpu guards a real TPU with /tmp/libtpu_lockfile; compile-only use may share it
    # with another process (a concurrent `moegen verify`).
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(jobs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    # libtpu warns on stderr (no TPU metadata, hostnames): only the result line matters.
    lines = [line for line in result.stdout.splitlines() if line.startswith("MOEGEN-PROBE ")]
    assert result.returncode == 0 and len(lines) == 1, result.stdout + result.stderr
    return json.loads(lines[0].removeprefix("MOEGEN-PROBE "))


@pytest.mark.parametrize(("name", "topology"), LIBTPU_PAIRS, ids=lambda v: str(v))
def test_libtpu_agrees_on_device_count(
    libtpu_device_counts: dict[str, int], name: str, topology: str
) -> None:
    assert libtpu_device_counts[f"{name}:{topology}"] == hardware(name).devices(topology)


# ---------------------------------------------------------------------------------------
# Spelling a target: what a user who writes another name is told


def _hardware_message(written: str) -> str:
    from moegen.diagnostics import SpecError
    from moegen.load import load_spec_bytes

    text = (
        "version: 1\nlayer: {num_experts: 8, embed_dim: 64, ffn_dim: 128}\nrouter: {top_k: 2}\n"
        "shapes: {batch: 8, seq_len: 16}\nmesh: {axes: {data: 8}}\n"
        f"target: {{hardware: {written}, topology: 2x4}}\n"
    )
    with pytest.raises(SpecError) as info:
        load_spec_bytes(text.encode(), "hw.yaml", "hw")
    [diagnostic] = info.value.diagnostics
    assert (diagnostic.line, diagnostic.field) == (6, "target.hardware")
    return diagnostic.message


CHOICES = (
    "must be 'cpu', 'tpu-v5e', 'tpu-v5p', 'tpu-v6e', 'tpu7x', 'gpu-a100', 'gpu-h100', "
    "'gpu-h200' or 'gpu-b200'"
)


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        ("tpu-v5lite", "; did you mean 'tpu-v5e'?"),  # "TPU v5 lite" is v5e's device kind
        ("tpu-v6", "; did you mean 'tpu-v6e'?"),
        ("tpu-7x", "; did you mean 'tpu7x'?"),
        ("gpu", ""),
        ("h100", "; did you mean 'gpu-h100'?"),
        ("b200", "; did you mean 'gpu-b200'?"),
        # names other tools use: libtpu topology prefixes, Cloud TPU names, code names
        ("v5e", "; did you mean 'tpu-v5e'?"),
        ("v5litepod", "; did you mean 'tpu-v5e'?"),
        ("v5p", "; did you mean 'tpu-v5p'?"),
        ("v6e", "; did you mean 'tpu-v6e'?"),
        ("trillium", "; did you mean 'tpu-v6e'?"),
        ("v7x", "; did you mean 'tpu7x'?"),
        ("tpu-v7x", "; did you mean 'tpu7x'?"),
        ("ironwood", "; did you mean 'tpu7x'?"),
        ("megablox", ""),  # a kernel name, not a hardware name
    ],
)
def test_hardware_spelling_hints(written: str, hint: str) -> None:
    assert _hardware_message(written) == f"{CHOICES}, got '{written}'{hint}"


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        # unsupported generations: no hint (0.769 similar to 'tpu-v5e', 'tpu-v5p' and
        # 'tpu-v6e' alike, below the 0.8 cutoff)
        ("tpu-v4", ""),
        ("tpu-v3", ""),
        # TPU v7 is Ironwood, which moegen (and libtpu) call tpu7x
        ("tpu-v7", "; did you mean 'tpu7x'?"),
    ],
)
def test_another_generation_is_not_taken_for_a_typo(written: str, hint: str) -> None:
    assert _hardware_message(written) == f"{CHOICES}, got '{written}'{hint}"


def test_every_tpu_generation_has_the_compilers_own_grant_of_hbm():
    """What libtpu grants one program (its out-of-HBM message's "available HBM"), measured
    per generation: tune's fit by XLA's buffer assignment is judged against it."""
    from moegen.hardware import CATALOGUE, COMPILER_HBM_GIB

    tpus = {name for name, chip in CATALOGUE.items() if chip.platform == "tpu"}
    assert set(COMPILER_HBM_GIB) == tpus
    for name in tpus:
        granted = CATALOGUE[name].compiler_hbm_bytes_per_device
        assert 0.9 < granted / CATALOGUE[name].hbm_bytes_per_device < 1.01
