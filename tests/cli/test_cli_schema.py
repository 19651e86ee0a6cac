"""`moegen schema`: the committed JSON Schema is fresh, --check and --write, and every example
spec names it in its editor modeline."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLE_NAMES, EXAMPLE_SPECS, assert_no_traceback, run_moegen

from moegen.schema import schema_text

MODELINE = "# yaml-language-server: $schema=moegen.schema.json"


# ---------------------------------------------------------------------------------------
# schema and the editor modeline


def test_schema_check_passes_in_the_repository(repo_root):
    result = run_moegen("schema", "--check", cwd=repo_root)
    assert result.returncode == 0, result.stderr
    assert "specs/moegen.schema.json is fresh" in result.stderr


def test_schema_prints_the_committed_schema(repo_root, invoke_main):
    result = invoke_main("schema", cwd=repo_root)
    assert result.code == 0
    committed = (repo_root / "specs" / "moegen.schema.json").read_text(encoding="utf-8")
    assert result.stdout == committed == schema_text()
    json.loads(result.stdout)


def test_schema_check_fails_when_stale(tmp_project):
    path = tmp_project / "specs" / "moegen.schema.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["title"] = "an older schema"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    result = run_moegen("schema", "--check", cwd=tmp_project)
    assert result.returncode == 1
    assert "stale: specs/moegen.schema.json (run `moegen schema --write`)" in result.stderr
    assert_no_traceback(result.stderr)


def test_schema_check_fails_when_missing_and_write_repairs_it(tmp_project, invoke_main):
    path = tmp_project / "specs" / "moegen.schema.json"
    path.unlink()
    missing = invoke_main("schema", "--check", cwd=tmp_project)
    assert missing.code == 1
    assert "missing: specs/moegen.schema.json (run `moegen schema --write`)" in missing.stderr
    result = invoke_main("schema", "--write", cwd=tmp_project)
    assert result.code == 0
    assert path.read_text(encoding="utf-8") == schema_text()
    assert invoke_main("schema", "--check", cwd=tmp_project).code == 0
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("spec", EXAMPLE_SPECS, ids=EXAMPLE_NAMES)
def test_every_spec_starts_with_the_schema_modeline(spec):
    assert spec.read_text(encoding="utf-8").splitlines()[0] == MODELINE
    assert (spec.parent / "moegen.schema.json").is_file()


def test_schema_path_option_writes_and_checks_elsewhere(tmp_path):
    # a project of a user's own: no specs/ directory, the schema beside their specs
    result = run_moegen("schema", "--write", "--path", "config/moe.schema.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "config" / "moe.schema.json").read_text(encoding="utf-8") == schema_text()
    fresh = run_moegen("schema", "--check", "--path", "config/moe.schema.json", cwd=tmp_path)
    assert fresh.returncode == 0 and "config/moe.schema.json is fresh" in fresh.stderr
    gone = run_moegen("schema", "--check", "--path", "other.json", cwd=tmp_path)
    assert gone.returncode == 1
    assert "missing: other.json (run `moegen schema --write --path other.json`)" in gone.stderr


@pytest.mark.parametrize("command", ["validate", "check"])
def test_no_specs_here_is_a_usage_error_not_a_pass(command, tmp_path):
    result = run_moegen(command, cwd=tmp_path)
    assert result.returncode == 2
    assert "no specs to check: specs/ holds no *.yaml here" in result.stderr
    assert_no_traceback(result.stderr)
