"""Interrupted builds: all or nothing under SIGINT, SIGTERM, SIGHUP and SIGKILL.

`moegen build --no-verify` of two specs (and of one) is signalled right after each step of
its write phase, every step in turn: moegen.emit's test hook (MOEGEN_EMIT_TRACE) names each
step on a pipe and waits for the go-ahead, so the signal lands between two given system
calls. After each kill the output directory must hold exactly the old set or exactly the
new set (bytes), `moegen check` must find no orphan, and nothing moegen made may be left
(after SIGKILL: once the next write has cleared it). A real verification killed while its
worker runs must leave neither the worker nor its scratch directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SPEC_DIR, _clean_env, snapshot

from moegen import emit, interrupts, provenance
from moegen.check import check

SPECS = ["mixtral_small_cpu", "sigmoid_top1_data_cpu"]
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
CATCHABLE = SIGNALS[:3]


def make_project(root: Path, names: list[str], *, old_output: bool = True) -> Path:
    """specs/ with `names`; generated/ with an old, different version of their modules."""
    (root / "specs").mkdir(parents=True)
    for name in names:
        shutil.copyfile(SPEC_DIR / f"{name}.yaml", root / "specs" / f"{name}.yaml")
    if old_output:
        (root / "generated" / "__pycache__").mkdir(parents=True)
        (root / "generated" / "__pycache__" / "stale.cpython-312.pyc").write_bytes(b"\0pyc")
        for name in names:
            text = (REPO_ROOT / "generated" / f"{name}.py").read_bytes()
            (root / "generated" / f"{name}.py").write_bytes(text + b"# old\n")
    return root


def leftovers(root: Path) -> list[str]:
    """Anything under `root` that moegen made and should have removed."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if ".moegen-" in p.name or p.name.startswith("moegen-verify-")
    )


def traced_build(
    cwd: Path, args: list[str], kill_at: int | None = None, sig: int = signal.SIGTERM, **popen
) -> tuple[list[str], int, str]:
    """Run `moegen build --no-verify ARGS`, signal it right after step `kill_at` (0-based).

    Returns the steps it reported, its exit status and its stderr.
    """
    steps_r, steps_w = os.pipe()
    go_r, go_w = os.pipe()
    env = _clean_env() | {"MOEGEN_EMIT_TRACE": f"{steps_w},{go_r}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "moegen", "build", "--no-verify", *args],
        cwd=cwd,
        env=env,
        pass_fds=(steps_w, go_r),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )
    os.close(steps_w)
    os.close(go_r)
    steps: list[str] = []
    go: int | None = go_w
    with os.fdopen(steps_r, "rb") as reported:
        for line in reported:  # ends when the build exits: it holds the only write end
            steps.append(line.decode().strip())
            if go is None:
                continue
            if len(steps) - 1 == kill_at:
                proc.send_signal(sig)
                os.close(go)  # from now on no step waits (a blocked section must finish)
                go = None
            else:
                os.write(go, b"x")
    if go is not None:
        os.close(go)
    _, stderr = proc.communicate(timeout=60)
    return steps, proc.returncode, stderr.decode("utf-8", "replace")


def assert_state(out: Path, old: dict, new: dict, *, want_new: bool | None, case: str) -> None:
    now = snapshot(out) if out.exists() else {}
    assert now in (old, new), f"{case}: a mixed or partial set: {sorted(now)}"
    if want_new is not None:
        assert (now == new) is want_new, f"{case}: expected the {'new' if want_new else 'old'} set"


def no_orphans(project: Path, out: Path) -> None:
    specs = sorted((project / "specs").glob("*.yaml"))
    if out.is_dir():
        assert check(specs, out, find_orphans=True).orphans == []


def untouched_build(project: Path, cwd: Path, args: list[str], out: Path, old: dict):
    """The same build on a copy of `project`, never signalled: (its steps, the new set)."""
    reference = project.parent / "reference"
    shutil.copytree(project, reference, symlinks=True)
    steps, code, stderr = traced_build(reference / cwd.relative_to(project), args)
    assert code == 0, stderr
    new = snapshot(reference / out.relative_to(project))
    assert new != old and len(steps) >= 4, steps
    shutil.rmtree(reference)
    return steps, new


def zero_figures(steps: list[str]) -> dict:
    """The report's counters, all zero, and the untouched build's steps."""
    figures = dict.fromkeys(["cases", "mixed", "leftovers"], 0)
    figures |= dict.fromkeys(
        ["SIGKILL: mixed until recovered", "SIGKILL: temporaries until recovered"], 0
    )
    figures["steps"] = steps
    return figures


def after_sigkill(
    project: Path,
    out: Path,
    old: dict,
    new: dict,
    *,
    commit: str,
    committed: bool,
    figures: dict,
    case: str,
) -> None:
    """Judge (or, for the journal, count) what SIGKILL left, then recover as the next write
    would."""
    if commit == "exchange":  # whole at once, before any clean-up
        assert_state(out, old, new, want_new=committed, case=case)
        no_orphans(project, out)  # a stage left beside it is not check's business
    else:  # the journal's documented limit, until the next write recovers
        now = snapshot(out) if out.exists() else {}
        modules = {k: v for k, v in now.items() if ".moegen-" not in k}
        figures["SIGKILL: mixed until recovered"] += modules not in (old, new)
        figures["SIGKILL: temporaries until recovered"] += modules != now
    emit.recover(out)  # what the next write does first


def assert_aborted_by(sig: int, code: int, stderr: str, case: str) -> None:
    """A caught signal: the conventional exit status and a one-line message, no traceback."""
    assert code == 128 + sig, (case, code, stderr)
    assert f"aborted ({signal.Signals(sig).name})" in stderr, (case, stderr)
    assert "Traceback" not in stderr, (case, stderr)


def assert_whole_set_and_nothing_left(
    project: Path, out: Path, old: dict, new: dict, *, committed: bool, figures: dict, case: str
) -> None:
    """The output holds exactly the old or the new set, and moegen left nothing behind."""
    try:
        assert_state(out, old, new, want_new=committed, case=case)
    except AssertionError:
        figures["mixed"] += 1
        raise
    left = leftovers(project.parent)
    figures["leftovers"] += bool(left)
    assert left == [], (case, left)


def run_matrix(
    project: Path,
    cwd: Path,
    args: list[str],
    out: Path,
    commit: str,
    killed_commit: str | None = None,
    signals=SIGNALS,
) -> dict:
    """Each of `signals` after every step; returns the figures for the report.

    The new set is expected once a step starting with `commit` was reported (with SIGKILL:
    with `killed_commit`, where the two differ: the journal's commit point lies inside the
    section where the other signals wait).
    """
    old = snapshot(out) if out.exists() else {}
    steps, new = untouched_build(project, cwd, args, out, old)
    figures = zero_figures(steps)
    base = project.parent / f"{project.name}-base"
    shutil.copytree(project, base)
    for k in range(len(steps)):
        for sig in signals:
            case = f"{signal.Signals(sig).name} after step {k} ({steps[k]})"
            shutil.rmtree(project)
            shutil.copytree(base, project, symlinks=True)
            got, code, stderr = traced_build(cwd, args, kill_at=k, sig=sig)
            assert got[: k + 1] == steps[: k + 1], case
            figures["cases"] += 1
            point = killed_commit if sig == signal.SIGKILL and killed_commit else commit
            committed = any(step.startswith(point) for step in got[: k + 1])
            if sig == signal.SIGKILL:
                assert code == -signal.SIGKILL, (case, stderr)
                after_sigkill(
                    project,
                    out,
                    old,
                    new,
                    commit=commit,
                    committed=committed,
                    figures=figures,
                    case=case,
                )
            else:
                assert_aborted_by(sig, code, stderr, case)
            assert_whole_set_and_nothing_left(
                project, out, old, new, committed=committed, figures=figures, case=case
            )
    shutil.rmtree(base)
    print(f"\n{args}: {figures}")
    return figures


# ---------------------------------------------------------------------------------------
# The signal matrix


@pytest.mark.slow
def test_two_specs_every_signal_after_every_step(tmp_path):
    project = make_project(tmp_path / "p", SPECS)
    args = ["--out", "generated", *(f"specs/{n}.yaml" for n in SPECS)]
    figures = run_matrix(project, project, args, project / "generated", "exchange")
    assert "exchange" in figures["steps"] and figures["mixed"] == figures["leftovers"] == 0


@pytest.mark.slow
def test_one_spec_every_signal_after_every_step(tmp_path):
    project = make_project(tmp_path / "p", SPECS[:1])
    args = ["--out", "generated", f"specs/{SPECS[0]}.yaml"]
    run_matrix(project, project, args, project / "generated", "exchange")


@pytest.mark.slow
def test_new_output_directory_every_signal_after_every_step(tmp_path):
    project = make_project(tmp_path / "p", SPECS, old_output=False)
    args = ["--out", "generated", *(f"specs/{n}.yaml" for n in SPECS)]
    run_matrix(project, project, args, project / "generated", "exchange")


@pytest.mark.slow
def test_journaled_fallback_when_the_output_is_the_current_directory(tmp_path):
    """`--out .`: no exchange (it would strand the shell); the journal, signals blocked."""
    project = make_project(tmp_path / "p", SPECS)
    out = project / "generated"
    args = ["--out", ".", *(f"../specs/{n}.yaml" for n in SPECS)]
    figures = run_matrix(project, out, args, out, "rename ", "commit")
    assert "exchange" not in figures["steps"] and "journal" in figures["steps"]
    assert figures["mixed"] == figures["leftovers"] == 0


def test_ignored_sighup_stays_ignored(tmp_path):
    """`nohup moegen build`: a hang-up must not abort the build."""
    project = make_project(tmp_path / "p", SPECS)
    args = ["--out", "generated", *(f"specs/{n}.yaml" for n in SPECS)]
    steps, code, stderr = traced_build(
        project,
        args,
        kill_at=2,
        sig=signal.SIGHUP,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    assert code == 0, stderr
    assert "wrote generated/mixtral_small_cpu.py" in stderr
    assert leftovers(tmp_path) == []


def test_the_next_build_clears_what_a_killed_one_left(tmp_path):
    project = make_project(tmp_path / "p", SPECS)
    args = ["--out", "generated", *(f"specs/{n}.yaml" for n in SPECS)]
    steps, _, _ = traced_build(project, args)
    stage_written = steps.index("sync stage")
    _, code, _ = traced_build(project, args, kill_at=stage_written, sig=signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert [p.split(".moegen-")[1][:5] for p in leftovers(tmp_path)] == ["stage"]
    result = subprocess.run(
        [sys.executable, "-m", "moegen", "build", "--no-verify", *args],
        cwd=project,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------
# The verify worker and its scratch directory


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


def _wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("moment", ["worker starting", "worker running"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: signal.Signals(s).name)
@pytest.mark.slow
def test_killed_verification_leaves_no_worker_and_no_scratch(tmp_path, sig, moment):
    project = make_project(tmp_path / "p", SPECS[:1])
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    before = snapshot(project / "generated")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moegen", "build", f"specs/{SPECS[0]}.yaml"],
        cwd=project,
        env=_clean_env() | {"TMPDIR": str(scratch_root)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    progress: list[str] = []
    reader = threading.Thread(target=lambda: progress.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        jobs = _wait_for(lambda: list(scratch_root.glob("moegen-verify-*/job.json")), 60, "job")
        job = str(jobs[0])
        _wait_for(lambda: _processes_mentioning(job), 60, "the worker")
        if moment == "worker running":  # it has imported the module: JAX is at work
            _wait_for(lambda: any("verify: import" in line for line in progress), 60, "import")
            time.sleep(0.5)
        proc.send_signal(sig)
        proc.wait(timeout=60)
        reader.join(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    stderr = "".join(progress)
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
    assert proc.returncode == expected, stderr
    # SIGKILL: the worker learns of it from the kernel (PR_SET_PDEATHSIG) and cleans up.
    _wait_for(lambda: not _processes_mentioning(job), 10, "the worker to exit")
    try:
        _wait_for(lambda: not list(scratch_root.iterdir()), 10, "the scratch directory to go")
    except AssertionError:
        raise AssertionError(sorted(map(str, scratch_root.rglob("*")))) from None
    assert snapshot(project / "generated") == before


def test_stale_scratch_of_a_dead_moegen_is_removed(tmp_path):
    """A dead run's scratch (a name moegen made, proven by its tag) goes; a live run's, an
    old-style or look-alike name and another directory's stay."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mark = interrupts.SCRATCH_PREFIX
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interrupts, "owner_token", lambda: f"{dead.pid}-1")
        stale = tmp_path / provenance.owned_name(tmp_path, "", mark)
    stale.mkdir()
    (stale / "job.json").write_text("{}")
    mine = tmp_path / provenance.owned_name(tmp_path, "", mark)
    mine.mkdir()
    foreign = tmp_path / f"moegen-verify-{dead.pid}-1-abc"  # a dead pid, but no proof
    foreign.mkdir()
    provenance.remove_leftovers(tmp_path, mark)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, foreign.name])
