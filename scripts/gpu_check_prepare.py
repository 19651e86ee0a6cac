"""GPU check, phase one (here, with the project's venv): the specs, their modules, a manifest.

Writes small spec YAMLs, renders their 1-device modules with `moegen build --no-verify` into
.gpu_check/ (git-ignored), copies the dense reference there (the package moegen_reference, as
tpu_check_extras.copy_reference writes it) and writes the manifest that the
run phase (gpu_check_parity, gpu_check_timing) reads on the GPU machine. moegen runs in a
child process: this module imports nothing of it, so the run phase may import its names.

Kernel tokamax: a bf16 parity twin and the timing layer are rendered with kernel tokamax
(target gpu-h200) too, and the wheels of tokamax and of what it imports that the GPU machine
lacks (TOKAMAX_WHEELS: pure Python but xprof and pydantic-core) are downloaded into
.gpu_check/wheels/ (~40 MiB, inside the device tool's 64 MiB); `gpu_check.sh run` installs
them offline into a scratch folder. `prepare --no-tokamax` leaves all of it out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".gpu_check"
MANIFEST = "manifest.json"


TWIN_SHAPES = {"embed_dim": 64, "ffn_dim": 96, "batch": 4, "seq_len": 16}
FLOAT32_TOLERANCE = 1e-4  # GPU float32 matmuls at "highest", against the float32 reference
BF16_TOLERANCE = 5e-2  # bf16 compute against the float32 reference: catches a wrong path only

# name: (experts, router, params dtype, compute dtype, tolerance); routers of today's schema.
PARITY_SPECS: dict[str, tuple[int, dict[str, Any], str, str, float]] = {
    "twin_softmax_top2_renorm": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": True},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_softmax_top2": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": False},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_sigmoid_top1": (
        16,
        {"top_k": 1, "score": "sigmoid", "renormalize": False},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_sigmoid_top2_renorm": (
        8,
        {"top_k": 2, "score": "sigmoid", "renormalize": True},
        "float32",
        "float32",
        FLOAT32_TOLERANCE,
    ),
    "twin_softmax_top2_renorm_bf16": (
        8,
        {"top_k": 2, "score": "softmax", "renormalize": True},
        "float32",
        "bfloat16",
        BF16_TOLERANCE,
    ),
}

# The bf16 twin again with kernel tokamax on gpu-h200: widths of whole 128s (its rule).
TOKAMAX_TWIN = ("twin_softmax_top2_renorm_bf16_tokamax", "twin_softmax_top2_renorm_bf16")
TOKAMAX_TWIN_SHAPES = {"embed_dim": 128, "ffn_dim": 256, "batch": 4, "seq_len": 16}
TOKAMAX_TARGET = "  hardware: gpu-h200\n  topology: 1\n  kernel: tokamax\n"
# tokamax 0.0.17 and what `import tokamax` needs that the H200 image lacks (its package list:
# device README, KINDS.md); jaxtyping, wadler-lindig, absl-py, flax, six are there. Python 3.12.
TOKAMAX_WHEELS = (
    "tokamax==0.0.17",
    "qwix==0.1.8",
    "einshape==1.0",
    "immutabledict==4.3.1",
    "tensorboardX==2.6.5",
    "xprof==2.24.2",
    "fire==0.7.1",
    "termcolor==3.3.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
)
WHEEL_PLATFORMS = ("manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

MIXTRAL_ROUTER = {"top_k": 2, "score": "softmax", "renormalize": True}
# Mixtral 8x7B layer on one device; `quick` is the same layer shrunk for a CPU try of `run`.
TIMING_SPECS = {
    "full": (
        "mixtral_8x7b_1gpu",
        {"embed_dim": 4096, "ffn_dim": 14336, "batch": 8, "seq_len": 2048},
    ),
    "quick": (
        "mixtral_small_1gpu_quick",
        {"embed_dim": 256, "ffn_dim": 512, "batch": 2, "seq_len": 128},
    ),
}


def spec_yaml(
    description: str,
    experts: int,
    router: dict[str, Any],
    shapes: dict[str, int],
    params_dtype: str,
    compute_dtype: str,
    target: str = "  hardware: cpu\n  kernel: xla\n",
) -> str:
    router_lines = "".join(
        f"  {key}: {str(value).lower() if isinstance(value, bool) else value}\n"
        for key, value in router.items()
    )
    return (
        "version: 1\n"
        f"description: {json.dumps(description)}\n"
        "layer:\n"
        f"  num_experts: {experts}\n"
        f"  embed_dim: {shapes['embed_dim']}\n"
        f"  ffn_dim: {shapes['ffn_dim']}\n"
        "router:\n"
        f"{router_lines}"
        "shapes:\n"
        f"  batch: {shapes['batch']}\n"
        f"  seq_len: {shapes['seq_len']}\n"
        "dtypes:\n"
        f"  params: {params_dtype}\n"
        f"  compute: {compute_dtype}\n"
        "mesh:\n"
        "  axes:\n"
        "    data: 1\n"
        "target:\n"
        f"{target}"
    )


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def prepare(args: argparse.Namespace) -> int:
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    specs_dir, modules_dir = work / "specs", work / "modules"
    specs_dir.mkdir(parents=True)

    manifest: dict[str, Any] = {
        "commit": _git("rev-parse", "HEAD"),
        "dirty_paths": [line[3:] for line in _git("status", "--porcelain").splitlines()],
        "prepared_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "parity": [],
        "timing": {},
    }
    spec_paths = []
    for name, (experts, router, params_dtype, compute_dtype, tol) in PARITY_SPECS.items():
        path = specs_dir / f"{name}.yaml"
        path.write_text(
            spec_yaml(
                f"gpu_check twin: {name}", experts, router, TWIN_SHAPES, params_dtype, compute_dtype
            ),
            encoding="utf-8",
        )
        spec_paths.append(path)
        manifest["parity"].append(
            {"name": name, "module": f"modules/{name}.py", "router": router, "tolerance": tol}
        )
    for key, (name, shapes) in TIMING_SPECS.items():
        path = specs_dir / f"{name}.yaml"
        path.write_text(
            spec_yaml(
                f"gpu_check timing ({key}): Mixtral 8x7B-style layer on one device",
                8,
                MIXTRAL_ROUTER,
                shapes,
                "float32",
                "bfloat16",
            ),
            encoding="utf-8",
        )
        spec_paths.append(path)
        manifest["timing"][key] = {
            "name": name,
            "module": f"modules/{name}.py",
            "router": MIXTRAL_ROUTER,
        }

    if args.tokamax:
        spec_paths += _tokamax_specs(specs_dir, manifest)
    command = [
        sys.executable,
        "-m",
        "moegen",
        "build",
        "--no-verify",
        "--out",
        str(modules_dir),
        *map(str, spec_paths),
    ]
    print(
        "$",
        " ".join(os.path.relpath(c, ROOT) if c.startswith("/") else c for c in command),
        flush=True,
    )
    result = subprocess.run(command, cwd=ROOT)
    if result.returncode != 0:
        print(f"prepare: moegen build failed (exit {result.returncode})", file=sys.stderr)
        return result.returncode
    if args.tokamax and not _download_wheels(work / "wheels"):
        return 1
    # the reference imports its sibling modules: the whole set, as tpu_check copies it
    sys.path.insert(0, str(ROOT / "scripts"))
    from tpu_check_extras import copy_reference

    copy_reference(ROOT, work)
    (work / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    print(
        f"prepared {len(spec_paths)} modules and the reference in "
        f"{os.path.relpath(work, ROOT)}/ ({size / 1024:.0f} KiB) "
        f"at commit {manifest['commit'][:12]}"
        + (f", {len(manifest['dirty_paths'])} paths modified" if manifest["dirty_paths"] else "")
    )
    return 0


def _tokamax_specs(specs_dir: Path, manifest: dict[str, Any]) -> list[Path]:
    """The kernel tokamax twin and timing specs, entered in the manifest beside the xla ones."""
    name, like = TOKAMAX_TWIN
    experts, router, params_dtype, compute_dtype, tol = PARITY_SPECS[like]
    twin = specs_dir / f"{name}.yaml"
    twin.write_text(
        spec_yaml(
            f"gpu_check twin: {name}", experts, router, TOKAMAX_TWIN_SHAPES, params_dtype,
            compute_dtype, TOKAMAX_TARGET,
        ),
        encoding="utf-8",
    )  # fmt: skip
    manifest["parity"].append(
        {"name": name, "module": f"modules/{name}.py", "router": router, "tolerance": tol}
    )
    paths = [twin]
    for key, (timing_name, shapes) in TIMING_SPECS.items():
        path = specs_dir / f"{timing_name}_tokamax.yaml"
        path.write_text(
            spec_yaml(
                f"gpu_check timing ({key}): Mixtral 8x7B-style layer, kernel tokamax", 8,
                MIXTRAL_ROUTER, shapes, "float32", "bfloat16", TOKAMAX_TARGET,
            ),
            encoding="utf-8",
        )  # fmt: skip
        manifest["timing"][key]["tokamax_module"] = f"modules/{timing_name}_tokamax.py"
        paths.append(path)
    return paths


def _download_wheels(folder: Path) -> bool:
    """TOKAMAX_WHEELS for CPython 3.12 on x86-64 Linux into `folder` (pip's cache helps)."""
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    command = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(folder),
        *TOKAMAX_WHEELS,
    ]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT)
    if result.returncode != 0:
        print(f"prepare: pip download of the tokamax wheels failed (exit {result.returncode})")
        return False
    size = sum(p.stat().st_size for p in folder.glob("*.whl"))
    print(f"prepare: {len(list(folder.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB")
    return True
