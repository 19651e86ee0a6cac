"""The `moegen` command line: build, validate, plan, exit codes, no tracebacks (schema:
test_cli_schema)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    EXAMPLE_NAMES,
    EXAMPLE_SPECS,
    GENERATED_DIR,
    LIBTPU_NOISE,
    _clean_env,
    assert_no_traceback,
    run_moegen,
    snapshot,
)

from moegen import __version__
from moegen.cli import cli
from moegen.pipeline import load_valid
from moegen.plan import make_plan

# ---------------------------------------------------------------------------------------
# Entry points, help and version


def test_version():
    result = run_moegen("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"moegen, version {__version__}"


def test_python_dash_m_help_lists_every_command():
    result = run_moegen("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: python -m moegen")
    for command in ("build", "validate", "check", "plan", "schema"):
        assert f"\n  {command} " in result.stdout


@pytest.mark.parametrize("command", ["build", "validate", "check", "plan", "schema"])
def test_every_command_has_help(command, invoke_main, repo_root):
    result = invoke_main(command, "-h", cwd=repo_root)
    assert result.code == 0
    assert result.stdout.startswith(f"Usage: moegen {command}")


def test_help_lists_the_workflow_first(invoke_main, repo_root):
    """`moegen --help` shows init -> validate -> plan -> build -> check in that order (the
    order a user meets them, and says so), then the other commands by name."""
    result = invoke_main("--help", cwd=repo_root)
    section = result.stdout.split("Commands:", 1)[1].splitlines()
    names = [line.split()[0] for line in section if line.startswith("  ")]
    assert names[:5] == ["init", "validate", "plan", "build", "check"], names
    assert names[5:] == sorted(names[5:]) and set(names) == set(cli.commands)
    assert "init -> validate -> plan -> build -> check" in result.stdout


def test_console_script_is_installed(repo_root):
    import subprocess
    import sys

    script = Path(sys.executable).parent / "moegen"
    if not script.exists():
        pytest.skip("moegen console script not installed next to this interpreter")
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, cwd=repo_root, check=False
    )
    assert result.returncode == 0 and __version__ in result.stdout


# ---------------------------------------------------------------------------------------
# Usage errors: exit 2, a usage line, no traceback

USAGE_ERRORS = {
    "no command": [],
    "unknown command": ["frobnicate"],
    "unknown option": ["build", "--frobnicate", "specs/mixtral_small_cpu.yaml"],
    "unknown global option": ["--frobnicate"],
    "build without spec": ["build"],
    "missing spec file": ["build", "--no-verify", "specs/no_such_spec.yaml"],
    "validate missing file": ["validate", "no_such.yaml"],
    "check missing file": ["check", "no_such.yaml"],
    "plan missing file": ["plan", "no_such.yaml"],
    "plan two specs": ["plan", "specs/mixtral_small_cpu.yaml", "specs/qwen3_moe_fsdp_cpu.yaml"],
    "spec is a directory": ["validate", "specs"],
    "bad format": ["validate", "--format", "xml"],
    "out is a file": ["build", "--no-verify", "--out", "README.md", "specs/mixtral_small_cpu.yaml"],
    "tune budget nan": ["tune", "--budget", "nan", "specs/mixtral_small_cpu.yaml"],
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_usage_error_exits_2(case, repo_root):
    before = snapshot(repo_root / "generated")
    result = run_moegen(*USAGE_ERRORS[case], cwd=repo_root)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Usage:" in result.stderr
    assert_no_traceback(result.stdout + result.stderr)
    assert snapshot(repo_root / "generated") == before


# ---------------------------------------------------------------------------------------
# User mistakes in spec files: exit 3, located, no traceback

BAD_SPECS = {
    "invalid yaml": "layer: [unclosed\n",
    "empty": "",
    "only a comment": "# nothing here\n",
    "a list": "- 1\n- 2\n",
    "a scalar": "just text\n",
    "tab indentation": "version: 1\nlayer:\n\tnum_experts: 8\n",
    "unknown tag": "version: !!python/object:os.system 1\n",
    "python tag": "version: !!python/name:os.system\n",
    "alias": "a: &x 1\nversion: *x\n",
    "merge key": "base: &b {top_k: 2}\nrouter:\n  <<: *b\n",
    "duplicate key": "version: 1\nversion: 1\n",
    "not utf-8": b"version: 1\ndescription: \xff\xfe\n",
    "too large": "# " + "x" * (64 * 1024) + "\n",
    "wrong version": (GENERATED_DIR.parent / "specs" / "mixtral_small_cpu.yaml")
    .read_text(encoding="utf-8")
    .replace("version: 1", "version: 2"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_exits_3_without_traceback(case, tmp_path, invoke_main):
    content = BAD_SPECS[case]
    path = tmp_path / "specs" / "bad.yaml"
    path.parent.mkdir()
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    for command in (["validate"], ["build", "--no-verify"], ["check"], ["plan"]):
        result = invoke_main(*command, "specs/bad.yaml", cwd=tmp_path)
        assert result.code == 3, (command, result.output)
        assert_no_traceback(result.output)
        lines = result.stderr.strip().splitlines()
        assert lines and all(line.startswith("specs/bad.yaml:") for line in lines), lines
    assert not (tmp_path / "generated").exists()


def test_real_subprocess_invalid_spec_no_traceback(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "bad.yaml").write_text("version: [\n", encoding="utf-8")
    result = run_moegen("build", "specs/bad.yaml", cwd=tmp_path)
    assert result.returncode == 3
    assert result.stderr.startswith("specs/bad.yaml:")
    assert_no_traceback(result.stdout + result.stderr)


# ---------------------------------------------------------------------------------------
# validate


def test_validate_all_specs_text(repo_root):
    result = run_moegen("validate", cwd=repo_root)
    assert result.returncode == 0
    assert result.stderr.strip() == f"{len(EXAMPLE_SPECS)} spec(s) valid"
    assert result.stdout == ""


def test_validate_json_valid(repo_root, invoke_main):
    result = invoke_main("validate", "--format", "json", cwd=repo_root)
    assert result.code == 0
    assert json.loads(result.stdout) == []


def test_validate_github_valid(repo_root, invoke_main):
    result = invoke_main("validate", "--format", "github", cwd=repo_root)
    assert result.code == 0
    assert result.stdout == ""


BROKEN = """\
version: 1
layer:
  num_experts: 8
  embed_dim: 512
  ffn_dim: 1792
router:
  top_k: 10
  score: softmax
shapes:
  batch: 60
  seq_len: 256
mesh:
  axes:
    data: 2
    fsdp: 4
"""


@pytest.fixture
def broken_project(tmp_project: Path) -> Path:
    (tmp_project / "specs" / "broken.yaml").write_text(BROKEN, encoding="utf-8")
    return tmp_project


def test_validate_text_reports_every_problem_located(broken_project, invoke_main):
    result = invoke_main("validate", cwd=broken_project)
    assert result.code == 3
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "specs/broken.yaml:7:10: router.top_k: must be <= layer.num_experts (8), got 10",
        (
            "specs/broken.yaml:10:10: shapes.batch: 60 is not divisible by data*fsdp = 8; "
            "nearest valid: 56 or 64"
        ),
    ]


def test_validate_json_invalid(broken_project):
    result = run_moegen("validate", "--format", "json", "specs/broken.yaml", cwd=broken_project)
    assert result.returncode == 3
    diagnostics = json.loads(result.stdout)
    assert [(d["file"], d["line"], d["column"], d["field"]) for d in diagnostics] == [
        ("specs/broken.yaml", 7, 10, "router.top_k"),
        ("specs/broken.yaml", 10, 10, "shapes.batch"),
    ]
    assert all(set(d) == {"file", "line", "column", "field", "message"} for d in diagnostics)
    assert_no_traceback(result.stderr)


def test_validate_github_invalid(broken_project, invoke_main):
    result = invoke_main("validate", "--format", "github", "specs/broken.yaml", cwd=broken_project)
    assert result.code == 3
    lines = result.stdout.splitlines()
    assert lines == [
        (
            "::error file=specs/broken.yaml,line=7,col=10::specs/broken.yaml:7:10: router.top_k: "
            "must be <= layer.num_experts (8), got 10"
        ),
        (
            "::error file=specs/broken.yaml,line=10,col=10::specs/broken.yaml:10:10: "
            "shapes.batch: 60 is not divisible by data*fsdp = 8; nearest valid: 56 or 64"
        ),
    ]


def test_validate_github_escapes_message_newlines(tmp_path, invoke_main):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "x.yaml").write_text('"a\\nb%": 1\n', encoding="utf-8")
    result = invoke_main("validate", "--format", "github", "specs/x.yaml", cwd=tmp_path)
    assert result.code == 3
    for line in result.stdout.splitlines():
        assert line.startswith("::error file=specs/x.yaml,line=")
    # The key is shown escaped ('a\\nb%'); '%' is still escaped for the runner.
    assert "a\\nb%25" in result.stdout


def test_validate_github_escapes_file_property(tmp_path, invoke_main):
    (tmp_path / "a,b").mkdir()
    (tmp_path / "a,b" / "x.yaml").write_text("version: 2\n", encoding="utf-8")
    result = invoke_main("validate", "--format", "github", "a,b/x.yaml", cwd=tmp_path)
    assert result.code == 3
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("::error file=a%2Cb/x.yaml,line=1,col=") for line in lines)


@pytest.mark.parametrize(
    "stem", ["import", "class", "None", "match", "jax", "numpy", "os", "moegen"]
)
def test_module_name_that_cannot_be_imported_cleanly_is_rejected(stem, tmp_project, invoke_main):
    source = tmp_project / "specs" / "mixtral_small_cpu.yaml"
    (tmp_project / "specs" / f"{stem}.yaml").write_bytes(source.read_bytes())
    for command in (["validate"], ["build", "--no-verify"]):
        result = invoke_main(*command, f"specs/{stem}.yaml", cwd=tmp_project)
        assert result.code == 3, result.output
        assert result.stderr.startswith(f"specs/{stem}.yaml:1:1: file name '{stem}' ")
        assert_no_traceback(result.output)
    assert not (tmp_project / "generated" / f"{stem}.py").exists()


# ---------------------------------------------------------------------------------------
# build


def test_build_no_verify_twice_is_byte_identical_and_matches_committed(tmp_project):
    generated = tmp_project / "generated"
    for path in generated.iterdir():
        path.unlink()
    specs = [f"specs/{p.name}" for p in EXAMPLE_SPECS]
    first = run_moegen("build", "--no-verify", *specs, cwd=tmp_project)
    assert first.returncode == 0, first.stderr
    for name in EXAMPLE_NAMES:
        assert f"wrote generated/{name}.py (not verified)" in first.stderr
    after_first = snapshot(generated)
    second = run_moegen("build", "--no-verify", *specs, cwd=tmp_project)
    assert second.returncode == 0, second.stderr
    assert snapshot(generated) == after_first
    assert after_first == {
        f"{n}.py": (GENERATED_DIR / f"{n}.py").read_bytes() for n in EXAMPLE_NAMES
    }
    assert run_moegen("check", cwd=tmp_project).returncode == 0


def test_build_no_verify_to_another_out_dir(tmp_project, invoke_main):
    result = invoke_main(
        "build",
        "--no-verify",
        "--out",
        "elsewhere/mods",
        "specs/qwen3_moe_fsdp_cpu.yaml",
        cwd=tmp_project,
    )
    assert result.code == 0, result.output
    written = tmp_project / "elsewhere" / "mods" / "qwen3_moe_fsdp_cpu.py"
    assert written.read_bytes() == (GENERATED_DIR / "qwen3_moe_fsdp_cpu.py").read_bytes()
    assert "wrote elsewhere/mods/qwen3_moe_fsdp_cpu.py (not verified)" in result.stderr


@pytest.mark.slow
def test_build_with_verification(tmp_project):
    """The one full CLI build with verification: report on stderr, committed bytes written.
    Run as a user runs it (no JAX_PLATFORMS, libtpu installed): no libtpu start-up noise; and,
    stderr being no terminal, no heartbeat however short its interval."""
    name = "sigmoid_top1_data_cpu"
    target = tmp_project / "generated" / f"{name}.py"
    target.unlink()
    env = _clean_env() | {"MOEGEN_HEARTBEAT_S": "0.05"}
    env.pop("JAX_PLATFORMS", None)
    result = run_moegen("build", f"specs/{name}.yaml", cwd=tmp_project, env=env)
    assert result.returncode == 0, result.stderr
    err = result.stderr
    for step in (
        "load + validate",
        "plan",
        "render",
        "verify: import",
        "verify: twin parity (float32)",
        "verify: twin parity (bfloat16 compute, bfloat16 params)",
        "verify: compile forward ",
        "verify: compile forward+backward",
    ):
        assert f"  {step}" in err, step
    assert "random routing: max rel err" in err and "experts got 0 tokens" in err
    assert "per device: args" in err
    assert f"wrote generated/{name}.py" in err and "(not verified)" not in err
    assert target.read_bytes() == (GENERATED_DIR / f"{name}.py").read_bytes()
    assert result.stdout == ""
    assert_no_traceback(err)
    assert not [word for word in LIBTPU_NOISE if word in err], err
    assert "still running" not in err


def test_build_same_spec_twice_in_one_call(tmp_project, invoke_main):
    spec = "specs/mixtral_small_cpu.yaml"
    result = invoke_main("build", "--no-verify", spec, spec, cwd=tmp_project)
    assert result.code == 0, result.output


# ---------------------------------------------------------------------------------------
# plan


def test_plan_text(repo_root, invoke_main):
    result = invoke_main("plan", "specs/mixtral_small_cpu.yaml", cwd=repo_root)
    assert result.code == 0
    assert result.stdout.startswith("specs/mixtral_small_cpu.yaml -> mixtral_small_cpu.py\n")
    assert "data=2 x fsdp=4 (8 devices)" in result.stdout


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_plan_json_matches_make_plan(name, repo_root, invoke_main):
    result = invoke_main("plan", "--json", f"specs/{name}.yaml", cwd=repo_root)
    assert result.code == 0
    data = json.loads(result.stdout)
    plan = make_plan(load_valid(Path(f"specs/{name}.yaml")))
    expected = json.loads(json.dumps(plan.to_dict() | {"compiled": []}))
    assert data == expected  # without --compile nothing is compiled
    assert data["module_name"] == name and data["moegen_version"] == __version__
