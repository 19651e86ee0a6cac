"""Stage 1, `moegen.load`, on untrusted input (issue 16): limits, positions, escaping, diagnostics. The CLI side is tests/load/test_hostile_inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from load_cases import MINIMAL, errors, load

from moegen.diagnostics import Diagnostic, SpecError
from moegen.load import (
    MAX_SPEC_BYTES,
    describe,
    display_path,
    dotted,
    load_spec,
)

# ---------------------------------------------------------------------------------------
# Untrusted input (issue 16): limits, positions, escaping. The CLI side is
# tests/load/test_hostile_inputs.py.


def test_nesting_up_to_the_limit_loads_and_one_more_is_refused() -> None:
    from moegen.load.yaml_limits import MAX_DEPTH

    # The document is level 1; `description` holds the rest.
    deep = "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)
    found = errors(MINIMAL + f"description: {deep}\n")
    assert found == [(6, 14, "description", "must be a string, got a list")]
    deeper = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert errors(MINIMAL + f"description: {deeper}\n") == [
        (
            6,
            14 + MAX_DEPTH - 1,
            "",
            "invalid YAML: nesting is deeper than 32 levels; a spec needs about 4",
        )
    ]


def test_nesting_in_flow_mappings_and_block_sequences_is_counted() -> None:
    assert errors("a: " + "{b: " * 40 + "1" + "}" * 40 + "\n")[0][:2] == (1, 128)
    # Line n (n >= 2) opens level n: the root mapping is level 1.
    assert errors("a:\n" + "".join(" " * i + "-\n" for i in range(1, 40)))[0][:2] == (33, 33)


@pytest.mark.parametrize(
    ("value", "loaded"), [("1" * 30, int("1" * 30)), ("-" + "1" * 30, -int("1" * 30))]
)
def test_30_digit_integers_load(value: str, loaded: int) -> None:
    from moegen.load import SpecSource
    from moegen.load.yaml_nodes import parse_yaml as _parse_yaml

    data, _ = _parse_yaml(SpecSource("x.yaml", "x", f"v: {value}\n", ""))
    assert data["v"] == loaded


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1" * 31, "integer has 31 digits; at most 30 are accepted"),
        ("9" * 5000, "integer has 5000 digits; at most 30 are accepted"),
        ("0." + "0" * 40 + "1", "number has 42 digits; at most 30 are accepted"),
        ("1" * 20 + "." + "1" * 11, "number has 31 digits; at most 30 are accepted"),
    ],
)
def test_overlong_numbers_are_refused_located(value: str, message: str) -> None:
    assert errors(MINIMAL.replace("batch: 2", f"batch: {value}")) == [
        (4, 17, "shapes.batch", message)
    ]


@pytest.mark.parametrize("digit", ["\u0668", "\uff18", "\u0e58"])  # Arabic-Indic, fullwidth, Thai
def test_non_ascii_digits_are_text_not_numbers(digit: str) -> None:
    # The core-schema patterns match [0-9] only (ASCII, unlike \d or int()).
    assert errors(MINIMAL.replace("top_k: 1", f"top_k: {digit}")) == [
        (3, 17, "router.top_k", f"must be an integer, got '{digit}'")
    ]


@pytest.mark.parametrize(
    ("char", "shown"),
    [("\x00", "U+0000"), ("\x07", "U+0007"), ("\x1b", "U+001B"), ("\x7f", "U+007F")],
)
def test_control_character_message_names_it_and_its_escape(char: str, shown: str) -> None:
    escape = f"\\x{ord(char):02x}"
    assert errors(f"version: 1\ndescription: a{char}b\n") == [
        (
            2,
            15,
            "",
            f"invalid YAML: control character {shown} is not allowed raw (YAML does not allow "
            f"it); write it as {escape} inside double quotes",
        )
    ]


@pytest.mark.parametrize("char", ["\x85", "\u2028", "\u2029", "\r", "\u202e", "\u2066"])
def test_raw_line_breaks_and_bidi_controls_are_refused_at_their_line(char: str) -> None:
    # In a comment on line 2: PyYAML would end the comment there and read what follows.
    text = f"version: 1\n# note{char}router: {{top_k: 1}}\n"
    [(line, col, field, message)] = errors(text)
    assert (line, col, field) == (2, 7, "")
    assert f"U+{ord(char):04X}" in message and "inside double quotes" in message


def test_crlf_line_ends_are_accepted_and_counted_once() -> None:
    text = MINIMAL.replace("\n", "\r\n").replace("batch: 2", "batch: 0")
    assert errors(text) == [(4, 17, "shapes.batch", "must be > 0, got 0")]


def test_columns_count_characters_and_skip_a_byte_order_mark() -> None:
    assert errors("\ufeffversion: 2\n" + MINIMAL.split("\n", 1)[1])[0][:3] == (1, 10, "version")
    text = MINIMAL + "description: ééé\n" + "layer: 1\n"
    assert errors(text)[0][:2] == (7, 1)
    assert errors("# ééé é\nversion: [1, 2\n")[0][:2] == (3, 1)


def test_escaped_line_separators_in_quoted_text_are_accepted() -> None:
    text = MINIMAL + 'description: "a\\u2028b\\Lc\\x85d\\u202ee"\n'
    assert load(text).spec.description == "a\u2028b\u2028c\x85d\u202ee"


def test_unknown_key_is_escaped_and_cut_short() -> None:
    [(_, _, _, message)] = errors(MINIMAL + '"x\\nfake.yaml:1:1: forged\\e": 1\n')
    assert message.startswith("unknown key 'x\\nfake.yaml:1:1: forged\\x1b'; expected one of:")
    [(_, _, _, message)] = errors(MINIMAL + "? " + "k" * 5000 + "\n: 1\n")
    assert message.startswith("unknown key '" + "k" * 56 + "...; expected one of:")


def test_user_keys_in_field_paths_are_escaped_and_cut_short() -> None:
    assert dotted(("mesh", "axes", "a\u202eb")) == "mesh.axes['a\\u202eb']"
    assert dotted(("mesh", "axes", "k" * 500)) == "mesh.axes['" + "k" * 56 + "...]"


def test_non_string_key_is_shown_escaped() -> None:
    assert errors(MINIMAL + "9" * 100 + ": 1\n") == [
        (6, 1, "", "keys must be strings, got " + "9" * 57 + "...; quote it")
    ]


def test_describe_escapes_text() -> None:
    assert describe("a\nb\x1b\u202e") == "'a\\nb\\x1b\\u202e'"


def test_many_unknown_keys_are_linear_and_capped() -> None:
    from moegen.diagnostics import MAX_REPORTED

    found = errors(MINIMAL + "".join(f"k{i}: 1\n" for i in range(1500)))
    assert len(found) == MAX_REPORTED + 1
    assert found[-1] == (
        6 + MAX_REPORTED, 1, "", "... and 1400 more problems, from here on; fix the ones above first"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "start"),
    [
        ("\ufb01le", "file name '\ufb01le' must be ASCII letters, digits and '_' (it names the "
         "generated module; Python would import '\ufb01le' as 'file')"),
        ("caf\u00e9", "file name 'caf\u00e9' must be ASCII letters, digits and '_' (it names the "
         "generated module)"),
        ("a\u2028b", "file name 'a\\u2028b' must be ASCII"),
        ("a" * 101, "file name is 101 characters long; at most 100 can name the generated module"),
    ],
)  # fmt: skip
def test_module_name_must_be_short_ascii(name: str, start: str) -> None:
    [(line, col, field, message)] = errors(MINIMAL, name=name)
    assert (line, col, field) == (1, 1, "")
    assert message.startswith(start), message


def test_module_name_of_100_characters_is_accepted() -> None:
    assert load(MINIMAL, name="a" * 100).source.name == "a" * 100


def test_display_path_names_a_symlink_not_its_target(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "real.yaml").write_text(MINIMAL, encoding="utf-8")
    (tmp_path / "link.yaml").symlink_to("specs/real.yaml")
    monkeypatch.chdir(tmp_path)
    loaded = load_spec(Path("link.yaml"))
    assert (loaded.source.display, loaded.source.name) == ("link.yaml", "link")
    assert display_path(tmp_path / "link.yaml") == "link.yaml"
    assert display_path(Path("specs/../link.yaml")) == "link.yaml"
    assert display_path(Path("../elsewhere.yaml")) == "../elsewhere.yaml"


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null"])
def test_symlink_to_a_device_is_refused(tmp_path: Path, monkeypatch, target: str) -> None:
    (tmp_path / "dev.yaml").symlink_to(target)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("dev.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "dev.yaml:1:1: spec path is a character device, not a regular file; give a YAML file's path"
    ]


def test_fifo_is_refused_without_blocking(tmp_path: Path, monkeypatch) -> None:
    import os

    os.mkfifo(tmp_path / "pipe.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match="named pipe"):
        load_spec(Path("pipe.yaml"))


def test_dangling_symlink_cannot_be_read(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "gone.yaml").symlink_to("absent.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        load_spec(Path("gone.yaml"))
    assert [d.text() for d in info.value.diagnostics] == [
        "gone.yaml:1:1: cannot read spec: No such file or directory"
    ]


def test_file_at_the_size_limit_loads_and_one_byte_more_is_refused_by_stat(
    tmp_path: Path, monkeypatch
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(MINIMAL + "#" * (MAX_SPEC_BYTES - len(MINIMAL) - 1) + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert load_spec(Path("big.yaml")).spec.layer.embed_dim == 32
    with path.open("ab") as f:
        f.write(b"\n")
    with pytest.raises(SpecError) as info:
        load_spec(Path("big.yaml"))
    assert [d.message for d in info.value.diagnostics] == [
        f"spec is {MAX_SPEC_BYTES + 1} bytes; at most {MAX_SPEC_BYTES} are accepted"
    ]


# ---------------------------------------------------------------------------------------
# Diagnostics: always one printable line, whatever a stage puts in them


@pytest.mark.parametrize(
    ("raw", "escaped"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("nul\x00", "nul\\x00"),
        ("\x1b[2J", "\\x1b[2J"),
        ("\x85\u2028\u2029", "\\x85\\u2028\\u2029"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("\U000e0001", "\\U000e0001"),
        ("café ﬁle: ok", "café ﬁle: ok"),  # printable text is kept as written
    ],
)
def test_diagnostic_escapes_every_unprintable_character(raw: str, escaped: str) -> None:
    d = Diagnostic(f"f{raw}.yaml", 1, 2, f"k{raw}", f"m{raw}")
    assert (d.file, d.field, d.message) == (f"f{escaped}.yaml", f"k{escaped}", f"m{escaped}")
    for line in (d.text(), d.github()):
        assert line.isprintable() and "\n" not in line, repr(line)


def test_forged_diagnostic_is_one_line_in_every_format() -> None:
    import json

    from moegen.diagnostics import format_diagnostics

    d = Diagnostic("spec.yaml", 1, 1, "", "got x\nfake.yaml:1:1: forged\x00\x1b[2J")
    for fmt in ("text", "github"):
        [line] = format_diagnostics([d], fmt).splitlines()
        assert line.isprintable() and "\x00" not in line and "\x1b" not in line
    [item] = json.loads(format_diagnostics([d], "json"))
    assert item["message"] == "got x\\nfake.yaml:1:1: forged\\x00\\x1b[2J"


def test_spec_error_caps_the_diagnostics_at_the_first_left_out() -> None:
    from moegen.diagnostics import MAX_REPORTED

    many = [Diagnostic("s.yaml", i, 1, "", "bad") for i in range(1, MAX_REPORTED + 2)]
    assert SpecError(many).diagnostics == sorted(many, key=lambda d: d.line)  # 101: all shown
    more = [*many, Diagnostic("s.yaml", MAX_REPORTED + 2, 1, "", "bad")]
    shown = SpecError(more).diagnostics
    assert shown[:MAX_REPORTED] == more[:MAX_REPORTED]
    assert shown[MAX_REPORTED:] == [
        Diagnostic(
            "s.yaml",
            MAX_REPORTED + 1,
            1,
            "",
            "... and 2 more problems, from here on; fix the ones above first",
        )
    ]
