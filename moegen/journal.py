"""The journal of emit's per-file protocol: what a run killed between two renames left, and
how the next write puts the old set back.

A journal names, for each target, its temporary, its backup (`.moegen-old-`, None for a
new file) and the temporary's inode. It is read back from a directory others may write, so
it is obeyed only with proof that this user's moegen wrote it for this output:
- its name is one moegen made (moegen.provenance: a tag under this user's key, bound to the
  directory), the file is ours, regular and not a link, and its maker is dead;
- its content is signed with the same key, over the output it is for and the journal's own
  device and inode (a signed journal copied or linked elsewhere proves nothing);
- it is for the output being written, and every path in it lies inside that output: each
  target under it, each temporary and backup beside its target with a name moegen made.
Anything else is not obeyed: a journal with a forged name is not even looked at (it may be
another user's), one of ours that fails a check is removed unread.
"""

from __future__ import annotations

import dataclasses
import json
import os
from contextlib import suppress
from pathlib import Path
from typing import Any

from moegen import interrupts, provenance

TMP, OLD, JOURNAL = ".moegen-tmp-", ".moegen-old-", ".moegen-journal-"
FORMAT = 1
_MAX_BYTES = 4 << 20
_PURPOSE = "emit journal"
Entry = list[Any]  # [target, temporary, backup or None, the temporary's inode]


@dataclasses.dataclass(frozen=True)
class Journal:
    """Where one write's journal goes: its final name, and the name it is written under."""

    path: Path
    partial: Path

    @classmethod
    def beside(cls, root: Path) -> Journal:
        prefix = f".{root.name[:64]}"
        return cls(
            root.with_name(provenance.owned_name(root.parent, prefix, JOURNAL)),
            root.with_name(provenance.owned_name(root.parent, prefix, TMP)),
        )

    def write(self, root: Path, entries: list[Entry], fsync: Any) -> bool:
        """Make the journal durable; False where it cannot be made or proven (then a SIGKILL
        between the renames is not covered)."""
        try:
            fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            return False
        try:
            with os.fdopen(fd, "wb") as handle:
                st = os.fstat(handle.fileno())
                body = _body(str(root), entries, st.st_dev, st.st_ino)
                signature = provenance.sign(_PURPOSE, _canonical(body))
                if signature is None:
                    raise OSError("no key to sign the journal with")
                handle.write(json.dumps({**body, "signature": signature}).encode())
                handle.flush()
                os.fsync(handle.fileno())
            os.rename(self.partial, self.path)
            fsync(self.path.parent)
            return True
        except OSError:
            return False
        finally:
            unlink(self.partial)

    def remove(self) -> None:
        unlink(self.path)
        unlink(self.partial)


def _body(root: str, entries: list[Entry], device: int, inode: int) -> dict[str, Any]:
    return {"format": FORMAT, "root": root, "entries": entries, "device": device, "inode": inode}


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def recover_journals(real: Path, fsync: Any) -> None:
    """Roll back the sets that dead runs of this user's moegen left half-written in `real`.
    A journal of another output beside it is left for that output's next write."""
    for journal in provenance.leftovers(real.parent, JOURNAL):
        read = _read(Path(journal))
        if read is not None and read[0].get("root") != str(real):
            continue
        entries = _proven_entries(read, real)
        with interrupts.blocked():
            if entries is not None:
                roll_back(entries, fsync)
                discard(entries)
            unlink(journal)  # provably ours and this output's: obeyed, or unusable


def read_journal(path: Path, real: Path) -> list[Entry] | None:
    """The entries of a journal moegen wrote for `real`, or None when it proves no such thing."""
    return _proven_entries(_read(path), real)


def _read(path: Path) -> tuple[dict[str, Any], int, int] | None:
    """The JSON object of a journal file of ours, with the device and inode it was read from;
    None for anything else."""
    try:
        read = provenance.read_own_json(path, _MAX_BYTES)
    except provenance.NotOurs:
        return None
    if read is None or not isinstance(read[0], dict):
        return None
    return read[0], read[1].st_dev, read[1].st_ino


def _proven_entries(read: Any, real: Path) -> list[Entry] | None:
    if read is None:
        return None
    doc, device, inode = read
    if set(doc) != {*_body("", [], 0, 0), "signature"}:
        return None
    body = {key: value for key, value in doc.items() if key != "signature"}
    if (
        body != _body(str(real), body["entries"], device, inode)
        or not provenance.signed_by_us(_PURPOSE, _canonical(body), doc["signature"])
        or not isinstance(body["entries"], list)
    ):
        return None
    entries = body["entries"]
    return entries if all(_inside(entry, str(real)) for entry in entries) else None


def _inside(entry: Any, root: str) -> bool:
    """An entry of the form moegen writes, every path of it inside the output `root`."""
    if not (isinstance(entry, list) and len(entry) == 4):
        return False
    target, tmp, backup, inode = entry
    if not (isinstance(target, str) and isinstance(tmp, str) and isinstance(inode, int)):
        return False
    folder = os.path.dirname(target)
    return (
        os.path.normpath(target) == target
        and os.path.commonpath([root, target]) == root != target
        and os.path.realpath(folder) == folder  # no link along the way out of the output
        and all(
            isinstance(p, str)
            and os.path.dirname(p) == folder
            and provenance.made_by_us(folder, os.path.basename(p), mark) is not None
            for p, mark in ((tmp, TMP), (backup, OLD))
            if p is not None and os.path.lexists(p)
        )
        and (backup is None or isinstance(backup, str))
    )


def roll_back(entries: list[Entry], fsync: Any) -> None:
    """Old contents back (idempotent: a replay after a kill midway does the rest)."""
    for target, _, backup, inode in reversed(entries):
        if backup is not None:
            if os.path.lexists(backup):
                os.replace(backup, target)
        else:
            with suppress(FileNotFoundError):
                if os.lstat(target).st_ino == inode:
                    os.unlink(target)  # it did not exist before
    for directory in sorted({os.path.dirname(e[0]) for e in entries}):
        fsync(directory)


def discard(entries: list[Entry]) -> None:
    for _, tmp, backup, _ in entries:
        unlink(tmp)
        if backup is not None:
            unlink(backup)


def unlink(path: str | Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
