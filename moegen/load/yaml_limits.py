"""The limits the loader puts on untrusted YAML, and positions counted as editors count them.

Specs arrive in pull requests, so the loader refuses, at their line and column and before
any expensive work, what no spec needs and a hostile one could use: characters that make
an editor and the YAML parser disagree on what a line holds, nesting deep enough to exhaust
PyYAML's recursive composer, numbers too long for Python's int-string limit, and explicit
tags (see `written_tag`).
"""

from __future__ import annotations

import bisect
import re
import unicodedata

from moegen.diagnostics import escape_unprintable

# Specs nest about 4 levels (tiles: [..] inside target:); PyYAML's composer recurses about
# 3 frames a level, so 330 levels (a 660-byte file) used to hit Python's recursion limit.
MAX_DEPTH = 32
# Far above any shape a spec names (2**63 has 19 digits), far below Python's 4,300-digit
# int-string limit, and short enough that no later rule scans a number proportional to it.
MAX_DIGITS = 30
SHOWN_CHARACTERS = 60  # how much of a user's text a message quotes

# What PyYAML's reader refuses (C0 and C1 controls, DEL, surrogates, U+FFFE/U+FFFF), and also:
# - line breaks YAML 1.1 counts and editors do not (NEL, U+2028, U+2029, a CR not before a
#   LF): text after one in a comment would be YAML content that a reviewer sees as comment;
# - bidirectional embeddings, overrides and isolates, which make text display in another
#   order than it is parsed ("trojan source").
# All of them can be written as escapes inside double quotes, so refusing them raw costs
# nothing.
_REFUSED_RAW = re.compile(
    "[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
    "|[\u2028\u2029\u202a-\u202e\u2066-\u2069]|\r(?!\n)"
)
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_BREAKS = {"\r": "carriage return", "\x85": "next line (NEL)"}
_BREAKS |= {"\u2028": "line separator", "\u2029": "paragraph separator"}

CORE_PREFIX = "tag:yaml.org,2002:"


class NestingTooDeep(Exception):
    """Raised by the composer at the collection that opens level MAX_DEPTH + 1."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


class Positions:
    """Character index -> (line, column), 1-based, as editors count them: lines end at '\\n'
    only (PyYAML's own marks also end lines at NEL, U+2028, U+2029 and a lone CR), and a
    byte-order mark at the start of the file takes no column."""

    def __init__(self, text: str):
        self._line_ends = [m.start() for m in re.finditer("\n", text)]
        self._bom = text.startswith("\ufeff")

    def of(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_left(self._line_ends, index)
        start = self._line_ends[line - 1] + 1 if line else 0
        column = index - start + 1
        if line == 0 and self._bom and index > 0:
            column -= 1
        return line + 1, column


def refused_character(text: str) -> tuple[int, str] | None:
    """The index of the first character a spec may not hold raw, and why; or None."""
    found = _REFUSED_RAW.search(text)
    if found is None:
        return None
    char = found.group()
    code = ord(char)
    escape = _yaml_escape(code)
    name = unicodedata.name(char, "").lower()
    if char in _BREAKS:
        what = f"{_BREAKS[char]} U+{code:04X}" + (" without a line feed" if code == 0x0D else "")
        why = "editors and YAML disagree on whether it ends a line"
    elif char in _BIDI:
        what = f"bidirectional control character U+{code:04X} ({name})"
        why = "it makes text display in another order than it is read"
    else:
        what = f"control character U+{code:04X}" + (f" ({name})" if name else "")
        why = "YAML does not allow it"
    message = f"{what} is not allowed raw ({why}); write it as {escape} inside double quotes"
    return found.start(), message


def _yaml_escape(code: int) -> str:
    """The escape that writes character `code` inside a YAML double-quoted scalar."""
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str, *, quoted: bool = True) -> str:
    """A user's text for a message: quoted (or not), escaped to one printable line, cut short."""
    out = repr(text) if quoted else escape_unprintable(text)
    if len(out) <= SHOWN_CHARACTERS:
        return out
    return out[: SHOWN_CHARACTERS - 3] + "..."


def tag_problem(tag: str) -> str:
    """Why an explicitly written tag is refused, naming it as the user wrote it."""
    written = "!!" + tag[len(CORE_PREFIX) :] if tag.startswith(CORE_PREFIX) else tag
    return (
        f"YAML tag {shown(written)} is not supported; remove it (a value's type is how it is "
        "written: 8, 0.5, true, null, text)"
    )


def digits_problem(text: str, is_int: bool) -> str | None:
    """Why a resolved int or float scalar is too long to accept, or None."""
    digits = sum(char in "0123456789" for char in text)
    if digits <= MAX_DIGITS:
        return None
    kind = "integer" if is_int else "number"
    return f"{kind} has {digits} digits; at most {MAX_DIGITS} are accepted"
