"""Stage 1, `moegen.load`: whole-file problems, unsafe YAML forms, explicit tags, loading from a path."""

from __future__ import annotations

from pathlib import Path

import pytest
from load_cases import MINIMAL, errors, load, tag_message

from moegen.diagnostics import SpecError
from moegen.load import (
    MAX_SPEC_BYTES,
    display_path,
    load_spec,
)

# ---------------------------------------------------------------------------------------
# Whole-file problems


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "spec is empty"),
        ("# nothing\n\n", "spec is empty"),
        ("[1, 2]\n", "spec must be a mapping of sections (version, layer, router, ...)"),
        ("just text\n", "spec must be a mapping of sections (version, layer, router, ...)"),
        ("null\n", "spec is empty"),
    ],
)
def test_document_must_be_a_mapping(text: str, message: str) -> None:
    assert errors(text) == [(1, 1, "", message)]


def test_lone_document_marker_is_an_empty_spec() -> None:
    assert errors("---\n") == [(1, 1, "", "spec is empty")]


@pytest.mark.parametrize(
    ("text", "line", "col", "problem"),
    [
        (
            "a: [1, 2\nb: 3\n",
            2,
            2,
            "expected ',' or ']', but got ':' (while parsing a flow sequence at 1:4)",
        ),
        ("a:\n\tb: 1\n", 2, 1, "tabs cannot indent YAML; use spaces"),
        ("a: 1\n  b: 2\n", 2, 4, "mapping values are not allowed here"),
        (
            "a: 1\n---\nb: 2\n",
            2,
            1,
            "a spec is one YAML document; remove the '---' line and what follows it",
        ),
        (
            "a: 'open\n",
            2,
            1,
            "found unexpected end of stream (while scanning a quoted scalar at 1:4)",
        ),
    ],
)
def test_yaml_syntax_errors_are_located(text: str, line: int, col: int, problem: str) -> None:
    assert errors(text) == [(line, col, "", f"invalid YAML: {problem}")]


def test_size_limit() -> None:
    padded = MINIMAL + "#" * (MAX_SPEC_BYTES - len(MINIMAL) - 1) + "\n"
    assert len(padded.encode()) == MAX_SPEC_BYTES
    assert load(padded).spec.layer.embed_dim == 32
    too_big = padded + "\n"
    assert errors(too_big) == [
        (1, 1, "", f"spec is {MAX_SPEC_BYTES + 1} bytes; at most {MAX_SPEC_BYTES} are accepted")
    ]


def test_not_utf8() -> None:
    assert errors(b"version: 1\ndescription: caf\xe9\n") == [
        (2, 17, "", "spec is not UTF-8 text (byte 0xe9)")
    ]
    assert errors(MINIMAL.encode("utf-16")) == [(1, 1, "", "spec is not UTF-8 text (byte 0xff)")]


@pytest.mark.parametrize("name", ["bad-name", "2fast", "_private", "my spec", "a.b"])
def test_module_name_must_be_an_identifier(name: str) -> None:
    [(line, col, field, message)] = errors(MINIMAL, name=name)
    assert (line, col, field) == (1, 1, "")
    assert message.startswith(f"file name {name!r} must be a Python identifier")


@pytest.mark.parametrize("name", ["class", "import", "None"])
def test_module_name_must_not_be_a_keyword(name: str) -> None:
    errors(MINIMAL, name=name)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x1b"])
def test_control_character_is_a_located_diagnostic(char: str) -> None:
    found = errors(f"version: 1\ndescription: a{char}b\n")
    assert found[0][:2] == (2, 15)


# ---------------------------------------------------------------------------------------
# Unsafe YAML forms: aliases, merge keys, tags

ALIAS_MESSAGE = "YAML aliases are not supported; write the value out"


def test_aliases_refused_at_the_key_that_uses_them() -> None:
    text = MINIMAL.replace("{top_k: 1}", "&r {top_k: 1}") + "parallelism: *r\n"
    assert errors(text) == [(6, 14, "parallelism", ALIAS_MESSAGE)]


def test_alias_of_a_scalar_refused() -> None:
    text = MINIMAL.replace("num_experts: 4", "num_experts: &four 4").replace(
        "batch: 2", "batch: *four"
    )
    assert errors(text) == [(4, 17, "shapes.batch", ALIAS_MESSAGE)]


def test_recursive_alias_does_not_hang() -> None:
    assert errors("a: &x [1, *x]\n") == [(1, 11, "a[1]", ALIAS_MESSAGE)]


def test_alias_in_a_sequence_is_refused() -> None:
    text = MINIMAL.replace("{fsdp: 2, data: 1}", "{fsdp: 2, data: 1}, batch_axes: [&ax fsdp, *ax]")
    [(line, _, field, message)] = errors(text)
    assert (line, field, message) == (5, "mesh.batch_axes[1]", ALIAS_MESSAGE)


def test_alias_in_a_sequence_points_at_the_alias() -> None:
    text = "version: 1\nx: &ax fsdp\ny: [data, *ax]\n"
    [(line, col, field, _)] = errors(text)
    assert (line, col, field) == (3, 11, "y[1]")


def test_merge_key_refused() -> None:
    text = MINIMAL.replace("{top_k: 1}", "&r {top_k: 1}") + "parallelism:\n  <<: *r\n"
    assert errors(text) == [
        (7, 3, "parallelism", "merge keys '<<' are not supported; write the keys out")
    ]


@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ("!!python/object:os.system 'ls'", "!!python/object:os.system"),
        ("!!python/name:os.system", "!!python/name:os.system"),
        ("!!timestamp 2024-01-01", "!!timestamp"),
        ("!custom x", "!custom"),
        ("!<tag:yaml.org,2002:str> x", "!!str"),
        ("!%0A%1B[2J x", "!\n\x1b[2J"),  # percent escapes decode to control characters
    ],
)
def test_unsupported_scalar_tags_refused(value: str, tag: str) -> None:
    text = MINIMAL + f"description: {value}\n"
    assert errors(text) == [(6, 14, "description", tag_message(tag))]


# Every explicit tag is refused, core-schema ones included: each of these used to be
# misread (!!bool "yes" as false, !!null "2048" as null, !!int "٨" as 8) or to crash.
@pytest.mark.parametrize(
    ("value", "tag"),
    [
        ('!!int "eight"', "!!int"),
        ("!!str 8", "!!str"),
        ('!!bool "yes"', "!!bool"),
        ('!!null "2048"', "!!null"),
        ('!!float "x"', "!!float"),
        ('!!int "\u0668"', "!!int"),
        ('!!int " 8 "', "!!int"),
        ("!!int 8", "!!int"),  # even where it changes nothing
        ("!!binary aGVsbG8=", "!!binary"),
        ("!foo 8", "!foo"),
        ("! 8", "!"),  # the non-specific tag
    ],
)
def test_every_explicit_tag_is_refused(value: str, tag: str) -> None:
    text = MINIMAL.replace("top_k: 1", f"top_k: {value}")
    assert errors(text) == [(3, 17, "router.top_k", tag_message(tag))]


def test_tag_on_a_key_is_refused_and_not_echoed() -> None:
    found = errors('? !!int "x\\nfake.yaml:1:1: forged"\n: 1\n')
    assert found == [(1, 3, "", tag_message("!!int"))]


def test_tag_on_the_document_is_refused() -> None:
    assert errors('!!null ""\n') == [(1, 1, "", tag_message("!!null"))]
    assert errors("!!map {}\n") == [(1, 1, "", tag_message("!!map"))]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("mesh: {axes:", "mesh: !!python/object:os.system {axes:"),
        ("router: {top_k: 1}", "router: !!python/object/new:dict {top_k: 1}"),
        (
            "mesh: {axes: {fsdp: 2, data: 1}}",
            "mesh: {axes: {fsdp: 2, data: 1}, batch_axes: !!python/object/apply:os.system [fsdp]}",
        ),
    ],
)
def test_tags_on_collections_refused(old: str, new: str) -> None:
    assert old in MINIMAL
    found = errors(MINIMAL.replace(old, new))
    assert any(message.startswith("YAML tag '!!python/") for *_, message in found), found


# ---------------------------------------------------------------------------------------
# load_spec: from a path


def test_load_spec_from_path_relative_to_cwd(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "specs").mkdir()
    path = tmp_path / "specs" / "tiny.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(Path("specs/tiny.yaml"))
    assert loaded.source.display == "specs/tiny.yaml"
    assert loaded.source.name == "tiny"
    assert display_path(path) == "specs/tiny.yaml"


def test_display_path_outside_cwd_is_kept(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    outside = tmp_path / "elsewhere.yaml"
    assert display_path(outside) == outside.as_posix()


def test_load_spec_missing_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("absent.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "absent.yaml:1:1: cannot read spec: No such file or directory"
    ]


def test_load_spec_refuses_unprintable_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = "new\nline.yaml"
    (tmp_path / name).write_text(MINIMAL, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(Path(name))
    [d] = info.value.diagnostics
    assert d.file == ascii(name)
    assert d.message == "file path must be printable"


@pytest.mark.parametrize(
    ("value", "loaded"),
    [("2024-01-01", "2024-01-01"), ("yes", "yes"), ("on", "on"), ("010", 10), ("1:30", "1:30")],
)
def test_yaml_core_schema_no_yaml_1_1_surprises(value: str, loaded: object) -> None:
    """YAML 1.2 core schema: dates, yes/on and sexagesimal stay strings; 010 is decimal."""
    from moegen.load import SpecSource
    from moegen.load.yaml_nodes import parse_yaml as _parse_yaml

    data, _ = _parse_yaml(SpecSource("x.yaml", "x", f"v: {value}\n", ""))
    assert data["v"] == loaded
