"""Hostile inputs (issue 16): specs arrive in pull requests and `moegen check` runs on them in
CI, so every way a file can be malformed on purpose must end in exit 3 with located
diagnostics, each exactly one printable line, promptly: never a traceback, an internal error
(exit 4) or a hang.

tests/hostile/ holds one spec per class, each with the exact diagnostics in its `.expected`
golden; the cases that need a file system trick (a FIFO, a device, a sparse file, a link)
or too many bytes to commit are made here in tmp_path. Time is bounded by the subprocess
timeout only. The golden runner (tests/support/golden_runner.py) checks `moegen validate` against
each golden and writes them after an intended message change:

    MOEGEN_UPDATE_GOLDENS=1 .venv/bin/pytest -n 0 tests/render/test_goldens.py

then read the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from golden_runner import HOSTILE, expected_text

from moegen.diagnostics import MAX_REPORTED, SpecError
from moegen.load import MAX_SPEC_BYTES, load_spec

REPO_ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = HOSTILE.folder  # relative to REPO_ROOT, as shown in messages
CASES = [REPO_ROOT / HOSTILE.case(name) for name in HOSTILE.case_names()]
EXIT_INVALID = 3
TIMEOUT_S = 60  # a hang fails here; generous for a shared, loaded machine
BASE = (REPO_ROOT / CORPUS_DIR / "tag_int_word.yaml").read_text(encoding="utf-8")
VALID = BASE.replace('top_k: !!int "eight"', "top_k: 2")
# What must never reach a terminal or a CI log from a diagnostic.
FORBIDDEN = ["\x00", "\x1b", "\r", "\x85", "\u2028", "\u2029", *map(chr, range(0x202A, 0x202F))]
FORBIDDEN += [*map(chr, range(0x2066, 0x206A))]


def run_cli(*args: str | os.PathLike[str], cwd: Path = REPO_ROOT) -> tuple[int, str, str]:
    """`python -m moegen ARGS`: exit code, stdout, stderr; the raw bytes are checked first
    (no NUL, ESC or other character a diagnostic must never carry, valid UTF-8)."""
    env = {k: v for k, v in os.environ.items() if k != "MOEGEN_DEBUG"}
    env["PYTHONIOENCODING"] = "utf-8"
    done = subprocess.run(
        [sys.executable, "-m", "moegen", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    out, err = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")
    for stream in (out, err):
        assert "Traceback" not in stream, stream
        assert "internal error" not in stream, stream
        for char in FORBIDDEN:
            assert char not in stream, (repr(char), stream)
    return done.returncode, out, err


def assert_one_printable_line_each(lines: list[str]) -> None:
    assert lines
    for line in lines:
        assert line.isprintable(), repr(line)


def from_json(items: list[dict]) -> list[str]:
    """The text form rebuilt from `--format json`: it must say what text says."""
    for item in items:
        assert set(item) == {"file", "line", "column", "field", "message"}
        assert isinstance(item["line"], int) and item["line"] >= 1
        assert isinstance(item["column"], int) and item["column"] >= 1
    return [
        f"{i['file']}:{i['line']}:{i['column']}: "
        + (f"{i['field']}: " if i["field"] else "")
        + i["message"]
        for i in items
    ]


def validate_everywhere(path: str, cwd: Path = REPO_ROOT) -> list[str]:
    """Validate `path` as text, json and github; assert exit 3 and agreement in every format;
    the text diagnostics, one a line."""
    code, out, err = run_cli("validate", path, cwd=cwd)
    assert code == EXIT_INVALID, (code, out, err)
    lines = err.splitlines()
    assert_one_printable_line_each(lines)
    for line in lines:
        assert line.startswith(f"{path}:"), line  # located in this file, nowhere else

    code, out, err = run_cli("validate", "--format", "json", path, cwd=cwd)
    assert code == EXIT_INVALID, (code, out, err)
    assert from_json(json.loads(out)) == lines

    code, out, err = run_cli("validate", "--format", "github", path, cwd=cwd)
    assert code == EXIT_INVALID, (code, out, err)
    github = out.splitlines()
    assert len(github) == len(lines)
    for command, line in zip(github, lines, strict=True):
        assert command.isprintable(), repr(command)
        assert command.startswith("::error file="), command
        assert command.endswith("::" + line.replace("%", "%25")), command
    return lines


# ---------------------------------------------------------------------------------------
# The corpus


def test_the_corpus_base_is_valid() -> None:
    """Each case is this valid spec with one hostile change, so its golden is about that."""
    assert load_spec_text(VALID).spec.router.top_k == 2


def load_spec_text(text: str):
    from moegen.load import load_spec_bytes

    return load_spec_bytes(text.encode("utf-8"), "base.yaml", "base")


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_hostile_case_gives_its_golden_in_every_format(case: Path) -> None:
    path = (CORPUS_DIR / case.name).as_posix()
    lines = validate_everywhere(path)
    actual = "\n".join(lines) + "\n"
    assert actual == expected_text(CORPUS_DIR / case.name)
    # Located on a line that exists, counted as editors count lines ('\n' only).
    last_line = case.read_bytes().count(b"\n") + 1
    for line in lines:
        _, number, column, _ = line.split(":", 3)
        assert 1 <= int(number) <= last_line and int(column) >= 1, line


# ---------------------------------------------------------------------------------------
# Too big to commit: made here


def test_65k_nested_brackets_are_refused_fast(tmp_path: Path) -> None:
    text = "version: 1\nlayer: " + "[" * (MAX_SPEC_BYTES - 40) + "\n"
    assert len(text.encode()) <= MAX_SPEC_BYTES
    (tmp_path / "brackets.yaml").write_text(text, encoding="utf-8")
    [line] = validate_everywhere("brackets.yaml", cwd=tmp_path)
    assert line == (
        "brackets.yaml:2:39: invalid YAML: nesting is deeper than 32 levels; a spec needs about 4"
    )


def test_1500_unknown_keys_are_reported_linearly_and_capped(tmp_path: Path) -> None:
    keys = "".join(f"k{i}: 1\n" for i in range(1500))  # as many as the 16 KiB limit admits
    (tmp_path / "keys.yaml").write_text(VALID + keys, encoding="utf-8")
    lines = validate_everywhere("keys.yaml", cwd=tmp_path)
    assert len(lines) == MAX_REPORTED + 1
    first = VALID.count("\n") + 1
    assert lines[0] == (
        f"keys.yaml:{first}:1: unknown key 'k0'; expected one of: version, description, "
        "layer, router, shapes, dtypes, mesh, parallelism, target, memory"
    )
    assert lines[-1] == (
        f"keys.yaml:{first + MAX_REPORTED}:1: ... and {1500 - MAX_REPORTED} more problems, "
        "from here on; fix the ones above first"
    )


# ---------------------------------------------------------------------------------------
# Paths that are not regular files, and sizes


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.yaml")  # nobody writes: opening it to read would block
    assert validate_everywhere("fifo.yaml", cwd=tmp_path) == [
        "fifo.yaml:1:1: spec path is a named pipe (FIFO), not a regular file; "
        "give a YAML file's path"
    ]


def test_symlink_to_dev_zero_is_refused_without_reading(tmp_path: Path) -> None:
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    assert validate_everywhere("zero.yaml", cwd=tmp_path) == [
        "zero.yaml:1:1: spec path is a character device, not a regular file; "
        "give a YAML file's path"
    ]


def test_directory_is_refused_by_the_loader(tmp_path: Path, monkeypatch) -> None:
    # The CLI's click.Path(dir_okay=False) refuses a directory first, as a usage error.
    (tmp_path / "dir.yaml").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("dir.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "dir.yaml:1:1: spec path is a directory, not a regular file; give a YAML file's path"
    ]


def test_socket_is_refused(tmp_path: Path, monkeypatch) -> None:
    import socket

    monkeypatch.chdir(tmp_path)  # a short relative path: socket paths are limited to 108 bytes
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock.yaml")
        with pytest.raises(SpecError) as info:
            load_spec(Path("sock.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "sock.yaml:1:1: spec path is a socket, not a regular file; give a YAML file's path"
    ]


def test_oversized_file_is_refused_by_its_size_before_reading(tmp_path: Path) -> None:
    with open(tmp_path / "sparse.yaml", "wb") as f:
        f.truncate(10**10)  # sparse: 10 GB reported, nothing to read in time if it were read
    assert validate_everywhere("sparse.yaml", cwd=tmp_path) == [
        f"sparse.yaml:1:1: spec is {10**10} bytes; at most {MAX_SPEC_BYTES} are accepted"
    ]
    (tmp_path / "big.yaml").write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    assert validate_everywhere("big.yaml", cwd=tmp_path) == [
        f"big.yaml:1:1: spec is {MAX_SPEC_BYTES + 1} bytes; at most {MAX_SPEC_BYTES} are accepted"
    ]


def test_file_larger_than_its_stat_says_is_refused(tmp_path: Path, monkeypatch) -> None:
    """A file that grows after fstat (or a /proc file that reports size 0) is read no further
    than the limit + 1 and refused."""
    import moegen.load.spec_file as spec_file

    path = tmp_path / "grows.yaml"
    path.write_text(VALID + "#" * MAX_SPEC_BYTES + "\n", encoding="utf-8")
    real_fstat = os.fstat
    reads: list[int] = []
    real_read = os.read

    def small_fstat(fd: int):
        info = real_fstat(fd)
        return SimpleNamespace(st_mode=info.st_mode, st_size=len(VALID))

    def counted_read(fd: int, n: int) -> bytes:
        reads.append(n)
        return real_read(fd, n)

    monkeypatch.setattr(spec_file.os, "fstat", small_fstat)
    monkeypatch.setattr(spec_file.os, "read", counted_read)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("grows.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        f"grows.yaml:1:1: spec is more than {MAX_SPEC_BYTES} bytes; "
        f"at most {MAX_SPEC_BYTES} are accepted"
    ]
    assert sum(reads) <= MAX_SPEC_BYTES + 1


# ---------------------------------------------------------------------------------------
# File names and the displayed path


def test_250_character_stem_is_refused_located(tmp_path: Path) -> None:
    name = "a" * 250 + ".yaml"  # 255 bytes: the longest name most file systems allow
    (tmp_path / name).write_text(VALID, encoding="utf-8")
    assert validate_everywhere(name, cwd=tmp_path) == [
        f"{name}:1:1: file name is 250 characters long; at most 100 can name the generated "
        "module, e.g. 'mixtral_8x7b.yaml'"
    ]


def test_ligature_stem_is_refused(tmp_path: Path) -> None:
    # Python reads identifiers in NFKC form: 'ﬁle.py' would be imported as 'file'.
    (tmp_path / "\ufb01le.yaml").write_text(VALID, encoding="utf-8")
    assert validate_everywhere("\ufb01le.yaml", cwd=tmp_path) == [
        "\ufb01le.yaml:1:1: file name '\ufb01le' must be ASCII letters, digits and '_' (it names "
        "the generated module; Python would import '\ufb01le' as 'file'), e.g. 'mixtral_8x7b.yaml'"
    ]


def test_symlinked_spec_is_shown_by_the_path_given(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "target_name.yaml").write_text(
        VALID.replace("top_k: 2", "top_k: 0"), encoding="utf-8"
    )
    (tmp_path / "link_name.yaml").symlink_to("specs/target_name.yaml")
    assert validate_everywhere("link_name.yaml", cwd=tmp_path) == [
        "link_name.yaml:9:10: router.top_k: must be > 0, got 0"
    ]
