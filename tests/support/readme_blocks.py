"""The code blocks of README.md and of every page under docs/, as tests/cli/test_readme.py runs
them (standard library only, so that scripts/pip-user-transcript can use it from any Python).

A block is a fenced ```LANG block; the `# ` or `## ` heading above it in its file is its
section, and an HTML comment on the line just before its fence, `<!-- readme-test: CLAIM -->`,
says how a test treats it instead of running it alone (tests/cli/test_readme.py knows every claim).

    python3 tests/support/readme_blocks.py transcript-script SECTION   # bash that runs SECTION's blocks
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RUNNABLE = {"python": "python", "sh": "sh", "bash": "sh", "shell": "sh"}
FENCE = re.compile(r"^```([\w-]*)\s*$")
MARKER = re.compile(r"^<!-- readme-test: (.+?) -->$")
PIP_SECTION = "Using moegen from a wheel in your own repository"
FILE_CLAIM = re.compile(r"^file (\S+)$")


@dataclass(frozen=True)
class Block:
    lang: str  # as fenced
    text: str
    line: int  # of the opening fence, 1-based
    section: str
    claim: str | None
    path: str = "README.md"  # relative to the repository root

    @property
    def kind(self) -> str | None:
        """'python' or 'sh' for a block that is run, None for one that is shown."""
        return RUNNABLE.get(self.lang)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.section})"

    @property
    def section_key(self) -> str:
        """Its section, named by file: the blocks of one section run together, in order."""
        return f"{self.path}: {self.section}"


def blocks(text: str, path: str = "README.md") -> list[Block]:
    found, section, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("# ", "## ")):
            section = line.split(" ", 1)[1].strip()
        fence = FENCE.match(line)
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        claim = MARKER.match(before.strip())
        body = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(fence[1], body, i + 1, section, claim[1] if claim else None, path))
        i = end + 1
    return found


def documents() -> list[Path]:
    """README.md, then every docs/ page in path order."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def readme_blocks() -> list[Block]:
    """Every block of README.md and of docs/, file by file."""
    found = []
    for document in documents():
        path = document.relative_to(ROOT).as_posix()
        found += blocks(document.read_text(encoding="utf-8"), path)
    return found


def commands(text: str) -> list[str]:
    """A shell text's command lines, each without its trailing comment."""
    out = []
    for line in text.splitlines():
        command = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
        if command:
            out.append(command)
    return out


def saved_file(block: Block) -> str | None:
    """The file name a `file NAME` claim saves the block as."""
    match = FILE_CLAIM.match(block.claim or "")
    return match[1] if match else None


def transcript_script(section: str) -> str:
    """Bash that runs SECTION's blocks in order, as written, echoing each command first:
    `file NAME` blocks are written out, shell blocks run line by line."""
    out = ["set -euo pipefail"]
    for block in (b for b in readme_blocks() if b.section == section and b.kind):
        name = saved_file(block)
        if name is not None:
            out.append(f"echo {shlex.quote(f'$ cat > {name}  # the README block that follows')}")
            out.append(
                f"cat > {shlex.quote(name)} <<'README_BLOCK_EOF'\n{block.text}README_BLOCK_EOF"
            )
            out.append(f"cat {shlex.quote(name)}")  # the transcript shows what was run
            continue
        if block.kind != "sh":
            raise ValueError(f"{block.where}: a python block without a file claim")
        for line in block.text.splitlines():
            if line.strip():
                out += [f"echo {shlex.quote('$ ' + line)}", line]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "transcript-script":
        sys.exit("usage: readme_blocks.py transcript-script SECTION")
    sys.stdout.write(transcript_script(sys.argv[2]))
