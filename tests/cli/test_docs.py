"""The documentation's own checks that need no mkdocs: the generated reference pages are fresh,
README.md's relative links lead somewhere, and every docs/ page is in the site's nav.
(`make docs` builds the site with `mkdocs build --strict`, which checks links between pages.)"""

from __future__ import annotations

import re
import subprocess
import sys

import yaml
from conftest import REPO_ROOT

from moegen import docs_reference

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_committed_reference_pages_are_fresh():
    for path, text in docs_reference.pages().items():
        committed = (REPO_ROOT / path).read_text(encoding="utf-8")
        assert committed == text, f"{path} is stale: run `python -m moegen.docs_reference --write`"


def test_check_finds_a_stale_page_and_write_fixes_it(tmp_path):
    assert docs_reference.stale_pages(REPO_ROOT) == []
    assert sorted(docs_reference.stale_pages(tmp_path)) == sorted(docs_reference.pages())
    command = [sys.executable, "-m", "moegen.docs_reference"]
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": ""}
    for flag, code in (("--check", 1), ("--write", 0), ("--check", 0)):
        done = subprocess.run([*command, flag], cwd=tmp_path, env=env, capture_output=True)
        assert done.returncode == code, (flag, done.stderr)


def test_the_generator_imports_no_pipeline_stage():
    # the reference is read off the spec and the CLI's definitions, not off what they drive
    probe = (
        "import sys; from moegen import docs_reference; docs_reference.pages(); "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['moegen', 'plan'], ['moegen', 'render'], ['moegen', 'verify'], ['moegen', 'pipeline'])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_the_readme_relative_links_exist():
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert len(targets) >= 20  # the map of docs/ was found at all
    for target in targets:
        path, _, fragment = target.partition("#")
        assert (REPO_ROOT / path).exists(), f"README.md links to {target}: no such file"
        if fragment:
            page = (REPO_ROOT / path).read_text(encoding="utf-8")
            headings = [line.lstrip("#").strip() for line in page.splitlines() if line[:1] == "#"]
            anchors = {docs_reference.anchor(h) for h in headings}
            assert fragment in anchors, f"README.md links to {target}: no such heading"


def test_every_docs_page_is_in_the_mkdocs_nav():
    config = yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(entries) -> list[str]:
        found = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += pages(value) if isinstance(value, list) else [value]
        return found

    docs = REPO_ROOT / "docs"
    on_disk = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    assert sorted(pages(config["nav"])) == on_disk


def test_the_readme_is_a_front_door() -> None:
    """What, install, quick start, a map (issue 53): the rest lives in docs/ and bench/."""
    lines = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, len(lines)


def test_nothing_cites_a_file_outside_the_repository() -> None:
    """A reader has only the repository: no tracked file names the team's notes beside it
    (what they measured is copied in, e.g. bench/reference/maxtext_anchor.md)."""
    found = subprocess.run(
        [
            "git",
            "grep",
            "-n",
            "-e",
            "../shared/",
            "-e",
            "/work/shared",
            "--",
            ".",
            ":!tests/cli/test_docs.py",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout == "", found.stdout
