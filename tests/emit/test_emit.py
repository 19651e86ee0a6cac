"""Stage 6, emit: atomic, all-or-nothing writes (the build on failure: test_build_all_or_nothing)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import snapshot

import moegen.emit as emit
from moegen.emit import write_all


def temp_files(directory: Path) -> list[str]:
    """moegen's temporaries, backups, journals and stages under `directory`."""
    return sorted(p.name for p in directory.rglob("*") if ".moegen-" in p.name)


@pytest.fixture
def existing(tmp_path: Path) -> dict[Path, str]:
    """Two targets that already hold old content."""
    files = {tmp_path / "out" / "a.py": "old a\n", tmp_path / "out" / "b.py": "old b\n"}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return files


# ---------------------------------------------------------------------------------------
# write_all


def test_write_all_writes_every_file_and_leaves_no_temporaries(tmp_path):
    files = {
        tmp_path / "out" / "a.py": "a = 1\n",
        tmp_path / "out" / "nested" / "deeper" / "b.py": "b = 'é ü'\n",
        tmp_path / "c.txt": "",
    }
    write_all(files)
    for path, text in files.items():
        assert path.read_bytes() == text.encode("utf-8")
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert temp_files(tmp_path) == []
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.py", "b.py", "c.txt"]


def test_write_all_keeps_newlines_byte_exact(tmp_path):
    target = tmp_path / "m.py"
    write_all({target: "x = 1\ny = 2\n"})
    assert target.read_bytes() == b"x = 1\ny = 2\n"


def test_write_all_replaces_existing_files(existing):
    write_all({path: f"new {path.name}\n" for path in existing})
    for path in existing:
        assert path.read_text(encoding="utf-8") == f"new {path.name}\n"
    assert temp_files(next(iter(existing)).parent) == []


def test_write_all_with_nothing_writes_nothing(tmp_path):
    write_all({})
    assert list(tmp_path.iterdir()) == []


def test_write_all_replaces_rather_than_rewrites_in_place(existing):
    """A reader holding the old file keeps a complete old module (rename, not truncate)."""
    path = next(iter(existing))
    with open(path, encoding="utf-8") as reader:
        write_all({path: "new content\n"})
        assert reader.read() == "old a\n"
    assert path.read_text(encoding="utf-8") == "new content\n"


def test_failure_while_staging_leaves_targets_unchanged(existing, monkeypatch):
    """The second temporary cannot be written: nothing is renamed, no temporary is left."""
    real_write = emit._write_file
    calls = []

    def failing_write(path, blob):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(path, blob)

    monkeypatch.setattr(emit, "_write_file", failing_write)
    with pytest.raises(OSError, match="No space left"):
        write_all({path: "new\n" for path in existing})
    for path, text in existing.items():
        assert path.read_text(encoding="utf-8") == text
    assert temp_files(next(iter(existing)).parent) == []


def test_failure_while_writing_a_temporary_leaves_targets_unchanged(existing):
    """The second text cannot be encoded: the first target is not touched."""
    first, second = existing
    with pytest.raises(UnicodeEncodeError):
        write_all({first: "new a\n", second: "bad \ud800\n"})
    for path, text in existing.items():
        assert path.read_text(encoding="utf-8") == text


def test_failure_while_writing_a_temporary_leaves_no_temporary(existing):
    first, second = existing
    with pytest.raises(UnicodeEncodeError):
        write_all({first: "new a\n", second: "bad \ud800\n"})
    assert temp_files(first.parent) == []


def test_failure_when_the_parent_cannot_be_created(tmp_path, existing):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    first = next(iter(existing))
    with pytest.raises(OSError):
        write_all({first: "new a\n", blocker / "m.py": "x = 1\n"})
    assert first.read_text(encoding="utf-8") == existing[first]
    assert temp_files(tmp_path) == []


def _failing_second_replace(monkeypatch):
    real_replace = os.replace
    calls = []

    def replace(src, dst, *args, **kwargs):
        calls.append(dst)
        if len(calls) == 2:
            raise PermissionError(13, "Permission denied", str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_failed_rename_leaves_no_temporaries(existing, monkeypatch):
    _failing_second_replace(monkeypatch)
    with pytest.raises(PermissionError):
        write_all({path: "new\n" for path in existing})
    assert temp_files(next(iter(existing)).parent) == []


def test_failed_rename_leaves_existing_targets_unchanged(existing, monkeypatch):
    _failing_second_replace(monkeypatch)
    with pytest.raises(PermissionError):
        write_all({path: "new\n" for path in existing})
    for path, text in existing.items():
        assert path.read_text(encoding="utf-8") == text


def test_target_that_is_a_directory_leaves_existing_targets_unchanged(existing, tmp_path):
    blocked = tmp_path / "out" / "c.py"
    blocked.mkdir()
    files = {path: "new\n" for path in existing} | {blocked: "x = 1\n"}
    with pytest.raises(OSError):
        write_all(files)
    for path, text in existing.items():
        assert path.read_text(encoding="utf-8") == text


def test_target_that_is_a_directory_fails_and_leaves_no_temporaries(existing, tmp_path):
    blocked = tmp_path / "out" / "c.py"
    blocked.mkdir()
    with pytest.raises(OSError):
        write_all({blocked: "x = 1\n"})
    assert blocked.is_dir() and list(blocked.iterdir()) == []
    assert temp_files(tmp_path) == []
    for path, text in existing.items():
        assert path.read_text(encoding="utf-8") == text


# ---------------------------------------------------------------------------------------
# The directory swap (write_all with out_dir), its fallback and the recovery of dead runs


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """An output directory with two old modules, a cache, a symlink and an odd mode."""
    out = tmp_path / "gen"
    (out / "__pycache__").mkdir(parents=True)
    (out / "a.py").write_text("old a\n")
    (out / "b.py").write_text("old b\n")
    (out / "__pycache__" / "a.pyc").write_bytes(b"\0")
    (out / "link").symlink_to("a.py")
    out.chmod(0o750)
    return out


def beside(out: Path) -> list[str]:
    """What moegen left next to or inside `out`."""
    return sorted(p.name for p in out.parent.rglob("*") if ".moegen-" in p.name)


def test_swap_replaces_the_directory_and_keeps_the_rest(out):
    cache, before = out / "__pycache__" / "a.pyc", os.stat(out).st_ino
    cache_inode = cache.stat().st_ino
    write_all({out / "a.py": "new a\n", out / "c.py": "c\n"}, out_dir=out)
    assert os.stat(out).st_ino != before  # swapped, not edited
    assert (out / "a.py").read_text() == "new a\n" and (out / "c.py").read_text() == "c\n"
    assert (out / "b.py").read_text() == "old b\n"
    assert cache.stat().st_ino == cache_inode  # hard link, not a copy
    assert os.readlink(out / "link") == "a.py"
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert beside(out) == []


def test_swap_creates_a_missing_directory(tmp_path):
    out = tmp_path / "deep" / "gen"
    write_all({out / "a.py": "a\n"}, out_dir=out)
    assert (out / "a.py").read_text() == "a\n" and beside(out) == []


def test_symlinked_output_directory_stays_a_symlink(out, tmp_path):
    link = tmp_path / "alias"
    link.symlink_to(out.name)
    write_all({link / "a.py": "new a\n"}, out_dir=link)
    assert link.is_symlink() and (out / "a.py").read_text() == "new a\n"


def test_output_directory_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "gen").write_text("a file")
    with pytest.raises(NotADirectoryError):
        write_all({tmp_path / "gen" / "a.py": "a\n"}, out_dir=tmp_path / "gen")


def test_target_that_is_a_directory_fails_the_swap_and_changes_nothing(out):
    (out / "c.py").mkdir()
    before = snapshot(out)
    with pytest.raises(OSError):
        write_all({out / "a.py": "new\n", out / "c.py": "x\n"}, out_dir=out)
    assert snapshot(out) == before and beside(out) == []


@pytest.mark.parametrize(
    "why", ["cwd", "no exchange", "fifo"], ids=["out is the cwd", "EINVAL", "holds a FIFO"]
)
def test_journaled_fallback_writes_in_place(out, monkeypatch, why):
    if why == "cwd":
        monkeypatch.chdir(out)
    elif why == "no exchange":

        def refuse(src, dst, flags):
            raise OSError(22, "Invalid argument")

        monkeypatch.setattr(emit, "_renameat2", refuse)
    else:
        os.mkfifo(out / "pipe")
    before = os.stat(out).st_ino
    write_all({out / "a.py": "new a\n", out / "c.py": "c\n"}, out_dir=out)
    assert os.stat(out).st_ino == before  # written in place, file by file
    assert (out / "a.py").read_text() == "new a\n" and (out / "c.py").read_text() == "c\n"
    assert beside(out) == []


def test_journaled_fallback_rolls_back_a_failed_rename(out, monkeypatch):
    monkeypatch.chdir(out)
    _failing_second_replace(monkeypatch)
    before = snapshot(out)
    with pytest.raises(PermissionError):
        write_all({out / "a.py": "new a\n", out / "c.py": "c\n"}, out_dir=out)
    assert snapshot(out) == before and beside(out) == []


@pytest.mark.parametrize("fallback", [False, True], ids=["swap", "journaled"])
def test_interrupt_after_any_step_leaves_old_or_new(out, monkeypatch, fallback):
    """In-process twin of tests/emit/test_signals.py: KeyboardInterrupt after each step."""
    if fallback:
        monkeypatch.chdir(out)
    steps: list[str] = []
    monkeypatch.setattr(emit, "_trace", steps.append)
    old = snapshot(out)
    files = {out / "a.py": "new a\n", out / "b.py": "new b\n"}
    write_all(files, out_dir=out)
    new = snapshot(out)
    for k in range(len(steps)):
        write_all({out / "a.py": "old a\n", out / "b.py": "old b\n"}, out_dir=out)
        assert snapshot(out) == old
        seen: list[str] = []

        def interrupt(step, seen=seen, k=k):
            seen.append(step)
            if len(seen) == k + 1:
                raise KeyboardInterrupt

        monkeypatch.setattr(emit, "_trace", interrupt)
        with pytest.raises(KeyboardInterrupt):
            write_all(files, out_dir=out)
        monkeypatch.setattr(emit, "_trace", lambda step: None)
        assert snapshot(out) in (old, new), steps[k]
        assert beside(out) == [], steps[k]
