"""A spec is untrusted input: nothing in it may become code in the generated module.

Every string a spec can carry (description, each enum and name-like field, mapping keys,
the spec file's name and directory) is tried with code-injection payloads. Each must be
rejected with a located SpecError (exit 3, no traceback) or reach the module only inside a
string literal, and executing the module must not run the payload.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import copy_project, run_moegen
from injection_cases import (
    DEFAULTS,
    PAYLOADS,
    TEMPLATE,
    assert_only_in_string_literal,
    baseline_fixture,  # noqa: F401 (the module-scoped fixture `baseline`)
    exec_module,
    generate_in,
    spec_text,
    write_spec,
)


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_description_payload_is_only_a_string_constant(payload, tmp_path, baseline, monkeypatch):
    text = PAYLOADS[payload]
    write_spec(tmp_path / "specs", spec_text(description=text))
    generated = generate_in(tmp_path, "specs/probe.yaml")
    assert generated.loaded.spec.description == text
    assert_only_in_string_literal(generated.source, text, baseline)
    namespace = exec_module(generated.source, tmp_path, monkeypatch)
    assert namespace["SPEC_DESCRIPTION"] == text
    assert not (Path.cwd() / "PWNED").exists()


def test_description_payload_in_a_block_scalar(tmp_path, baseline, monkeypatch):
    """Unquoted multi-line text (YAML literal block) is still just a string."""
    block = "|\n" + "".join(f"  {line}\n" for line in PAYLOADS["triple_quote"].splitlines())
    text = TEMPLATE.format(**(DEFAULTS | {"description": block.rstrip("\n")}))
    write_spec(tmp_path / "specs", text)
    generated = generate_in(tmp_path, "specs/probe.yaml")
    assert generated.loaded.spec.description == PAYLOADS["triple_quote"] + "\n"
    assert_only_in_string_literal(generated.source, PAYLOADS["triple_quote"] + "\n", baseline)
    exec_module(generated.source, tmp_path, monkeypatch)


def test_description_payload_through_build_and_a_real_interpreter(tmp_path):
    """End to end: `moegen build --no-verify`, then run the written module with python."""
    project = copy_project(tmp_path)
    write_spec(project / "specs", spec_text(description=PAYLOADS["triple_quote"]), "hostile")
    result = run_moegen("build", "--no-verify", "specs/hostile.yaml", cwd=project)
    assert result.returncode == 0, result.stderr
    module = project / "generated" / "hostile.py"
    assert module.is_file()
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", f"import runpy; runpy.run_path({str(module)!r})"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert not (project / "PWNED").exists()
    assert not (project / "generated" / "PWNED").exists()


# ---------------------------------------------------------------------------------------
# Enum and name-like fields: every hostile value is rejected, located at its line
