"""`moegen install-te` (or `python -m moegen.install_te`): the Transformer Engine installer,
scripts/install-te, for a moegen installed from its wheel, which ships the script as
moegen/_scripts/install-te. In a checkout it runs scripts/install-te itself (what `make te`
runs). The default venv is the one this Python runs in; the script builds TE's JAX extension
(no GPU needed), installs it and a stub libcuda compiled from moegen/kernels/libcuda_stub.c.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def script_path() -> Path:
    """The installer: packaged in the wheel, or scripts/install-te of the checkout."""
    packaged = PACKAGE_DIR / "_scripts" / "install-te"
    if packaged.is_file():
        return packaged
    return PACKAGE_DIR.parent / "scripts" / "install-te"


def default_venv() -> Path | None:
    """This Python's venv, or None when it runs outside one (then a VENV must be named)."""
    return Path(sys.prefix) if sys.prefix != sys.base_prefix else None


def install_te_args(venv: Path | None, *, cache_only: bool) -> list[str]:
    """The command line that runs the installer; raises ValueError without a venv."""
    venv = venv or default_venv()
    if venv is None:
        raise ValueError(
            f"{sys.executable} is not in a virtual environment: name one (moegen install-te VENV)"
        )
    bash = shutil.which("bash") or "bash"
    return [bash, str(script_path()), *(["--cache-only"] if cache_only else []), str(venv)]


def command(venv: Path | None, *, cache_only: bool = False) -> int:
    """Run the installer; its exit status (2 when it cannot start)."""
    try:
        args = install_te_args(venv, cache_only=cache_only)
    except ValueError as err:
        print(f"moegen install-te: {err}", file=sys.stderr)
        return 2
    if not Path(args[1]).is_file():
        print(f"moegen install-te: the installer is missing ({args[1]})", file=sys.stderr)
        return 2
    env = dict(os.environ, MOEGEN_PACKAGE_DIR=str(PACKAGE_DIR))
    return subprocess.run(args, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cache_only = "--cache-only" in args
    rest = [a for a in args if a != "--cache-only"]
    if len(rest) > 1 or any(a.startswith("-") for a in rest):
        print("usage: python -m moegen.install_te [--cache-only] [VENV]", file=sys.stderr)
        return 2
    return command(Path(rest[0]) if rest else None, cache_only=cache_only)


if __name__ == "__main__":
    sys.exit(main())
