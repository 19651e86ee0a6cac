"""`moegen check`: valid specs, fresh modules (with a diff when stale), none missing or orphaned."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLE_NAMES, assert_no_traceback, run_moegen, snapshot

from moegen.check import check


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, (old, path)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def test_check_passes_in_the_repository(repo_root):
    result = run_moegen("check", cwd=repo_root)
    assert result.returncode == 0, result.stderr
    assert f"{len(EXAMPLE_NAMES)} generated module(s) fresh" in result.stderr
    assert result.stdout == ""


def test_check_passes_in_a_copy(tmp_project):
    before = snapshot(tmp_project)
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 0, result.stderr
    assert f"{len(EXAMPLE_NAMES)} generated module(s) fresh" in result.stderr
    assert snapshot(tmp_project) == before  # check never writes


def test_changed_number_makes_the_module_stale_with_a_unified_diff(tmp_project):
    edit(tmp_project / "specs" / "mixtral_small_cpu.yaml", "seq_len: 256", "seq_len: 128")
    before = snapshot(tmp_project)
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1, result.stderr
    out = result.stdout
    assert "--- generated/mixtral_small_cpu.py (committed)" in out
    assert "+++ generated/mixtral_small_cpu.py (from specs/mixtral_small_cpu.yaml)" in out
    assert "@@ " in out
    assert "\n-SEQ_LEN = 256\n" in out and "\n+SEQ_LEN = 128\n" in out
    assert "\n-# spec-sha256: " in out and "\n+# spec-sha256: " in out
    # Only the stale module is in the diff; the others are fresh.
    assert out.count("--- generated/") == 1
    assert "stale: generated/mixtral_small_cpu.py (run `moegen build` on its spec)" in result.stderr
    assert "missing" not in result.stderr and "orphaned" not in result.stderr
    assert_no_traceback(result.stdout + result.stderr)
    assert snapshot(tmp_project) == before


def test_comment_only_change_makes_the_module_stale(tmp_project):
    """The header records the spec's hash, so any byte of the spec matters."""
    path = tmp_project / "specs" / "qwen3_moe_fsdp_cpu.yaml"
    path.write_text(path.read_text(encoding="utf-8") + "# a note\n", encoding="utf-8")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    diff_lines = [
        line
        for line in result.stdout.splitlines()
        if line and line[0] in "+-" and not line.startswith(("---", "+++"))
    ]
    assert len(diff_lines) == 2 and all("# spec-sha256: " in line for line in diff_lines)


def test_hand_edited_module_is_stale(tmp_project):
    edit(tmp_project / "generated" / "qwen3_moe_fsdp_cpu.py", "TOP_K = 8", "TOP_K = 7")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    assert "\n-TOP_K = 7\n" in result.stdout and "\n+TOP_K = 8\n" in result.stdout
    assert "stale: generated/qwen3_moe_fsdp_cpu.py" in result.stderr


def test_deleted_module_is_missing(tmp_project):
    (tmp_project / "generated" / "sigmoid_top1_data_cpu.py").unlink()
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    assert "missing: generated/sigmoid_top1_data_cpu.py (run `moegen build` on its spec)" in (
        result.stderr
    )
    assert result.stdout == ""
    assert_no_traceback(result.stderr)


def test_missing_generated_directory(tmp_project):
    for path in (tmp_project / "generated").iterdir():
        path.unlink()
    (tmp_project / "generated").rmdir()
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    assert result.stderr.count("missing: generated/") == len(EXAMPLE_NAMES)
    assert_no_traceback(result.stderr)


def test_orphan_module_is_reported(tmp_project):
    (tmp_project / "generated" / "extra.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_project / "generated" / "sub").mkdir()
    (tmp_project / "generated" / "sub" / "nested.py").write_text("y = 2\n", encoding="utf-8")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    assert "orphaned: generated/extra.py" in result.stderr
    assert "orphaned: generated/sub/nested.py" in result.stderr
    assert_no_traceback(result.stderr)


def test_module_whose_spec_was_deleted_is_orphaned(tmp_project):
    (tmp_project / "specs" / "qwen3_moe_fsdp_cpu.yaml").unlink()
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 1
    assert "orphaned: generated/qwen3_moe_fsdp_cpu.py" in result.stderr


def test_pycache_is_not_an_orphan(tmp_project):
    cache = tmp_project / "generated" / "__pycache__"
    cache.mkdir()
    (cache / "mixtral_small_cpu.cpython-312.pyc").write_bytes(b"\x00")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 0, result.stderr


def test_explicit_specs_do_not_look_for_orphans(tmp_project):
    (tmp_project / "generated" / "extra.py").write_text("x = 1\n", encoding="utf-8")
    result = run_moegen("check", "specs/mixtral_small_cpu.yaml", cwd=tmp_project)
    assert result.returncode == 0, result.stderr
    assert "1 generated module(s) fresh" in result.stderr


def test_invalid_spec_exits_3_with_located_diagnostic(tmp_project):
    edit(tmp_project / "specs" / "mixtral_small_cpu.yaml", "top_k: 2", "top_k: 9")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 3
    assert (
        "specs/mixtral_small_cpu.yaml:9:10: router.top_k: must be <= layer.num_experts (8), got 9"
        in result.stderr
    )
    # Its committed module is neither orphaned nor reported stale.
    assert "orphaned" not in result.stderr
    assert "mixtral_small_cpu.py" not in result.stdout
    assert_no_traceback(result.stdout + result.stderr)


def test_invalid_spec_wins_over_stale_output(tmp_project):
    edit(tmp_project / "specs" / "mixtral_small_cpu.yaml", "version: 1", "version: 2")
    edit(tmp_project / "specs" / "qwen3_moe_fsdp_cpu.yaml", "seq_len: 128", "seq_len: 64")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 3
    assert "specs/mixtral_small_cpu.yaml:2:10: version" in result.stderr
    assert "stale: generated/qwen3_moe_fsdp_cpu.py" in result.stderr


def test_unparseable_spec_exits_3(tmp_project):
    (tmp_project / "specs" / "broken.yaml").write_text("layer: [unclosed\n", encoding="utf-8")
    result = run_moegen("check", cwd=tmp_project)
    assert result.returncode == 3
    assert "specs/broken.yaml:" in result.stderr and "invalid YAML" in result.stderr
    assert_no_traceback(result.stdout + result.stderr)


def test_check_with_out_option(tmp_project):
    (tmp_project / "generated").rename(tmp_project / "elsewhere")
    result = run_moegen("check", "--out", "elsewhere", cwd=tmp_project)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------
# The library function behind the command


def test_check_report(tmp_project, monkeypatch):
    monkeypatch.chdir(tmp_project)
    edit(tmp_project / "specs" / "mixtral_small_cpu.yaml", "batch: 16", "batch: 32")
    (tmp_project / "generated" / "sigmoid_top1_data_cpu.py").unlink()
    (tmp_project / "generated" / "extra.py").write_text("", encoding="utf-8")
    specs = sorted(Path("specs").glob("*.yaml"))
    report = check(specs, Path("generated"), find_orphans=True)
    assert not report.ok
    assert list(report.stale) == [Path("generated/mixtral_small_cpu.py")]
    assert report.missing == [Path("generated/sigmoid_top1_data_cpu.py")]
    assert report.orphans == [Path("generated/extra.py")]
    untouched = {"mixtral_small_cpu.py", "sigmoid_top1_data_cpu.py"}
    assert sorted(report.fresh) == sorted(
        Path("generated") / f"{spec.stem}.py"
        for spec in specs
        if f"{spec.stem}.py" not in untouched
    )
    assert report.invalid == []


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_check_report_fresh_per_spec(name, repo_root, monkeypatch):
    monkeypatch.chdir(repo_root)
    report = check([Path("specs") / f"{name}.yaml"], Path("generated"), find_orphans=False)
    assert report.ok and report.fresh == [Path("generated") / f"{name}.py"]


# ---------------------------------------------------------------------------------------
# Damaged modules: bytes are compared, the report is readable, nothing crashes

MIXTRAL = "generated/mixtral_small_cpu.py"


def _check_mixtral(tmp_project):
    return run_moegen("check", "specs/mixtral_small_cpu.yaml", cwd=tmp_project)


def test_crlf_module_is_stale_and_says_so(tmp_project):
    path = tmp_project / MIXTRAL
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    result = _check_mixtral(tmp_project)
    assert result.returncode == 1, result.stderr
    lines = path.read_bytes().count(b"\r\n")
    assert f"stale: {MIXTRAL} (only line endings differ (CRLF on {lines} lines); run" in (
        result.stderr
    )
    assert result.stdout == ""  # no diff of every line
    assert_no_traceback(result.stdout + result.stderr)


def test_one_crlf_line_shows_in_the_diff(tmp_project):
    path = tmp_project / MIXTRAL
    path.write_bytes(path.read_bytes().replace(b"TOP_K = 2\n", b"TOP_K = 2\r\n"))
    result = _check_mixtral(tmp_project)
    assert result.returncode == 1
    assert "\n-TOP_K = 2\\r\n+TOP_K = 2\n" in result.stdout
    assert "only line endings differ (CRLF on 1 lines)" in result.stderr


def test_invalid_utf8_module_is_stale_not_a_crash(tmp_project):
    path = tmp_project / MIXTRAL
    data = path.read_bytes()
    at = data.index(b"TOP_K = 2")
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at:])
    result = _check_mixtral(tmp_project)
    assert result.returncode == 1, result.stderr
    assert f"not UTF-8 at byte {at}" in result.stderr
    assert "\n-\ufffd\ufffdTOP_K = 2\n+TOP_K = 2\n" in result.stdout
    assert_no_traceback(result.stdout + result.stderr)


def test_bom_missing_newline_and_control_characters(tmp_project):
    path = tmp_project / MIXTRAL
    data = path.read_bytes()
    path.write_bytes(
        b"\xef\xbb\xbf" + data.replace(b"TOP_K = 2", b"TOP_K = 2\x1b[2J\xe2\x80\xae")[:-1]
    )
    result = _check_mixtral(tmp_project)
    assert result.returncode == 1
    assert "starts with a UTF-8 byte-order mark" in result.stderr
    assert "no newline at end of file" in result.stderr
    assert "-TOP_K = 2\\x1b[2J\\u202e\n" in result.stdout
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout


def test_module_that_is_a_directory_is_unreadable_not_missing(tmp_project):
    path = tmp_project / MIXTRAL
    path.unlink()
    path.mkdir()
    result = _check_mixtral(tmp_project)
    assert result.returncode == 1
    assert f"unreadable: {MIXTRAL}: Is a directory" in result.stderr
    assert_no_traceback(result.stderr)


def test_module_without_read_permission_is_unreadable(tmp_project):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    path = tmp_project / MIXTRAL
    path.chmod(0)
    result = _check_mixtral(tmp_project)
    path.chmod(0o644)
    assert result.returncode == 1
    assert f"unreadable: {MIXTRAL}: Permission denied" in result.stderr
    assert_no_traceback(result.stderr)


def test_fifo_in_place_of_a_module_does_not_hang(tmp_project):
    import os

    path = tmp_project / MIXTRAL
    path.unlink()
    os.mkfifo(path)
    result = run_moegen("check", "specs/mixtral_small_cpu.yaml", cwd=tmp_project, timeout=60)
    assert result.returncode == 1
    assert f"unreadable: {MIXTRAL}: not a regular file" in result.stderr


def test_orphans_include_symlinks_and_unreadable_directories(tmp_project, monkeypatch):
    import os

    monkeypatch.chdir(tmp_project)
    generated = Path("generated")
    (generated / "link.py").symlink_to("nowhere.py")
    (generated / "linked_dir").symlink_to("..")
    (generated / "locked").mkdir()
    (generated / "locked").chmod(0)
    try:
        report = check(sorted(Path("specs").glob("*.yaml")), generated, find_orphans=True)
    finally:
        (generated / "locked").chmod(0o755)
    assert {generated / "link.py", generated / "linked_dir"} <= set(report.orphans)
    if os.geteuid() != 0:
        assert generated / "locked" in report.unreadable
