"""The loader's fast paths change no outcome.

YAML: parse_yaml composes from libyaml's events (moegen/load/yaml_fast.py) and falls back to
the pure-Python loader where libyaml refuses a text or may read it otherwise. Every text here
is parsed both ways (`fast=False` is the pure-Python loader alone) and must give the same
values and locations, or the same diagnostics: every YAML file of the repository (also with
CRLF line ends and a byte-order mark), the spec texts written in the loader's tests, seeded
mutations of the example specs, seeded and Hypothesis-drawn token soups (non-ASCII, tabs,
comments, BOMs, flow collections, anchors, aliases, tags, block scalars, document markers),
generated specs, and one text per difference between the two parsers found so far.

Schema errors: schema_diagnostics gives an unknown key its hint only if SpecError shows it;
the diagnostics shown must be those of hinting every key.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutations import _textual, mutated_specs
from pydantic import ValidationError
from spec_builder import spec_yaml
from spec_strategies import choices

import moegen.load.schema_errors as schema_errors
from bench.validate_worst import BASE as WORST_BASE
from bench.validate_worst import CASES as WORST_CASES
from moegen.diagnostics import MAX_REPORTED, Diagnostic, SpecError
from moegen.load import Locations, SpecSource, load_spec_bytes
from moegen.load.yaml_nodes import _compose_fast, parse_yaml
from moegen.spec import Spec
from moegen.validate import validate

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("hypothesis_seed_only")
DRAWN = settings(
    max_examples=300,
    derandomize=True,  # the same texts on every run
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def outcome(text: str, fast: bool) -> tuple:
    """What parse_yaml makes of `text`: the values (repr: NaN equals itself there) and every
    location, or the diagnostics."""
    try:
        data, locations = parse_yaml(SpecSource("s.yaml", "s", text, ""), fast=fast)
    except SpecError as err:
        return ("refused", err.diagnostics)
    return ("read", repr(data), locations.values, locations.keys)


def read_the_same(text: str) -> bool:
    """Assert both loaders agree on `text`; whether the libyaml path took it."""
    assert outcome(text, fast=True) == outcome(text, fast=False), repr(text)
    return _compose_fast(text) is not None


def _repo_yaml() -> dict[str, str]:
    """Every YAML file of the repository (but the virtual environment and generated code)."""
    texts = {}
    tops = [p for p in REPO_ROOT.iterdir() if not p.name.startswith(".") and p.name != "generated"]
    for path in sorted(p for top in tops for p in ([top] if top.is_file() else top.rglob("*"))):
        if path.suffix != ".yaml":
            continue
        try:
            texts[str(path.relative_to(REPO_ROOT))] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # refused before any YAML is read
            continue
    return texts


def _test_strings() -> list[str]:
    """The multi-line string constants of the loader's tests: the spec texts they write."""
    found = []
    for name in ["support/load_cases.py", "load/test_load.py", "load/test_load_files.py",
                 "load/test_load_messages.py", "load/test_load_untrusted.py",
                 "load/test_hostile_inputs.py", "load/test_injection.py"]:  # fmt: skip
        tree = ast.parse((REPO_ROOT / "tests" / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "\n" in node.value and ":" in node.value:
                    found.append(node.value)
    return found


def test_repository_texts_read_the_same() -> None:
    texts = list(_repo_yaml().values())
    assert len(texts) > 150, "the corpus went missing"
    taken = 0
    for text in texts:
        for variant in (text, text.replace("\n", "\r\n"), "\ufeff" + text):
            taken += read_the_same(variant)
    # The comparison means something only if the fast path ran on most of them.
    assert taken > len(texts) * 3 * 0.6, taken


def test_texts_written_in_the_loader_tests_read_the_same() -> None:
    texts = _test_strings()
    assert len(texts) > 20, len(texts)
    taken = sum(read_the_same(text) for text in texts)
    assert taken > len(texts) // 2, taken


@pytest.mark.parametrize("seed", range(4))
def test_mutated_specs_read_the_same(seed: int) -> None:
    taken = compared = 0
    for _label, raw in mutated_specs(100 + seed, 150):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        compared += 1
        taken += read_the_same(text)
    assert compared > 100 and taken > compared // 3, (compared, taken)


# Pieces of YAML, glued at random: most glue is invalid, enough is valid (and the invalid
# must fall back, so that it is refused with PyYAML's message).
PIECES = [
    "a", "key", "é", "ü: ", "\U0001f600", ": ", ":", "- ", "-", "? ", "?", "\n", "\n", "\n  ",
    "\n    ", "  ", " ", "\t", "'\t'", "\r\n", "[", "]", "{", "}", ",", ", ", "'", '"', "''",
    '\\"', "\\n", "\\x41", "\\/", "#", " # c\n", "#c\n", "&x ", "*x", "!!str ", "!t ", "! ",
    "!<tag:x> ", "!e!x ", "<<: ", "|", ">", "|-", ">+", "|2", "|\n  x\n", ">-\n  y\n", "---",
    "...", "--- ", "%YAML 1.2\n", "%TAG !e! tag:e,2000:\n", "1", "0x1f", "1.5", ".inf", "~",
    "null", "true", "yes", "1e3", "+1", "\ufeff", "\u00a0", "@", "`", "%", "\\", "a?b", "x:y",
    ":x", "?x", "-x", "a#b", "a: b", "a: [1, 2]", "{a: 1, b: [x, y]}", "[a: 1]", "- - a",
    "? a\n: b", "'a''b'", '"a\\\nb"', "'x\n y'", "a\n  b", "[ ]", "{ }", "a:\n", "a: \n",
]  # fmt: skip


def test_seeded_token_soup_reads_the_same() -> None:
    rng = random.Random(20240601)
    texts = [
        "".join(rng.choice(PIECES) for _ in range(rng.choice([2, 4, 8, 16, 32])))
        for _ in range(3000)
    ]
    taken = sum(read_the_same(text) for text in texts)
    assert taken > 300, taken


@DRAWN
@given(st.lists(st.sampled_from(PIECES), max_size=24).map("".join))
def test_drawn_token_soup_reads_the_same(text: str) -> None:
    read_the_same(text)


@DRAWN
@given(choices(), st.randoms(use_true_random=False), st.sampled_from(["\n", "\r\n"]))
def test_drawn_specs_read_the_same(drawn: dict, rng: random.Random, newline: str) -> None:
    text = spec_yaml(drawn).replace("\n", newline)
    assert read_the_same(text)  # a written spec is read by libyaml
    read_the_same(_textual(rng, text))


def _nested(depth: int) -> str:
    return "a: " + "[" * depth + "1" + "]" * depth + "\n"


# One text per way the parsers differ, and the plain forms beside them: (text, whether the
# libyaml path keeps it). Those it does not keep are read by PyYAML alone.
DIFFERENCES = [
    ("a: b\t\n", False),  # PyYAML refuses a tab between tokens, libyaml skips it
    ("a:\tb\n", False),
    ("a: [b,\tc]\n", False),
    ("a: 1 \t# c\n", False),
    ("a: b # c\td\n", False),  # a tab in a comment: both take it, not worth telling apart
    ('a: "x\ty"\n', True),  # inside quotes both read a tab as text
    ("a: 'x\ty'\n", True),
    ('a: !!str "x\ty"\n', False),
    ("a: |\n  x\ty\n", False),
    ("a: |#c\n  x\n", False),  # libyaml takes a comment straight after the indicator
    ("a: >+#\n  x\n", False),
    ("a: |\n  x\n", True),
    ("a: >-2\n    x\n", True),
    ("a: |  # c\n  x\n", True),
    ("a: [b: ]\n", False),  # PyYAML puts the missing value after ':', libyaml at ']'
    ("a: {b: , c: d}\n", False),
    ("a: [? ]\n", False),
    ("a: [b:]\n", False),  # libyaml refuses this one
    ("a:\nb:   \n", True),
    ("a:\n  -\n  - x\n", True),
    ("a: [b?c]\n", False),  # PyYAML ends a flow plain scalar at '?'
    ("a: [b? c]\n", False),
    ("a: b?c\n", True),
    ("\ufeffa: 1\nb: é\n", True),  # libyaml does not count a first BOM; PyYAML does
    ("\ufeff  - a\n", True),  # not a mapping: refused where the list starts
    ("\ufeffa: [*x]\n", True),
    ("\ufeff# only a comment\n", True),
    ("a: 1\n\ufeffb: 2\n", False),  # libyaml skips a BOM at a line's start; PyYAML reads it
    ("a: !'!x 1\n", False),  # PyYAML's tag syntax is narrower
    ("a: !!int 1\n", False),
    ("a: ! 1\n", False),
    ("a: &x 1\nb: *x\n", True),
    ("<<: {a: 1}\nb: 2\n", True),
    ("a: 1\r\nb: é\r\n", True),
    ("a: \U0001f600\nb: 'ü'\n", True),
    (_nested(31), True),
    (_nested(32), False),  # nesting too deep: PyYAML says where
    (_nested(400), False),
    ("a: 1\n---\nb: 2\n", False),
    ("a: [1, 2\n", False),
    ("", True),
    ("# only a comment\n", True),
]


@pytest.mark.parametrize(("text", "fast"), DIFFERENCES)
def test_known_differences_are_left_to_pyyaml(text: str, fast: bool) -> None:
    assert read_the_same(text) == fast


def _schema_error(text: str) -> tuple[ValidationError, SpecSource, Locations] | None:
    """The schema error of `text` with what schema_diagnostics needs, or None."""
    source = SpecSource("s.yaml", "s", text, "")
    try:
        data, locations = parse_yaml(source)
        Spec.model_validate(data)
    except SpecError:
        return None
    except ValidationError as err:
        return err, source, locations
    return None


def _unknown_keys(count: int, *, layer_at_end: bool = False) -> str:
    """A valid spec and `count` unknown top-level keys after it; with `layer_at_end`, an empty
    layer section last, whose three missing keys are reported at one place (a tie in
    SpecError's file order: where they fall at its cut, its stable sort decides)."""
    sections = {k: v for k, v in WORST_BASE.items() if k != "layer" or not layer_at_end}
    text = yaml.safe_dump(sections, sort_keys=False)
    text += "".join(f"versoin{i:05d}: 0\n" for i in range(count))
    return text + ("layer: {}\n" if layer_at_end else "")


def _schema_texts() -> dict[str, str]:
    """The bench's worst cases, every YAML file of the repository, and unknown keys around
    SpecError's cut (some with a tie at it)."""
    texts = {f"worst: {name}": make() for name, make in WORST_CASES.items()}
    texts |= {f"repo: {name}": text for name, text in _repo_yaml().items()}
    texts |= {f"{n} unknown keys": _unknown_keys(n) for n in (99, 100, 101, 102, 150)}
    for n in (96, 97, 98, 99, 100):
        texts[f"{n} unknown keys, then missing ones"] = _unknown_keys(n, layer_at_end=True)
    return texts


def test_hints_only_where_shown_show_the_same() -> None:
    refused = past_the_cut = 0
    for name, text in _schema_texts().items():
        found = _schema_error(text)
        if found is None:  # valid, or refused before the schema
            continue
        refused += 1
        lazy = schema_errors.schema_diagnostics(*found)
        every = schema_errors.schema_diagnostics(*found, hint_all=True)
        assert len(lazy) == len(every), name
        assert SpecError(lazy).diagnostics == SpecError(every).diagnostics, name
        if len(every) <= MAX_REPORTED + 1:  # all shown: not one differs
            assert lazy == every, name
        else:
            past_the_cut += 1
    assert refused >= 40 and past_the_cut >= 6, (refused, past_the_cut)


def test_hint_cost_follows_what_is_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    suggest = schema_errors._suggest
    monkeypatch.setattr(
        schema_errors, "_suggest", lambda *args: calls.append(args) or suggest(*args)
    )
    found = _schema_error(WORST_CASES["unknown keys filling the limit"]())
    assert found is not None
    shown = SpecError(schema_errors.schema_diagnostics(*found)).diagnostics
    assert len(calls) <= MAX_REPORTED + 1
    assert "; expected one of: version" in shown[0].message
    calls.clear()
    schema_errors.schema_diagnostics(*found, hint_all=True)
    assert len(calls) > 1500  # every key hinted: the cost the lazy hints avoid


@pytest.mark.parametrize("name", ["invalid_specs", "hostile"])
def test_whole_check_says_the_same_without_the_fast_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Load and validate end to end: the same refusals with the libyaml path switched off."""
    paths = sorted((REPO_ROOT / "tests" / name).glob("*.yaml"))

    def refusals() -> list[list[Diagnostic]]:
        out = []
        for path in paths:
            try:
                validate(load_spec_bytes(path.read_bytes(), path.name, path.stem))
                out.append([])
            except SpecError as err:
                out.append(err.diagnostics)
        return out

    fast = refusals()
    monkeypatch.setattr("moegen.load.yaml_nodes._compose_fast", lambda text: None)
    assert refusals() == fast
    assert all(fast), "each of the corpus is refused"
