"""Where a spec came from and where each of its keys and values sits."""

from __future__ import annotations

from dataclasses import dataclass

from moegen.load.yaml_limits import SHOWN_CHARACTERS, shown

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class SpecSource:
    """The spec file as read: its text, its hash and how it is named in messages."""

    display: str  # path as shown in messages and in the generated header
    name: str  # module name: the file stem
    text: str
    sha256: str


@dataclass(frozen=True)
class Locations:
    """Where each key and value of the YAML document sits (1-based line, column)."""

    values: dict[FieldPath, tuple[int, int]]
    keys: dict[FieldPath, tuple[int, int]]

    def of_value(self, path: FieldPath) -> tuple[int, int]:
        """Location of the value at `path`, or of its nearest existing parent."""
        for end in range(len(path), -1, -1):
            if path[:end] in self.values:
                return self.values[path[:end]]
        return (1, 1)

    def of_key(self, path: FieldPath) -> tuple[int, int]:
        return self.keys.get(path) or self.of_value(path)


def dotted(path: FieldPath) -> str:
    """('mesh', 'batch_axes', 1) -> 'mesh.batch_axes[1]'."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.isidentifier() or len(part) > SHOWN_CHARACTERS:
            # a user's key: shown escaped, never raw, and cut short
            out += f"[{shown(part)}]"
        else:
            out += f".{part}" if out else part
    return out
