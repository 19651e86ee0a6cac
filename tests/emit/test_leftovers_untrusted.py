"""What a build finds beside its output is untrusted: only what this user's moegen provably made
is removed or replayed (moegen.provenance, moegen.journal, moegen.emit).

The corpus of issue 26: genuine leftovers of a dead run are cleared and its journal rolled
back; look-alike names, planted or forged journals, journals of another output or another
user, and journals found by a build that writes nothing move nothing; a failed write leaves
no stage (0555 output); an output through a dangling link is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_moegen, snapshot

import moegen.emit as emit
from moegen import interrupts, provenance
from moegen.emit import write_all
from moegen.journal import OLD, TMP, Journal

ROOT = os.geteuid() == 0


def dead_token() -> str:
    """The owner token of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return f"{child.pid}-1"


@pytest.fixture
def dead():
    """Names made within `with dead():` are those a dead run would have made."""

    @contextlib.contextmanager
    def as_dead_run():
        token = dead_token()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(interrupts, "owner_token", lambda: token)
            yield

    return as_dead_run


@pytest.fixture
def out(tmp_path: Path) -> Path:
    out = tmp_path / "gen"
    out.mkdir()
    (out / "a.py").write_text("old a\n")
    (out / "b.py").write_text("old b\n")
    return out


def beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.rglob("*") if ".moegen-" in p.name)


def _name(directory: Path, prefix: str, mark: str) -> Path:
    return directory / provenance.owned_name(directory, prefix, mark)


def _build_once(out: Path) -> None:
    write_all({out / "a.py": "new a\n"}, out_dir=out)


# ---------------------------------------------------------------------------------------
# genuine leftovers: cleared; live runs' kept


def test_recover_removes_dead_stages_and_temporaries_only(out, dead):
    with dead():
        stage, tmp = _name(out.parent, ".gen", ".moegen-stage-"), _name(out, ".a.py", TMP)
    alive_stage, alive_tmp = _name(out.parent, ".gen", ".moegen-stage-"), _name(out, ".a.py", TMP)
    for path in (stage, alive_stage):
        path.mkdir()
        (path / "x").write_text("staged")
    for path in (tmp, alive_tmp):
        path.write_text("t")
    emit.recover(out)
    assert beside(out) == sorted([alive_tmp.name, alive_stage.name])


def test_recover_rolls_back_a_dead_journal(out, dead):
    """What a SIGKILL between the renames of the journaled protocol leaves behind."""
    with dead():
        backup_a, tmp_a = _name(out, ".a.py", OLD), _name(out, ".a.py", TMP)
        backup_b, tmp_b = _name(out, ".b.py", OLD), _name(out, ".b.py", TMP)
        tmp_c = _name(out, ".c.py", TMP)
        journal = Journal.beside(out)
    os.link(out / "a.py", backup_a)
    os.link(out / "b.py", backup_b)
    (out / "new").write_text("new a\n")
    os.replace(out / "new", out / "a.py")  # renamed over already
    tmp_b.write_text("new b\n")  # not yet
    (out / "c.py").write_text("new c\n")  # a new module, renamed over already
    entries = [
        [str(out / "a.py"), str(tmp_a), str(backup_a), 0],
        [str(out / "b.py"), str(tmp_b), str(backup_b), 0],
        [str(out / "c.py"), str(tmp_c), None, (out / "c.py").stat().st_ino],
    ]
    assert journal.write(out, entries, emit._fsync)
    emit.recover(out)
    assert (out / "a.py").read_text() == "old a\n" and (out / "b.py").read_text() == "old b\n"
    assert not (out / "c.py").exists() and beside(out) == []


# ---------------------------------------------------------------------------------------
# look-alikes: never removed


LOOK_ALIKES = {
    "beside": [
        "notes.moegen-tmp-999999-1-x",
        ".gen.moegen-stage-999999-1-7",  # the old form, no tag
        ".gen.moegen-tmp-999999-1-0123456789abcdef-0123456789abcdef",  # a forged tag
        "moegen-verify-999999-1-0123456789abcdef-0123456789abcdef",
    ],
    "inside": ["mine.moegen-old-999999-1-x", ".a.py.moegen-tmp-999999-1-3"],
}


def test_look_alike_names_are_never_removed(out, tmp_path):
    for name in LOOK_ALIKES["beside"]:
        (tmp_path / name).write_text("the user's")
    for name in LOOK_ALIKES["inside"]:
        (out / name).write_text("the user's")
    _build_once(out)
    assert all((tmp_path / n).read_text() == "the user's" for n in LOOK_ALIKES["beside"])
    assert all((out / n).read_text() == "the user's" for n in LOOK_ALIKES["inside"])
    provenance.remove_leftovers(tmp_path, "moegen-verify-")  # the scratch sweep too
    assert (tmp_path / LOOK_ALIKES["beside"][3]).exists()


def test_a_genuine_name_moved_to_another_directory_proves_nothing(out, tmp_path, dead):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with dead():
        name = provenance.owned_name(elsewhere, ".gen", TMP)
    (out.parent / name).write_text("the user's")  # the tag is bound to `elsewhere`
    _build_once(out)
    assert (out.parent / name).read_text() == "the user's"


# ---------------------------------------------------------------------------------------
# journals: planted, forged, copied, another output's, another user's


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "deep" / "important.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("keep")
    return victim


def _planted(out: Path, victim: Path, name: str, root: Path | None = None) -> Path:
    """A journal as an attacker writes it: naming a sibling of the output."""
    entries = [[str(victim), str(victim) + ".moegen-tmp-1-1-x", None, victim.stat().st_ino]]
    journal = out.parent / name
    body = {"format": 1, "root": str(root or victim.parent.parent), "entries": entries}
    journal.write_text(json.dumps(body | {"device": 0, "inode": 0, "signature": "0" * 64}))
    return journal


@pytest.mark.parametrize("form", ["old", "forged tag"])
def test_a_planted_journal_naming_a_sibling_moves_nothing(out, tmp_path, form, dead):
    victim = _victim(tmp_path)
    token = dead_token()
    name = {
        "old": f".victim.moegen-journal-{token}-0",
        "forged tag": f".gen.moegen-journal-{token}-0123456789abcdef-0123456789abcdef",
    }[form]
    journal = _planted(out, victim, name)
    _build_once(out)
    assert victim.read_text() == "keep" and (out / "a.py").read_text() == "new a\n"
    assert journal.exists()  # not ours: neither obeyed nor removed


@pytest.mark.parametrize("claims", ["the sibling", "this output"])
def test_a_journal_of_ours_with_forged_content_is_not_obeyed(out, tmp_path, dead, claims):
    victim = _victim(tmp_path)
    with dead():
        journal = Journal.beside(out).path
    root = out if claims == "this output" else None
    _planted(out, victim, journal.name, root)  # a genuine name, content someone else wrote
    _build_once(out)
    assert victim.read_text() == "keep"
    # ours by its name: left for the output it names, else unusable and removed unread
    assert journal.exists() == (claims == "the sibling")


def test_a_signed_journal_copied_elsewhere_is_not_obeyed(out, tmp_path, dead):
    """The signature covers the journal's own inode: a copy (or a hard link) proves nothing."""
    with dead():
        journal = Journal.beside(out)
        backup = _name(out, ".a.py", OLD)
    (out / "a-original").write_text("the user's new a\n")
    backup.write_text("stale content\n")
    entries = [[str(out / "a.py"), str(_name(out, ".a.py", TMP)), str(backup), 0]]
    assert journal.write(out, entries, emit._fsync)
    copy = journal.path.with_name("copy")
    copy.write_bytes(journal.path.read_bytes())  # the same bytes, another inode
    os.replace(copy, journal.path)
    emit.recover(out)
    assert (out / "a.py").read_text() == "old a\n"  # not rolled back to the stale backup


def _dead_run_journal(output: Path, name: str, dead) -> Journal:
    """The genuine journal a killed run left for `output`: NAME's backup holds "older"."""
    output.mkdir(exist_ok=True)
    (output / name).write_text("old\n")
    with dead():
        journal = Journal.beside(output)
        backup = _name(output, f".{name}", OLD)
    backup.write_text("older\n")
    entries = [[str(output / name), str(_name(output, f".{name}", TMP)), str(backup), 0]]
    assert journal.write(output, entries, emit._fsync)
    return journal


def test_a_journal_for_another_output_is_not_replayed_here(out, tmp_path, dead):
    other = tmp_path / "other"
    journal = _dead_run_journal(other, "x.py", dead)
    _build_once(out)
    assert (other / "x.py").read_text() == "old\n" and journal.path.exists()
    emit.recover(other)  # its own output's next write: rolled back
    assert (other / "x.py").read_text() == "older\n" and not journal.path.exists()


def test_a_planted_journal_is_not_recovered_by_a_build_that_writes_nothing(tmp_path, dead):
    project = tmp_path / "project"
    (project / "specs").mkdir(parents=True)
    spec = project / "specs" / "bad.yaml"
    spec.write_text((REPO_ROOT / "specs" / "mixtral_small_cpu.yaml").read_text() + "bogus: 1\n")
    journal = _dead_run_journal(project / "generated", "a.py", dead)
    before = snapshot(project)
    result = run_moegen("build", "--no-verify", "specs/bad.yaml", cwd=project)
    assert result.returncode == 3, result.stderr
    assert snapshot(project) == before and journal.path.exists()


# ---------------------------------------------------------------------------------------
# another user (switching user needs root; as anyone else the test cannot plant for one)


@pytest.mark.skipif(not ROOT, reason="needs root to make files another user owns")
def test_another_users_journal_in_a_sticky_directory(tmp_path, dead):
    """A journal another user owns is neither obeyed nor removed (it cannot be: the
    directory is sticky), and it does not stop later builds."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    out = shared / "gen"
    out.mkdir()
    (out / "a.py").write_text("old a\n")
    with dead():
        journal = Journal.beside(out)
        backup = _name(out, ".a.py", OLD)
    backup.write_text("older a\n")
    entries = [[str(out / "a.py"), str(_name(out, ".a.py", TMP)), str(backup), 0]]
    assert journal.write(out, entries, emit._fsync)
    os.chown(journal.path, 65534, 65534)  # nobody's file, whatever its name says
    for _ in range(2):  # every later build too: no exit 4 "nothing changed"
        _build_once(out)
    assert journal.path.exists() and (out / "a.py").read_text() == "new a\n"


# ---------------------------------------------------------------------------------------
# failures leave no stage; dangling links are refused


def _write_as_owner(out: Path, state: Path, uid: int | None) -> str:
    """write_all into `out` in a forked child (as `uid` where given): what it raised."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery, only the write
        os.close(read_fd)
        message = b"written"
        try:
            if uid is not None:
                os.setgid(uid)
                os.setuid(uid)
            os.environ[provenance.STATE_ENV] = str(state)
            write_all({out / "a.py": "new a\n"}, out_dir=out)
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            message = f"refused: {err}".encode()
        os.write(write_fd, message)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.mark.filterwarnings("ignore:This process.*fork:DeprecationWarning")
def test_an_output_the_user_cannot_write_leaves_no_stage():
    base = Path(tempfile.mkdtemp(prefix="moegen-test-"))  # outside pytest's private tree
    out = base / "gen"
    (out / "sub").mkdir(parents=True)
    (out / "a.py").write_text("old a\n")
    uid = None
    if ROOT:  # root writes anywhere: the write runs as nobody, who owns the output
        uid = 65534
        base.chmod(0o777)
        for path in (out, out / "sub", out / "a.py"):
            os.chown(path, uid, uid)
    (out / "sub").chmod(0o555)
    out.chmod(0o555)
    try:
        for _ in range(3):
            assert _write_as_owner(out, base / "state", uid).startswith("refused:")
        assert sorted(p.name for p in base.iterdir()) == ["gen", "state"]
        assert (out / "a.py").read_text() == "old a\n"
    finally:
        out.chmod(0o755)
        (out / "sub").chmod(0o755)
        shutil.rmtree(base)


def test_an_output_through_a_dangling_link_is_refused(tmp_path):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "missing" / "deeper" / "gen")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_all({link / "a.py": "a\n", link / "b.py": "b\n"}, out_dir=link)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with pytest.raises(FileNotFoundError):
        write_all({link / "sub" / "a.py": "a\n"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_remove_tree_removes_a_read_only_stage(tmp_path):
    stage = tmp_path / "stage"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "f").write_text("x")
    (stage / "sub").chmod(0o555)
    stage.chmod(0o555)
    provenance.remove_tree(stage)
    assert not stage.exists()


# ---------------------------------------------------------------------------------------
# the key itself


def test_the_key_lives_in_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.setenv(provenance.STATE_ENV, str(tmp_path / "state"))
    key = provenance.secret()
    assert key is not None and len(key) == 32
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "state" / "secret").stat().st_mode) == 0o600
    assert provenance.secret() == key  # the same on every call


def test_a_key_others_could_write_is_not_used(tmp_path, monkeypatch):
    state = tmp_path / "loose"
    monkeypatch.setenv(provenance.STATE_ENV, str(state))
    assert provenance.secret() is not None
    provenance._keys.clear()
    state.chmod(0o777)
    assert provenance.secret() is None
    provenance._keys.clear()
    state.chmod(0o700)
    (state / "secret").chmod(0o644)
    assert provenance.secret() is None
    provenance._keys.clear()
    (state / "secret").unlink()
    (state / "secret").symlink_to(tmp_path / "elsewhere")
    assert provenance.secret() is None
    provenance._keys.clear()
    shutil.rmtree(state)


def test_without_a_key_nothing_is_removed_and_building_still_works(out, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(provenance.STATE_ENV, str(blocker / "state"))
    assert provenance.secret() is None
    _build_once(out)
    assert (out / "a.py").read_text() == "new a\n" and beside(out) == []
