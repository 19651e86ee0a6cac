"""`moegen schema --check/--write --path P` where P is hostile: not UTF-8, a folder, a FIFO, a
dangling symlink, a huge file, under a file, in /proc or /sys, a name too long, empty. Each is
one located line on stderr with a documented exit code (1 stale, 2 a path moegen cannot use),
never an internal error, and the disk is left as it was."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import assert_no_traceback, run_moegen

from moegen.schema import schema_text

LONG_NAME = "a" * 300 + ".json"  # over NAME_MAX (255)
HUGE = 256 * 2**20  # sparse: a read of it whole would show as time and memory


def _tree(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under `root`, not followed: (mode, size, inode, mtime) — a write, a
    rename over, a new temporary or folder all show."""
    entries = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            st = os.lstat(path)
            entries[str(path.relative_to(root))] = (
                st.st_mode,
                st.st_size,
                st.st_ino,
                st.st_mtime_ns,
            )
    return entries


def _utf16(tmp: Path) -> str:
    (tmp / "bad.json").write_bytes(b"\xff\xfe{}")  # what an editor saving UTF-16 writes
    return "bad.json"


def _folder(tmp: Path) -> str:
    (tmp / "d").mkdir()
    return "d"


def _fifo(tmp: Path) -> str:
    os.mkfifo(tmp / "f")  # opened for reading, it would wait for a writer forever
    return "f"


def _dangling(tmp: Path) -> str:
    (tmp / "dl.json").symlink_to("nowhere.json")
    return "dl.json"


def _under_dangling(tmp: Path) -> str:
    (tmp / "dl").symlink_to("nowhere")
    return "dl/x.json"


def _huge(tmp: Path) -> str:
    # the schema, then zeros: stale, told from the head without reading it all
    path = tmp / "huge.json"
    path.write_text(schema_text(), encoding="utf-8")
    os.truncate(path, HUGE)
    return "huge.json"


def _under_file(tmp: Path) -> str:
    (tmp / "victim.txt").write_text("mine\n", encoding="utf-8")
    return "victim.txt/x.json"


def _long_name(tmp: Path) -> str:
    return LONG_NAME


def _long_name_in_new_folders(tmp: Path) -> str:
    return f"new/deep/{LONG_NAME}"  # the folders made for it must go again


def _empty(tmp: Path) -> str:
    return ""


def _fixed(path: str, folder: str) -> Callable[[Path], str]:
    def setup(tmp: Path) -> str:
        if not os.path.isdir(folder):
            pytest.skip(f"no {folder} here")
        return path

    return setup


CHECKS = {
    "not-utf8": (_utf16, 1, "stale: bad.json (not UTF-8 text; run `moegen schema --write"),
    "folder": (_folder, 2, "'d' is a directory"),  # click's check of a `file` option
    "fifo": (_fifo, 2, "cannot read f: it is a FIFO (named pipe), not a regular file"),
    "dangling-symlink": (
        _dangling,
        2,
        "cannot read dl.json: it is a symlink to 'nowhere.json', which does not exist",
    ),
    "huge": (_huge, 1, "stale: huge.json (run `moegen schema --write --path huge.json`)"),
    "under-a-file": (_under_file, 2, "cannot read victim.txt/x.json: victim.txt is a file"),
    "name-too-long": (_long_name, 2, f"cannot read {LONG_NAME}: File name too long"),
    "empty": (_empty, 2, "cannot read '': the path names no file"),
}

WRITES = {
    "under-a-file": (_under_file, "cannot write victim.txt/x.json: victim.txt is a file"),
    "proc": (_fixed("/proc/self/x.json", "/proc/self"), "cannot write /proc/self/x.json: "),
    "proc-new-folder": (
        _fixed("/proc/self/new/x.json", "/proc/self"),
        "cannot write /proc/self/new/x.json: cannot create the folder /proc/self/new",
    ),
    "sys": (_fixed("/sys/x.json", "/sys"), "cannot write /sys/x.json: "),
    "name-too-long": (_long_name, f"cannot write {LONG_NAME}: File name too long"),
    "name-too-long-new-folders": (_long_name_in_new_folders, "File name too long"),
    "empty": (_empty, "cannot write '': the path names no file"),
    "fifo": (_fifo, "cannot write f: it is a FIFO (named pipe), not a regular file"),
    "dangling-symlink": (
        _dangling,
        "cannot write dl.json: it is a symlink to 'nowhere.json', which does not exist",
    ),
    "under-a-dangling-symlink": (
        _under_dangling,
        "cannot write dl/x.json: dl is a symlink to 'nowhere', which does not exist",
    ),
}


def _one_line(stderr: str) -> str:
    assert_no_traceback(stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("case", CHECKS)
def test_check_of_a_hostile_path_is_located(case, tmp_path):
    setup, code, message = CHECKS[case]
    path = setup(tmp_path)
    before = _tree(tmp_path)
    result = run_moegen("schema", "--check", "--path", path, cwd=tmp_path, timeout=60)
    assert result.returncode == code, result.stderr
    assert message in result.stderr
    assert_no_traceback(result.stderr)
    if case != "folder":  # click's usage error comes with its usage lines
        _one_line(result.stderr)
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("case", WRITES)
def test_write_to_a_hostile_path_writes_nothing(case, tmp_path):
    setup, message = WRITES[case]
    path = setup(tmp_path)
    before = _tree(tmp_path)
    result = run_moegen("schema", "--write", "--path", path, cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    line = _one_line(result.stderr)
    assert line.startswith("moegen schema: ") and line.endswith("; nothing written"), line
    assert message in line
    assert _tree(tmp_path) == before
    if os.path.isabs(path):
        assert not os.path.lexists(path)


def test_write_to_a_folder_is_refused_by_click(tmp_path):
    _folder(tmp_path)
    before = _tree(tmp_path)
    result = run_moegen("schema", "--write", "--path", "d", cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert "'d' is a directory" in result.stderr
    assert_no_traceback(result.stderr)
    assert _tree(tmp_path) == before


def test_write_replaces_a_stale_file_atomically_and_leaves_no_temporary(tmp_path):
    _utf16(tmp_path)
    result = run_moegen("schema", "--write", "--path", "bad.json", cwd=tmp_path)
    assert result.returncode == 0 and _one_line(result.stderr) == "wrote bad.json"
    assert (tmp_path / "bad.json").read_text(encoding="utf-8") == schema_text()
    assert sorted(os.listdir(tmp_path)) == ["bad.json"]
    fresh = run_moegen("schema", "--check", "--path", "bad.json", cwd=tmp_path)
    assert fresh.returncode == 0 and _one_line(fresh.stderr) == "bad.json is fresh"


def test_write_through_a_symlink_keeps_the_link(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "schema.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "link.json").symlink_to("shared/schema.json")
    result = run_moegen("schema", "--write", "--path", "link.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISLNK(os.lstat(tmp_path / "link.json").st_mode)
    assert (tmp_path / "shared" / "schema.json").read_text(encoding="utf-8") == schema_text()
    assert sorted(os.listdir(tmp_path / "shared")) == ["schema.json"]


@pytest.mark.parametrize(
    ("name", "shown", "fix"),
    [
        ("my schema.json", "my schema.json", "--path 'my schema.json'"),
        ("a\nb.json", "'a\\nb.json'", "--path 'a\\nb.json'"),
    ],
    ids=["space", "newline"],
)
def test_missing_file_message_is_one_line_with_a_runnable_fix(name, shown, fix, tmp_path):
    result = run_moegen("schema", "--check", "--path", name, cwd=tmp_path)
    assert result.returncode == 1
    assert _one_line(result.stderr) == f"missing: {shown} (run `moegen schema --write {fix}`)"
