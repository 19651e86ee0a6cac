"""Stage 4, render: StrictUndefined and the template directory, and valid specs render must accept."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
from conftest import EXAMPLE_SPECS, REPO_ROOT
from render_cases import PROBE, render_yaml
from spec_builder import spec_yaml

from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.render import RenderError, render, templates_dir
from moegen.schema import spec_json_schema

# ---------------------------------------------------------------------------------------
# StrictUndefined and the template directory


def _plan_without(plan, field: str) -> SimpleNamespace:
    """A stand-in for `plan` without `field` (dotted: a field of one of its sub-plans)."""
    head, _, rest = field.partition(".")
    values = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != field}
    if rest:
        values[head] = _plan_without(getattr(plan, head), rest)
    return SimpleNamespace(**values)


@pytest.mark.parametrize(
    "field",
    [
        "router.top_k",
        "summary",
        "description",
        "mesh.fsdp_axis",
        "router.renormalize",
        "router.score",
        "kernel",
        "kernel.name",
        "ffn.layout",
    ],
)
def test_render_with_a_plan_missing_a_field_raises(field):
    plan = make_plan(load_valid(EXAMPLE_SPECS[0]))
    # A filter receives the Undefined itself: pyrepr then refuses it (RenderError); either
    # way rendering stops instead of emitting an empty string.
    with pytest.raises((jinja2.UndefinedError, RenderError)) as caught:
        render(_plan_without(plan, field))
    message = str(caught.value)
    assert field.rpartition(".")[2] in message or "Undefined" in message, message


def test_render_with_a_param_missing_a_field_raises():
    plan = make_plan(load_valid(REPO_ROOT / "specs" / "mixtral_small_cpu.yaml"))
    assert plan.mesh.fsdp_axis  # gather_axis is read on the fsdp path only
    params = tuple(_plan_without(p, "gather_axis") for p in plan.params)
    broken = SimpleNamespace(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    broken.params = params
    with pytest.raises(jinja2.UndefinedError):
        render(broken)


def test_render_with_an_intact_stand_in_plan_works():
    """The stand-ins above fail only for the missing field, not for being stand-ins."""
    plan = make_plan(load_valid(EXAMPLE_SPECS[0]))
    stand_in = SimpleNamespace(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
    assert render(stand_in) == render(plan)


def test_templates_are_found_via_templates_dir(repo_root):
    directory = templates_dir()
    assert directory.is_dir()
    assert (directory / "module.py.jinja").is_file()
    packaged = Path(str(__import__("importlib.resources").resources.files("moegen"))) / "templates"
    assert directory.resolve() in {packaged.resolve(), (repo_root / "templates").resolve()}
    from moegen.render import _environment

    env = _environment()
    assert env.undefined is jinja2.StrictUndefined
    assert [Path(p).resolve() for p in env.loader.searchpath] == [directory.resolve()]


def test_every_kernel_and_strategy_the_schema_offers_has_a_template():
    definitions = spec_json_schema()["$defs"]
    offered = {
        "kernels": definitions["Target"]["properties"]["kernel"]["enum"],
        "strategies": definitions["Parallelism"]["properties"]["experts"]["enum"][:-1],  # auto
    }
    for folder, names in offered.items():
        assert names
        for name in names:
            assert (templates_dir() / folder / f"{name}.jinja").is_file(), name


def test_templates_do_no_arithmetic_on_spec_text():
    """Free text reaches code only through the repr-based filters (SPEC_DESCRIPTION)."""
    template = (templates_dir() / "module.py.jinja").read_text(encoding="utf-8")
    uses = re.findall(r"\{\{\s*p\.description[^}]*\}\}", template)
    assert uses and all("pyrepr" in use or "pystr_block" in use for use in uses), uses
    assert "autoescape" not in template


# ---------------------------------------------------------------------------------------
# Valid specs that render must accept (bugs: see the reasons)


def test_description_at_schema_max_length_renders(tmp_path):
    text = spec_yaml(PROBE | {"description": ("lorem ipsum " * 42).strip()[:500]})
    source = render_yaml(tmp_path, text)
    assert "lorem ipsum" in source


def test_long_spec_path_renders(tmp_path):
    text = spec_yaml(PROBE)
    deep = tmp_path / "specs" / "a_rather_long_directory_name" / "and_another_long_one"
    deep.mkdir(parents=True)
    (deep / "probe.yaml").write_text(text, encoding="utf-8")
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        source = render(make_plan(load_valid(deep.relative_to(tmp_path) / "probe.yaml")))
    finally:
        os.chdir(old)
    assert source.startswith("# Code generated by moegen")


def test_no_template_has_two_jobs_in_one_long_file():
    """module.py.jinja composes; public_api.jinja and shard.jinja hold its two halves (issue 17)."""
    lengths = {
        path.relative_to(templates_dir()).as_posix(): len(path.read_text("utf-8").splitlines())
        for path in templates_dir().rglob("*.jinja")
    }
    assert {"module.py.jinja", "public_api.jinja", "shard.jinja"} <= set(lengths)
    assert not {name: n for name, n in lengths.items() if n > 250}
