"""TPU check, phase one: what the work folder gets besides the one-chip modules: moegen's
dense reference as a package of its own, and the modules whose own Pallas kernel
(`_gmm_add`, the overlapped ring's in-place partial sums) the run phase checks
(tpu_check_kernels.py).

For the chip: each committed generated module that defines it, as committed (one call of the
kernel at the module's shapes fits one chip; the run phase calls the kernel alone, no mesh).
With --tiny (CI, on a CPU): the shrunken twin of each such module's spec, rendered by moegen in
a child process with the kernel interpreted (this side imports nothing of moegen).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

REFERENCE_FILES = ("layer", "checks", "fields", "routing")  # of moegen/verify/reference/
KERNEL = "\ndef _gmm_add_forward("  # where a module defines the kernel
SPEC_LINE = "# spec: "  # the header line naming the module's spec
TWIN = """
import sys
from pathlib import Path
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import render
from moegen.verify import plan_twin, twins_of
loaded = load_valid(Path(sys.argv[1]))
plan = make_plan(loaded)
twin = next(iter(twins_of(loaded, plan)))
Path(sys.argv[2]).write_text(render(plan_twin(twin.loaded, plan)), encoding="utf-8")
"""


def spec_of(module: Path, root: Path) -> Path | None:
    """The committed spec a generated module names in its header (None: none there)."""
    for line in module.read_text(encoding="utf-8").splitlines()[:3]:
        if line.startswith(SPEC_LINE):
            path = (root / line[len(SPEC_LINE) :].strip()).resolve()
            return path if path.is_relative_to(root) and path.is_file() else None
    return None


def kernel_modules(root: Path, work: Path, tiny: bool, python: str) -> list[dict[str, Any]]:
    """Manifest entries {name, file, source} of the kernel checks, their modules in
    work/kernels/ (a module whose twin cannot be rendered is left out, with the reason)."""
    folder = work / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for module in sorted((root / "generated").glob("*.py")):
        if KERNEL not in module.read_text(encoding="utf-8"):
            continue
        name = f"{module.stem}_tiny" if tiny else module.stem
        target = folder / f"{name}.py"
        spec = spec_of(module, root)
        if not tiny:
            shutil.copyfile(module, target)
        elif (
            spec is None
            or subprocess.run(
                [python, "-c", TWIN, str(spec), str(target)], cwd=root, capture_output=True
            ).returncode
        ):
            print(f"skipped kernel check of {module.name}: its twin could not be rendered")
            continue
        source = str((spec or module).relative_to(root))
        entries.append({"name": name, "file": f"kernels/{name}.py", "source": source})
    return entries


def copy_reference(root: Path, work: Path) -> None:
    """moegen's dense reference as a package of its own (imports made relative)."""
    package = work / "moegen_reference"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(
        '"""Copied from moegen/verify/reference."""\n', encoding="utf-8"
    )
    for name in REFERENCE_FILES:
        text = (root / "moegen" / "verify" / "reference" / f"{name}.py").read_text(encoding="utf-8")
        text = text.replace("from moegen.verify.reference.", "from .")
        (package / f"{name}.py").write_text(text, encoding="utf-8")
