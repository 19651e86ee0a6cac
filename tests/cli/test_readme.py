"""Every ```python and ```sh (bash, shell) block of README.md and of docs/**/*.md runs as written.

Blocks run per section (a `# ` or `## ` heading of one file), in order, in a scratch folder: a
copy of the repository (the pip users' section: an empty folder, a fresh project), with
.venv/bin first on PATH and this
checkout's moegen importable; the README's quick start, where MOEGEN_EXAMPLE_VENV names a venv
made as `make example` makes .venv (`make test` makes one), runs there instead, the test
set-up's packages out of reach (a dependency the core install lacks fails it); python blocks as `python block.py` there, so that `generated/`
imports as in the repository root. A comment just before a block's fence,
`<!-- readme-test: CLAIM -->`, may replace running it with a checked claim:

- `run by .ci/run`: CI runs each of its commands itself (each is a command line of .ci/run);
- `run by scripts/pip-user-transcript, ...`: a wheel install into a clean venv, too slow and
  networked for a test; its recorded transcript must hold the section's commands as written
  now and end in success;
- `file NAME`: the block is a file the section's later shell blocks use (saved as NAME);
- `fixture path/to/Mixtral: ...`: run after a Mixtral-shaped checkpoint is written there;
- `golden updates, ...`: the one command (MOEGEN_UPDATE_GOLDENS=1 pytest over the golden
  runner, tests/render/test_goldens.py) runs in a copy of the repository narrowed to one case of each
  corpus whose golden was removed there: it must write those goldens back byte for byte. (The
  golden runner checks every golden is fresh.)

Any other claim, or a block of a runnable language in a way not covered here, fails."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from golden_runner import CORPORA
from readme_blocks import PIP_SECTION, Block, commands, readme_blocks, saved_file

CI_RUN = REPO_ROOT / ".ci" / "run"
TRANSCRIPT = REPO_ROOT / "bench" / "pip_user_transcript.txt"
TRANSCRIPT_CLAIM = "run by scripts/pip-user-transcript, recorded in bench/pip_user_transcript.txt"
CHECKPOINT_CLAIM = "fixture path/to/Mixtral: a Mixtral-shaped checkpoint for mixtral_small_cpu"
GOLDEN_CLAIM = "golden updates, each command run on a case whose golden was removed"
NOT_RUN_HERE = {"run by .ci/run", TRANSCRIPT_CLAIM, GOLDEN_CLAIM}  # checked instead of run
CLAIMS = NOT_RUN_HERE | {CHECKPOINT_CLAIM}
TIME_LIMIT_S = 900
DEVELOP_PAGE = "docs/how-to/develop.md"  # where the golden update commands are
BLOCKS = [b for b in readme_blocks() if b.kind or saved_file(b)]  # run, or saved as a file
SECTIONS = list(dict.fromkeys(b.section_key for b in BLOCKS if b.claim not in NOT_RUN_HERE))
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".*_cache", "*.egg-info")
FULL_VENV = REPO_ROOT / ".venv"
# The quick start on the set-up `make example` gives alone (issue 53: it once lacked optax):
# where that venv is given, the quick start runs there, and not again on the full .venv.
QUICK_START = "README.md: Quick start"
EXAMPLE_VENV = os.environ.get("MOEGEN_EXAMPLE_VENV")
TEST_SET_UP_ONLY = ("pytest", "torch", "transformers", "flax", "libtpu")
if EXAMPLE_VENV:
    SECTIONS.remove(QUICK_START)


def test_every_runnable_block_is_run_or_its_claim_known():
    assert len(BLOCKS) >= 13  # the blocks of README.md and docs/ were found at all
    for block in BLOCKS:
        if block.claim is not None:
            assert block.claim in CLAIMS or saved_file(block), f"{block.where}: {block.claim!r}"
        if block.kind == "python" and block.section == PIP_SECTION:
            assert saved_file(block), f"{block.where}: the section's python is a file it runs"


def test_blocks_claimed_for_ci_are_commands_of_ci_run():
    ci = set(commands(CI_RUN.read_text(encoding="utf-8")))
    claimed = [b for b in BLOCKS if b.claim == "run by .ci/run"]
    assert claimed
    for block in claimed:
        for command in commands(block.text):
            assert command in ci, f"{block.where}: `{command}` is not run by .ci/run"


def test_the_pip_transcript_ran_the_section_as_written_and_passed():
    section = [b for b in BLOCKS if b.section == PIP_SECTION]
    recorded = [line[2:] for line in TRANSCRIPT.read_text().splitlines() if line.startswith("$ ")]
    expected = []
    for block in section:
        name = saved_file(block)
        if name:
            expected.append(f"cat > {name}  # the README block that follows")
        else:
            expected += [line for line in block.text.splitlines() if line.strip()]
    assert recorded == expected, "README changed: rerun scripts/pip-user-transcript"
    text = TRANSCRIPT.read_text(encoding="utf-8")
    train = next(b for b in section if saved_file(b) == "train.py")
    assert train.text in text
    assert text.rstrip().endswith("pip-user-transcript: OK, every command exited 0")


def test_the_readme_train_py_is_examples_train_generated():
    (train,) = [b for b in BLOCKS if saved_file(b) == "train.py"]
    assert train.text == (REPO_ROOT / "examples" / "train_generated.py").read_text("utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("section", SECTIONS)
def test_the_section_runs_as_written(section, tmp_path):
    blocks = section_blocks(section)
    if blocks[0].section == PIP_SECTION:
        folder = tmp_path / "run"
        folder.mkdir()
    else:
        folder = repository_copy(tmp_path, FULL_VENV)
    for block in blocks:
        run_block(block, folder)


@pytest.mark.slow
def test_the_quick_start_runs_on_what_make_example_installs(tmp_path):
    venv = example_venv()
    folder = repository_copy(tmp_path, venv)
    blocks = section_blocks(QUICK_START)
    # the step that needs optax, which the core install once lacked, is among those run
    assert any("examples/train_generated.py" in b.text for b in blocks), QUICK_START
    for block in blocks:
        run_block(block, folder, venv)


def example_venv() -> Path:
    """The venv MOEGEN_EXAMPLE_VENV names, checked to be the core install alone; a skip without
    it, a failure where MOEGEN_REQUIRE_EXAMPLE_VENV=1 (`make test` sets both, so CI runs it)."""
    if not EXAMPLE_VENV:
        reason = "MOEGEN_EXAMPLE_VENV names no venv (`make test` makes one: .venv/example)"
        if os.environ.get("MOEGEN_REQUIRE_EXAMPLE_VENV") == "1":
            pytest.fail(f"MOEGEN_REQUIRE_EXAMPLE_VENV=1 but {reason}")
        pytest.skip(reason)
    venv = Path(EXAMPLE_VENV).resolve()
    assert (venv / ".moegen-core-installed").is_file(), f"{venv}: not the Makefile's core install"
    # -I: the venv's own packages alone, whatever PYTHONPATH the tests run with
    probe = f"import importlib.util as u; print(*[m for m in {TEST_SET_UP_ONLY} if u.find_spec(m)])"
    found = subprocess.run(
        [venv / "bin" / "python", "-I", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not found, f"{venv} holds the test set-up ({found}): not what `make example` makes"
    return venv


def section_blocks(section: str) -> list[Block]:
    """A section's blocks that run here, in order."""
    return [b for b in BLOCKS if b.section_key == section and b.claim not in NOT_RUN_HERE]


def repository_copy(tmp_path: Path, venv: Path) -> Path:
    """A scratch copy of the repository whose .venv is `venv`."""
    folder = tmp_path / "run"
    shutil.copytree(REPO_ROOT, folder, ignore=COPY_IGNORE, symlinks=True)
    (folder / ".venv").symlink_to(venv)
    return folder


# The golden runner's test file, and the folders of its corpora (goldens next to their cases).
GOLDEN_RUNNER = "tests/render/test_goldens.py"
GOLDEN_FOLDERS = [corpus.folder.as_posix() for corpus in CORPORA]
GOLDEN_COMMANDS = [c for b in BLOCKS if b.claim == GOLDEN_CLAIM for c in commands(b.text)]


def test_the_golden_update_command_is_the_runners_alone():
    named = [re.search(r"tests/(\w+/)?test_\w+\.py", command)[0] for command in GOLDEN_COMMANDS]
    assert named == [GOLDEN_RUNNER]


@pytest.mark.slow
@pytest.mark.parametrize("command", GOLDEN_COMMANDS)
def test_a_golden_update_command_writes_a_removed_golden_back(command, tmp_path):
    folder = repository_copy(tmp_path, FULL_VENV)
    removed = []
    for goldens in GOLDEN_FOLDERS:
        golden = sorted(
            p for p in (folder / goldens).iterdir() if p.suffix in (".expected", ".py")
        )[0]
        golden.unlink()
        removed.append(golden.stem)
    block = Block(
        "sh", f"{command} -k '{' or '.join(removed)}'", 0, "Development", None, DEVELOP_PAGE
    )
    run_block(block, folder)
    for goldens in GOLDEN_FOLDERS:
        assert_same_tree(REPO_ROOT / goldens, folder / goldens)


def run_block(block: Block, folder: Path, venv: Path = FULL_VENV) -> None:
    name = saved_file(block)
    if name:
        (folder / name).write_text(block.text, encoding="utf-8")
        return
    if block.claim == CHECKPOINT_CLAIM:
        write_mixtral_checkpoint(folder / "path" / "to" / "Mixtral", layer=3)
    if block.kind == "python":
        (folder / "readme_block.py").write_text(block.text, encoding="utf-8")
        args = ["python", "readme_block.py"]
    else:
        args = ["bash", "-euo", "pipefail", "-c", block.text]
    result = subprocess.run(
        args,
        cwd=folder,
        env=block_env(folder, venv),
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT_S,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}:\n{block.text}\n{result.stdout}{result.stderr}"


def block_env(folder: Path, venv: Path) -> dict[str, str]:
    unset = ("XLA_FLAGS", "MOEGEN_DEBUG", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    # venv's bin first, and the test run's own venv off PATH: its packages would hide what
    # venv lacks (an activated .venv, or pytest started from it)
    running = {str(Path(v) / "bin") for v in (sys.prefix, os.environ.get("VIRTUAL_ENV")) if v}
    kept = [p for p in env.get("PATH", "").split(os.pathsep) if p not in running]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *kept])
    # this checkout's moegen (the venv's editable install may be another worktree's)
    root = folder if (folder / "moegen").is_dir() else REPO_ROOT
    env["PYTHONPATH"] = str(root)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def write_mixtral_checkpoint(path: Path, layer: int) -> None:
    """One layer of a Mixtral-layout checkpoint sized as generated/mixtral_small_cpu."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    text = (REPO_ROOT / "generated" / "mixtral_small_cpu.py").read_text(encoding="utf-8")
    size = {
        k: int(re.search(rf"^{k} = (\d+)$", text, re.M)[1])
        for k in ("EMBED_DIM", "FFN_DIM", "NUM_EXPERTS", "TOP_K")
    }
    d, f, e = size["EMBED_DIM"], size["FFN_DIM"], size["NUM_EXPERTS"]
    rng = np.random.default_rng(0)
    prefix = f"model.layers.{layer}.block_sparse_moe"
    tensors = {f"{prefix}.gate.weight": rng.standard_normal((e, d), np.float32)}
    for i in range(e):
        for name, shape in (("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))):
            tensors[f"{prefix}.experts.{i}.{name}.weight"] = (
                rng.standard_normal(shape, np.float32) * 0.02
            )
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"))
    config = {
        "model_type": "mixtral",
        "num_local_experts": e,
        "hidden_size": d,
        "intermediate_size": f,
        "num_experts_per_tok": size["TOP_K"],
    }
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")


def assert_same_tree(expected: Path, actual: Path) -> None:
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    want, got = files(expected), files(actual)
    assert sorted(want) == sorted(got)
    changed = [name for name in want if want[name] != got[name]]
    assert not changed, f"goldens the README's update command changed: {changed}"
