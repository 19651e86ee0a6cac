"""A spec is untrusted input (see test_injection.py): its enum values, mapping keys, raw
control characters, and the spec file's name and directory, tried with injection payloads;
each is rejected with a located SpecError on one printable line, or stays inert."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
from conftest import assert_no_traceback, copy_project, run_moegen
from injection_cases import (
    DEFAULTS,
    ENUM_FIELDS,
    NON_PRINTABLE,
    PAYLOADS,
    assert_only_in_string_literal,
    baseline_fixture,  # noqa: F401 (the module-scoped fixture `baseline`)
    exec_module,
    generate_in,
    line_of,
    normalised_dump,
    spec_text,
    write_spec,
    yaml_string,
)

from moegen.diagnostics import SpecError
from moegen.load import load_spec_bytes
from moegen.pipeline import load_valid
from moegen.render import comment_text


def _hostile_values(field: str) -> list[tuple[str, str]]:
    valid = DEFAULTS[field]
    out = []
    for name, text in sorted(PAYLOADS.items()):
        out.append((name, text))
        out.append((f"{valid}+{name}", valid + text))  # a valid prefix must not help
    return out


ENUM_CASES = [
    pytest.param(field, value, id=f"{field}-{label}")
    for field in ENUM_FIELDS
    for label, value in _hostile_values(field)
]


@pytest.mark.parametrize(("field", "value"), ENUM_CASES)
def test_hostile_enum_value_is_rejected_and_located(field, value, tmp_path, invoke_main):
    path = write_spec(tmp_path / "specs", spec_text(**{field: value}))
    with pytest.raises(SpecError) as caught:
        load_valid(path)
    diagnostics = caught.value.diagnostics
    located = [d for d in diagnostics if d.line == line_of(field)]
    assert located, [d.text() for d in diagnostics]
    assert any(d.field.startswith(ENUM_FIELDS[field]) for d in located), [d.text() for d in located]
    assert all(d.file == "specs/probe.yaml" or d.file.endswith("probe.yaml") for d in diagnostics)
    # Through the command line: exit 3, no traceback, nothing generated.
    result = invoke_main("build", "--no-verify", "specs/probe.yaml", cwd=tmp_path)
    assert result.code == 3, result.output
    assert_no_traceback(result.output)
    assert f"probe.yaml:{line_of(field)}:" in result.stderr
    assert not (tmp_path / "generated").exists()
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    "field", [f for f in ENUM_FIELDS if f != "axis"]
)  # keys: see test_hostile_mapping_key_diagnostic_is_one_printable_line
@pytest.mark.parametrize("payload", NON_PRINTABLE)
def test_hostile_enum_value_diagnostic_is_one_printable_line(field, payload, tmp_path):
    path = write_spec(tmp_path / "specs", spec_text(**{field: PAYLOADS[payload]}))
    with pytest.raises(SpecError) as caught:
        load_valid(path)
    for diagnostic in caught.value.diagnostics:
        assert diagnostic.text().isprintable(), repr(diagnostic.text())


@pytest.mark.parametrize("payload", NON_PRINTABLE)
@pytest.mark.parametrize("where", ["mesh.axes key", "top-level key"])
def test_hostile_mapping_key_diagnostic_is_one_printable_line(payload, where, tmp_path):
    if where == "mesh.axes key":
        text = spec_text(axis=PAYLOADS[payload])
    else:
        text = spec_text() + f"{yaml_string(PAYLOADS[payload])}: 1\n"
    path = write_spec(tmp_path / "specs", text)
    with pytest.raises(SpecError) as caught:
        load_valid(path)
    for diagnostic in caught.value.diagnostics:
        assert diagnostic.text().isprintable(), repr(diagnostic.text())


@pytest.mark.parametrize(
    ("field", "payload"),
    [
        ("score", "triple_quote"),
        ("hardware", "nul"),
        ("axis", "dunder_import"),
        ("kernel", "jinja"),
    ],
)
def test_hostile_enum_value_via_real_cli(field, payload, tmp_path):
    write_spec(tmp_path / "specs", spec_text(**{field: PAYLOADS[payload]}))
    for command in (["validate"], ["check"], ["build", "--no-verify"], ["plan"]):
        result = run_moegen(*command, "specs/probe.yaml", cwd=tmp_path)
        assert result.returncode == 3, (command, result.stdout, result.stderr)
        assert_no_traceback(result.stdout + result.stderr)
        assert f"specs/probe.yaml:{line_of(field)}:" in result.stderr
    assert not (tmp_path / "generated").exists()
    assert not (tmp_path / "PWNED").exists()


# ---------------------------------------------------------------------------------------
# Raw (unescaped) hostile characters in the spec file itself


RAW_ACCEPT_OR_REJECT = {
    "line_separator": "\u2028",
    "paragraph_separator": "\u2029",
    "next_line": "\x85",
    "carriage_return": "\r",
}
RAW_CONTROL = {"nul": "\x00", "vertical_tab": "\x0b", "form_feed": "\x0c", "escape": "\x1b"}


def _raw_description_spec(char: str) -> str:
    return spec_text().replace(
        "description: probe", f'description: x{char}import os; os.system("touch PWNED")'
    )


def _assert_rejected_or_inert(tmp_path, invoke_main, baseline, monkeypatch, char):
    path = write_spec(tmp_path / "specs", _raw_description_spec(char))
    result = invoke_main("validate", "specs/probe.yaml", cwd=tmp_path)
    assert_no_traceback(result.output)
    assert result.code in (0, 3), result.output
    if result.code == 3:
        assert "specs/probe.yaml:" in result.stderr
        return
    generated = generate_in(tmp_path, path.relative_to(tmp_path))
    description = generated.loaded.spec.description
    assert_only_in_string_literal(generated.source, description, baseline)
    exec_module(generated.source, tmp_path, monkeypatch)


@pytest.mark.parametrize("char", sorted(RAW_ACCEPT_OR_REJECT))
def test_raw_line_breaking_characters_are_rejected_or_inert(
    char, tmp_path, invoke_main, baseline, monkeypatch
):
    _assert_rejected_or_inert(
        tmp_path, invoke_main, baseline, monkeypatch, RAW_ACCEPT_OR_REJECT[char]
    )


@pytest.mark.parametrize("char", sorted(RAW_CONTROL))
def test_raw_control_characters_are_rejected_and_located(char, tmp_path, invoke_main):
    write_spec(tmp_path / "specs", _raw_description_spec(RAW_CONTROL[char]))
    for command in (["validate"], ["build", "--no-verify"], ["check"]):
        result = invoke_main(*command, "specs/probe.yaml", cwd=tmp_path)
        assert result.code == 3, (command, result.output)
        assert_no_traceback(result.output)
        # Line 2 is the description; the character follows "description: x".
        assert result.stderr.startswith("specs/probe.yaml:2:15: "), result.stderr
        assert result.stderr.rstrip("\n").isprintable(), repr(result.stderr)
    assert not (tmp_path / "generated").exists()


# ---------------------------------------------------------------------------------------
# The spec's file name (module name) and directory (echoed in the header comment)

HOSTILE_STEMS = {
    "close_call": "x'); import os #",
    "triple_quote": 'x"""',
    "newline_import": "x\nimport os",
    "line_separator": "a\u2028b",
    "vertical_tab": "a\x0bb",
    "form_feed": "a\x0cb",
    "dotted": "os.system",
    "dunder": "__init__",
    "space": "a b",
}


@pytest.mark.parametrize("stem", sorted(HOSTILE_STEMS))
def test_hostile_file_name_is_rejected(stem, tmp_path, invoke_main):
    path = write_spec(tmp_path / "specs", spec_text(), HOSTILE_STEMS[stem])
    with pytest.raises(SpecError) as caught:
        load_valid(path)
    assert len(caught.value.diagnostics) == 1
    diagnostic = caught.value.diagnostics[0]
    assert (diagnostic.line, diagnostic.column) == (1, 1)
    assert diagnostic.text().isprintable(), repr(diagnostic.text())
    result = invoke_main("build", "--no-verify", path.relative_to(tmp_path), cwd=tmp_path)
    assert result.code == 3, result.output
    assert_no_traceback(result.output)
    assert result.stderr.strip().isprintable()
    assert not (tmp_path / "generated").exists()


def test_nul_in_module_name_is_rejected():
    """A path cannot hold NUL; the bytes-level entry point must refuse it in the name."""
    with pytest.raises(SpecError, match="Python identifier"):
        load_spec_bytes(spec_text().encode(), "specs/x.yaml", "x\x00import os")


HOSTILE_DIRS_PRINTABLE = {
    "close_call": "'); import os #",
    "triple_quote": '"""',
    "jinja": "{{ p }}",
    "backslash": "a\\b",
    "coding_utf7": "coding:utf_7",
    "coding_equals": "x -*- coding=latin-1 -*-",
    "ruff_noqa": "x # ruff: noqa",
    "type_ignore": "# type: ignore",
    "non_ascii": "日本語",
}
HOSTILE_DIRS_NON_PRINTABLE = {
    "newline": "x\nimport os",
    "line_separator": "x\u2028y",
    "vertical_tab": "x\x0by",
    "form_feed": "x\x0cy",
    "escape": "x\x1b[2J",
    "carriage_return": "x\ry",
}


@pytest.mark.parametrize("directory", sorted(HOSTILE_DIRS_PRINTABLE))
def test_printable_hostile_directory_stays_in_the_header_comment(
    directory, tmp_path, baseline, invoke_main, monkeypatch
):
    name = HOSTILE_DIRS_PRINTABLE[directory]
    write_spec(tmp_path / name, spec_text())
    relative = Path(name) / "probe.yaml"
    result = invoke_main("build", "--no-verify", relative, cwd=tmp_path)
    assert result.code == 0, result.output
    source = (tmp_path / "generated" / "probe.py").read_text(encoding="utf-8")
    assert normalised_dump(source) == normalised_dump(baseline)

    # Every token but the comments is the baseline's; the path sits in the first comment.
    def code_tokens(text: str) -> list[tuple[int, str]]:
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        return [(t.type, t.string) for t in tokens if t.type != tokenize.COMMENT]

    assert code_tokens(source) == code_tokens(baseline)
    lines = source.splitlines()
    assert lines[0] == f"# Code generated by moegen {_version()}. DO NOT EDIT."
    assert lines[2] == f"# spec: {comment_text(relative.as_posix())}"
    # Inert: printable ASCII, the template's '#' the only one, no encoding declaration.
    assert lines[2].isascii() and lines[2].isprintable() and lines[2].count("#") == 1
    assert not re.search(r"coding[:=]", lines[2], re.IGNORECASE)
    assert lines[3:] == baseline.splitlines()[3:]
    exec_module(source, tmp_path, monkeypatch)


@pytest.mark.parametrize("directory", sorted(HOSTILE_DIRS_NON_PRINTABLE))
def test_non_printable_directory_is_rejected(directory, tmp_path, invoke_main):
    name = HOSTILE_DIRS_NON_PRINTABLE[directory]
    write_spec(tmp_path / name, spec_text())
    relative = Path(name) / "probe.yaml"
    with pytest.raises(SpecError, match="printable"):
        load_valid(tmp_path / relative)
    result = invoke_main("build", "--no-verify", relative, cwd=tmp_path)
    assert result.code == 3, result.output
    assert_no_traceback(result.output)
    assert "file path must be printable" in result.stderr
    assert result.stderr.rstrip("\n").isprintable(), repr(result.stderr)
    assert not (tmp_path / "generated").exists()


def test_render_refuses_a_non_printable_spec_display():
    # A display name with newlines ends the header comment; a file-level ruff noqa directive
    # then switches off the lint that would otherwise catch the displaced imports (E402).
    display = 'specs/x\n# ruff: noqa\n__import__("os").system("touch PWNED")\n#'
    with pytest.raises(SpecError) as caught:
        load_spec_bytes(spec_text().encode(), display, "probe")
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.message == "file path must be printable"
    assert "\n" not in diagnostic.text()


def _version() -> str:
    from moegen import __version__

    return __version__


def test_coding_directory_cannot_make_python_decode_the_module_as_utf7(tmp_path):
    """Issue 16's reproducer: a spec under `coding:utf_7/` whose description hides UTF-7
    encoded code. The path must not become an encoding declaration on lines 1-2, so Python
    reads the module as UTF-8 and the payload stays inside a string constant."""
    project = copy_project(tmp_path)
    payload = "x+ACI-,__import__(+ACI-os+ACI-).system(+ACI-id>PWNED+ACI-)#"
    hostile_dir = project / "coding:utf_7"
    text = (project / "specs" / "mixtral_small_cpu.yaml").read_text(encoding="utf-8")
    text = re.sub(r"(?m)^description: .*$", f"description: {payload}", text)
    write_spec(hostile_dir, text, "evil")
    result = run_moegen(
        "build", "--no-verify", "--out", "out", "coding:utf_7/evil.yaml", cwd=project
    )
    assert result.returncode == 0, result.stderr
    source = (project / "out" / "evil.py").read_bytes()
    for line in source.splitlines()[:2]:
        assert not re.search(rb"coding[:=]", line), line
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", "import evil; print(evil.SPEC_DESCRIPTION)"],
        cwd=project / "out",
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == payload
    assert not list(project.rglob("PWNED"))
