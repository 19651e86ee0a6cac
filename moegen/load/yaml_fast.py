"""libyaml's parser for the spec loader, and the checks that keep its reading PyYAML's.

PyYAML's pure-Python scanner is most of the time a large spec takes to load (about 0.4 s of a
64 KiB one, several times that on a busy machine); libyaml, PyYAML's C parser, scans and
parses far faster and hands the same events to the same Python composer. Where it refuses a
text, the Python loader reads it again and reports its own error, so no message changes.
Where it accepts, it must read what PyYAML reads; it does, except where libyaml is laxer or
places a mark otherwise, and `reads_as_pyyaml` finds those places (each one found by
comparing the two over generated texts, see tests/load/test_load_fast_equivalence.py) so that
the caller can leave them to PyYAML too. Mark indices count characters for both (not UTF-8
bytes: non-ASCII and astral text, CRLF line ends agree), but for a byte-order mark.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import yaml

try:
    from yaml._yaml import CParser

    LIBYAML = True
except ImportError:  # PyYAML built without libyaml: the Python loader does it all
    CParser = object
    LIBYAML = False

# A block scalar's header as PyYAML reads it: the indicators, then a space or the line's end
# (libyaml also takes '|#comment' and a tab), then spaces and perhaps a comment.
_BLOCK_HEADER = re.compile(r"[|>](?:[-+][1-9]?|[1-9][-+]?)?(?: +(?:#.*)?)?(?:\r?\n|\Z)")
_NODES = {yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent}  # a tag each
_CLOSES = {yaml.SequenceEndEvent, yaml.MappingEndEvent}


@dataclass
class _Spans:
    """Where the scalars stand that libyaml may read otherwise than PyYAML."""

    quoted: list[tuple[int, int]] = field(default_factory=list)  # (start, end), in order
    blocks: list[int] = field(default_factory=list)  # where each '|' or '>' scalar starts
    empty: list[int] = field(default_factory=list)  # where each empty plain scalar stands
    flow_plain: list[tuple[int, int]] = field(default_factory=list)  # plain, in [ ] or { }


def reads_as_pyyaml(text: str) -> bool:
    """Whether libyaml accepts `text` and reads it as PyYAML would, as far as is known; False
    where only PyYAML's own reading can tell (its error, or a place where the two differ).
    A pass over libyaml's events only (a quarter of the composer's time), so that a text
    PyYAML must read costs little more than before."""
    spans = _spans(text)
    return spans is not None and not _read_differently(text, spans)


def _spans(text: str) -> _Spans | None:
    """The spans of libyaml's reading of `text`; None if it refuses the text or a tag is
    written (PyYAML's tag syntax is narrower, '!'!x' is its error, and a tag is refused
    anyway: not worth telling apart)."""
    spans = _Spans()
    flow = [False]  # whether each open collection is a flow one, innermost last
    parser = CParser(text)
    try:
        for event in iter(parser.get_event, None):  # None after the stream's end
            kind = type(event)  # libyaml makes PyYAML's own event classes
            if kind in _CLOSES:
                flow.pop()
            elif kind not in _NODES:
                continue
            elif event.tag is not None:
                return None
            elif kind is yaml.ScalarEvent:
                _note(spans, event, flow[-1])
            else:
                flow.append(bool(event.flow_style))
    except yaml.YAMLError:
        return None
    finally:
        parser.dispose()
    return spans


def _note(spans: _Spans, event: yaml.ScalarEvent, in_flow: bool) -> None:
    start, end = event.start_mark.index, event.end_mark.index
    if event.style in ("'", '"'):
        spans.quoted.append((start, end))
    elif event.style in ("|", ">"):
        spans.blocks.append(start)
    elif start == end:  # plain: libyaml's style is '', PyYAML's None
        spans.empty.append(start)
    elif in_flow:
        spans.flow_plain.append((start, end))


def _read_differently(text: str, spans: _Spans) -> bool:
    """Whether PyYAML might read `text` otherwise than libyaml did, by `spans` of its reading
    (the cases known: block scalar headers, where a missing value stands, '?' in flow
    collections, tabs)."""
    # A block scalar's span opens at its anchor, if written: its header is then not at the
    # span's start, and not worth finding (an anchor serves no purpose in a spec).
    if any(not _BLOCK_HEADER.match(text, start) for start in spans.blocks):
        return True
    # A missing value stands right after its ':', '?' or '-' for both when nothing follows
    # on the line (a block mapping or sequence); where a token follows on the line (in a
    # flow collection: '{a: }'), libyaml puts it at that token, PyYAML after the indicator.
    if any(start == 0 or text[start - 1] not in ":?-" for start in spans.empty):
        return True
    # In a flow collection PyYAML ends a plain scalar at a '?' (and reads a key indicator),
    # libyaml reads on ('[a?b]').
    if any("?" in text[start : end + 1] for start, end in spans.flow_plain):
        return True
    return "\t" in text and _tab_outside_quotes(text, spans.quoted)


def _tab_outside_quotes(text: str, quoted: list[tuple[int, int]]) -> bool:
    """PyYAML refuses a tab between tokens and ends a plain scalar at one; libyaml reads many
    as spaces (after a ':', before a comment, in a flow collection). Inside quotes, both
    read it as text."""
    starts = [start for start, _ in quoted]
    for found in re.finditer("\t", text):
        at = bisect.bisect_right(starts, found.start()) - 1
        # A span opening at an anchor has text before its quote.
        if at < 0 or text[starts[at]] not in "'\"" or found.start() >= quoted[at][1]:
            return True
    return False
