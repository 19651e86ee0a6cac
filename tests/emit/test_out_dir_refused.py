"""An --out that no write protocol can fill is refused before the build verifies anything:
exit 4, one line naming the path and what is wrong, nothing on disk changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPO_ROOT, assert_no_traceback, snapshot

SPEC = REPO_ROOT / "specs" / "sigmoid_top1_data_cpu.yaml"
MODULE = "sigmoid_top1_data_cpu.py"

# case: (--out, what the message says, make the folder's contents first)
CASES = {
    "the file system's root": ("/", "the file system's root", False),
    "a newline in the path": ("out\nput", "a control character", False),
    "a directory where the module goes": ("out", "a directory where the module would be", True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unwritable_out_is_refused_before_verification(case, tmp_path, invoke_main):
    out, message, blocked = CASES[case]
    shutil.copy(SPEC, tmp_path / SPEC.name)
    if blocked:
        (tmp_path / out / MODULE).mkdir(parents=True)
        (tmp_path / out / "kept.py").write_text("x = 1\n", encoding="utf-8")
    before = snapshot(tmp_path)
    result = invoke_main("build", SPEC.name, "--out", out, cwd=tmp_path)
    assert result.code == 4, result.output
    assert_no_traceback(result.output)
    assert message in result.stderr
    assert "twin parity" not in result.stderr  # refused before any verification step
    assert "moegen-stage" not in result.stderr  # the user's path, not a temporary's
    assert snapshot(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [SPEC.name, *(["out"] if blocked else [])]
    )


def test_a_writable_out_beside_them_still_builds(tmp_path, invoke_main):
    shutil.copy(SPEC, tmp_path / SPEC.name)
    result = invoke_main("build", SPEC.name, "--no-verify", "--out", "out", cwd=tmp_path)
    assert result.code == 0, result.output
    assert (tmp_path / "out" / MODULE).is_file()
    assert Path(tmp_path / "out").is_dir()


def test_an_out_whose_dotdot_climbs_out_of_a_link_is_refused(tmp_path, invoke_main):
    """`link/../x` is ./x to a shell's cd but beside the link's target to the kernel: refused,
    located, nothing written in either place, rather than written where the other was meant."""
    shutil.copy(SPEC, tmp_path / SPEC.name)
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere" / "deep", target_is_directory=True)
    before = snapshot(tmp_path)
    result = invoke_main("build", SPEC.name, "--no-verify", "--out", "link/../x", cwd=tmp_path)
    assert result.code == 4, result.output
    assert_no_traceback(result.output)
    assert "`..` climbs out of a symbolic link" in result.stderr
    assert "'link/../x'" in result.stderr and str(tmp_path / "elsewhere" / "x") in result.stderr
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "x").exists() and not (tmp_path / "elsewhere" / "x").exists()


def test_a_dotdot_through_plain_directories_still_builds(tmp_path, invoke_main):
    shutil.copy(SPEC, tmp_path / SPEC.name)
    (tmp_path / "sub").mkdir()
    result = invoke_main("build", SPEC.name, "--no-verify", "--out", "sub/../out", cwd=tmp_path)
    assert result.code == 0, result.output
    assert (tmp_path / "out" / MODULE).is_file()
