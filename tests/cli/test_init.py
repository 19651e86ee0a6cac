"""`moegen init`: a valid, commented starter with its modeline and schema, written only where
nothing is, and nothing left behind when it cannot be written; `moegen install-te` reaches
the installer from a checkout and from the wheel, which ships it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, assert_no_traceback, run_moegen

from moegen import init as init_module
from moegen import install_te
from moegen.init import InitError, init_spec, starter_names
from moegen.schema import schema_text

MODELINE = "# yaml-language-server: $schema=moegen.schema.json"
# Each accelerator starter is a committed example spec, comments aside.
COMMITTED = {
    "mixtral-8x7b-v5e": "mixtral_8x7b_v5e",
    "qwen3-30b-a3b-v6e": "qwen3_30b_a3b_v6e",
    "deepseek-v3-v5p": "deepseek_v3_v5p",
    "mixtral-8x7b-h100": "mixtral_8x7b_h100",
}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_init_writes_a_valid_starter_with_its_schema_in_a_fresh_directory(tmp_path, invoke_main):
    result = invoke_main("init", cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert "wrote specs/moe.yaml" in result.stderr
    spec = tmp_path / "specs" / "moe.yaml"
    assert spec.read_text(encoding="utf-8").splitlines()[0] == MODELINE
    assert (tmp_path / "specs" / "moegen.schema.json").read_text(encoding="utf-8") == schema_text()
    assert oct(spec.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    assert tree(tmp_path) == ["specs", "specs/moe.yaml", "specs/moegen.schema.json"]
    valid = invoke_main("validate", cwd=tmp_path)
    assert valid.code == 0 and "1 spec(s) valid" in valid.stderr


@pytest.mark.parametrize("model", starter_names())
def test_every_starter_is_valid_where_init_writes_it(model, tmp_path):
    written = init_spec(tmp_path / "layer.yaml", model)
    assert [p.name for p in written] == ["layer.yaml", "moegen.schema.json"]
    text = written[0].read_text(encoding="utf-8")
    assert text.startswith(MODELINE + "\n# Started by `moegen init` (model: ")
    if model in COMMITTED:
        committed = REPO_ROOT / "specs" / f"{COMMITTED[model]}.yaml"
        assert yaml.safe_load(text) == yaml.safe_load(committed.read_text(encoding="utf-8"))


def test_the_starters_are_the_committed_examples_and_a_cpu_one():
    assert sorted(starter_names()) == sorted([*COMMITTED, "cpu"])


@pytest.mark.parametrize("kind", ["file", "dangling symlink", "folder"])
def test_init_never_replaces_what_is_there(kind, tmp_path, invoke_main):
    target = tmp_path / "specs" / "moe.yaml"
    target.parent.mkdir()
    if kind == "file":
        target.write_text("mine\n", encoding="utf-8")
    elif kind == "folder":
        target.mkdir()
    else:
        target.symlink_to(tmp_path / "elsewhere.yaml")
    before = tree(tmp_path)
    result = invoke_main("init", cwd=tmp_path)
    assert result.code == 2
    assert "specs/moe.yaml exists" in result.stderr and "nothing written" in result.stderr
    assert tree(tmp_path) == before
    if kind == "file":
        assert target.read_text(encoding="utf-8") == "mine\n"


def test_an_invalid_module_name_is_located_and_nothing_is_created(tmp_path, invoke_main):
    result = invoke_main("init", "new/dir/my-layer.yaml", cwd=tmp_path)
    assert result.code == 3
    assert "new/dir/my-layer.yaml:1:1: file name 'my-layer' must be a Python identifier" in (
        result.stderr
    )
    assert tree(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["notes.txt"], "a spec file name ends in .yaml"),
        (["--model", "nope", "x.yaml"], "no starter 'nope'; the starters are cpu, "),
        (["afile/moe.yaml"], "afile is not a folder; cannot create afile/moe.yaml under it"),
    ],
)
def test_paths_and_models_init_cannot_use(args, message, tmp_path, invoke_main):
    (tmp_path / "afile").write_text("", encoding="utf-8")
    result = invoke_main("init", *args, cwd=tmp_path)
    assert result.code == 2, result.stderr
    assert message in result.stderr and "nothing written" in result.stderr
    assert_no_traceback(result.stderr)
    assert tree(tmp_path) == ["afile"]


def test_a_failed_write_removes_the_schema_and_the_folders_it_made(tmp_path, monkeypatch):
    real = init_module._write_new

    def fail_on_the_spec(path, text):
        if path.suffix == ".yaml":
            raise InitError(f"cannot write {path}: No space left on device")
        real(path, text)

    monkeypatch.setattr(init_module, "_write_new", fail_on_the_spec)
    with pytest.raises(InitError, match="No space left"):
        init_spec(tmp_path / "a" / "b" / "moe.yaml")
    assert tree(tmp_path) == []


def test_an_existing_schema_is_kept_and_a_stale_one_noted(tmp_path, invoke_main):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "moegen.schema.json").write_text("{}\n", encoding="utf-8")
    result = invoke_main("init", "--model", "mixtral-8x7b-v5e", cwd=tmp_path)
    assert result.code == 0, result.stderr
    assert (tmp_path / "specs" / "moegen.schema.json").read_text(encoding="utf-8") == "{}\n"
    assert "moegen schema --write --path specs/moegen.schema.json" in result.stderr


def test_init_list_names_every_starter(tmp_path, invoke_main):
    result = invoke_main("init", "--list", cwd=tmp_path)
    assert result.code == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == starter_names()
    assert tree(tmp_path) == []


# ---------------------------------------------------------------------------------------
# install-te: the script reachable without a checkout


def test_install_te_runs_the_installer_of_the_checkout(tmp_path):
    assert install_te.script_path() == REPO_ROOT / "scripts" / "install-te"
    result = run_moegen("install-te", tmp_path / "no-venv", cwd=tmp_path)
    assert result.returncode == 1  # the script's own refusal: it was found and ran
    assert f"install-te: error: no venv at {tmp_path / 'no-venv'}" in result.stderr


def test_python_m_install_te_and_a_usage_error(tmp_path):
    run = [sys.executable, "-m", "moegen.install_te"]
    result = subprocess.run([*run, str(tmp_path / "x")], capture_output=True, text=True)
    assert result.returncode == 1 and "no venv at" in result.stderr
    usage = subprocess.run([*run, "--bogus"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: python -m moegen.install_te" in usage.stderr


def test_install_te_outside_a_venv_asks_for_one(monkeypatch):
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    with pytest.raises(ValueError, match="not in a virtual environment"):
        install_te.install_te_args(None, cache_only=False)
    args = install_te.install_te_args(Path("/v"), cache_only=True)
    assert args[1:] == [str(install_te.script_path()), "--cache-only", "/v"]


def test_the_wheel_ships_the_installer_the_stub_and_the_starters(tmp_path):
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("moegen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "moegen/_scripts/install-te",
        "moegen/kernels/libcuda_stub.c",
        "moegen/templates/module.py.jinja",
        *(f"moegen/starters/{name}.yaml" for name in starter_names()),
    }
    assert expected <= names, sorted(expected - names)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
