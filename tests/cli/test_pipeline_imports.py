"""The pipeline is one-way: load -> kernels -> validate -> plan -> fit -> render -> verify -> emit,
each stage importing only the stages before it, and no two modules importing each other.

moegen.kernels (one module per grouped-matmul kernel, and their registry) is a stage of its
own, right after load: each kernel's rules read a LoadedSpec, so it cannot be a base module,
and validation (its rules), the plan (its config) and verification (its twin substitute and
preflight) all ask it, so it must come before all three. It cannot sit inside the validate
stage, because the plan never imports validation (test_plan_does_not_import_validate): a
kernel's config is a decision, its rules a refusal, and both are the kernel's.
moegen.strategies (one module per expert-parallel strategy, and their registry) stands in
the same stage for the same reasons: its rules refuse, its row and byte counts are the plan's.

Every module of moegen/ is parsed (ast, nothing imported) and given its stage; every import in
it (at the top, in a function, under TYPE_CHECKING: each is a dependency) becomes an edge to
the module it names. Base modules stand outside the stages: the package itself (its
version), moegen.interrupts (signals and process lifetimes, used by verify's worker, the emit
swap and the CLI alike) and the facts both validation and the plan consult: the chip
catalogue (hardware) and integer arithmetic (sizes). They import only each other, so they
cannot carry a stage's dependency backwards. (The megablox kernel model, what a tile costs
and whether it fits VMEM, is the pallas kernel's: moegen.kernels.tiling, in the kernels
stage, which validation and the plan both come after.) Runtime libraries stand outside the
pipeline too: moegen.checkpoints loads published weights into a generated module (reading only
the module's constants) and imports no stage. It also holds the one table of which decoder
layers of a model are MoE layers (moegen.families.schedules), because the loader needs it
and may import nothing of moegen outside itself; moegen.hf (top) reads it through the face.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "moegen"
STAGES = ("load", "kernels", "validate", "plan", "fit", "render", "verify", "emit", "top")
# module (or package, for all its modules) -> stage; the longest match wins
STAGE_OF = {
    "moegen.load": "load",
    "moegen.spec": "load",
    "moegen.spec_placement": "load",  # basic types, shapes, dtypes and mesh sections
    "moegen.spec_router": "load",  # the router section
    "moegen.spec_parallelism": "load",  # the parallelism section
    "moegen.spec_glu": "load",  # the gated activation's parameters
    "moegen.diagnostics": "load",
    "moegen.kernels": "kernels",  # the kernels' registry: rules, configs, twins, preflights
    "moegen.strategies": "kernels",  # the strategies' registry, beside the kernels'
    "moegen.validate": "validate",
    "moegen.variants": "validate",  # a spec with fields changed, validated again
    "moegen.plan": "plan",
    "moegen.fit": "fit",  # the plan against HBM; the compiler's figure through a handed reader
    "moegen.render": "render",
    "moegen.render_variants": "render",  # a shape variant's statements beside the main ones
    "moegen.verify": "verify",
    "moegen.emit": "emit",
    "moegen.journal": "emit",  # the per-file protocol's journal, read back with proof
    "moegen.pipeline": "top",
    "moegen.parallel": "top",
    "moegen.cli": "top",
    "moegen.cli_init": "top",  # the init command
    "moegen.cli_output": "top",  # refusing a spec, the heartbeat on a terminal
    "moegen.cli_rebalance": "top",  # the rebalance command
    "moegen.cli_plan": "top",  # the plan command
    "moegen.cli_tune": "top",  # the tune command
    "moegen.__main__": "top",
    "moegen.check": "top",
    "moegen.tune": "top",
    "moegen.schema": "top",
    "moegen.schema_file": "top",  # --check and --write of the schema file
    "moegen.init": "top",  # a starter spec, validated before it is written
    "moegen.hf": "top",  # init --from-hf: specs from a transformers config.json
    "moegen.install_te": "top",  # runs the shipped TE installer
    "moegen.docs_reference": "top",  # docs/reference/ written from the spec and the CLI
    "moegen.docs_families": "top",  # docs/reference/families.md written from the family table
}
BASE = {
    "moegen",
    "moegen.interrupts",
    "moegen.provenance",
    "moegen.hardware",
    "moegen.pins",
    "moegen.sizes",
}
# packages used at run time beside generated modules, not by the pipeline: no stage, and they
# import nothing of moegen outside themselves
RUNTIME = ("moegen.checkpoints", "moegen.families", "moegen.nnx", "moegen.placement")
KNOWLEDGE = "moegen.families"  # the family table: any runtime library may read it


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def stage(module: str) -> str | None:
    """The module's stage; None for a base module or a runtime library's; ValueError when
    it has none."""
    if module in BASE or _runtime(module):
        return None
    owners = [m for m in STAGE_OF if module == m or module.startswith(m + ".")]
    return STAGE_OF[max(owners, key=len)]


def _runtime(module: str) -> str | None:
    """The runtime library `module` belongs to, if any."""
    return next((r for r in RUNTIME if module == r or module.startswith(r + ".")), None)


def _known(name: str) -> str | None:
    """The moegen module `name` is, or is inside of (a name imported from it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def _face_names(package: str) -> frozenset[str]:
    """The names a package's face binds by importing them (what `from package import x`
    gets, where x is also the name of one of its modules)."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return frozenset()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return frozenset(
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    )


def _imported(base: str, name: str) -> str:
    """What `from base import name` names: the face's own binding, else base.name."""
    return base if name in _face_names(base) else f"{base}.{name}"


def imports(module: str) -> set[str]:
    """The moegen modules `module` imports, wherever in it the import is."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from moegen import interrupts` names a module; `from moegen.plan import Plan`
            # a name inside one; `from moegen.load import shape_variants` the function the
            # face re-exports, not its module of the same name
            names = [_imported(base, alias.name) for alias in node.names] or [base]
        else:
            continue
        edges.update(k for k in map(_known, names) if k is not None and k != module)
    return edges


GRAPH = {module: imports(module) for module in MODULES}


def test_every_module_has_a_stage() -> None:
    unplaced = []
    for module in MODULES:
        try:
            stage(module)
        except ValueError:
            unplaced.append(module)
    assert not unplaced, f"give these modules a stage in STAGE_OF: {unplaced}"


def test_base_modules_import_no_stage() -> None:
    for module in BASE:
        staged = GRAPH[module] - BASE
        assert not staged, f"{module} is a base module but imports {staged}"


def test_runtime_libraries_import_no_stage() -> None:
    """moegen.checkpoints runs beside generated modules: it imports only its own modules and
    the family table."""
    for module in MODULES:
        library = _runtime(module)
        if library is None:
            continue
        allowed = {library} if library == KNOWLEDGE else {library, KNOWLEDGE}
        outside = {target for target in GRAPH[module] if _runtime(target) not in allowed}
        assert not outside, (
            f"{module} is part of the runtime library {library} but imports {outside}"
        )


def test_no_module_imports_a_later_stage() -> None:
    backwards = [
        f"{module} ({stage(module)}) imports {target} ({stage(target)})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if stage(target) is not None
        and stage(module) is not None
        and STAGES.index(stage(target)) > STAGES.index(stage(module))
    ]
    assert not backwards, "a stage imports a later one:\n  " + "\n  ".join(backwards)


def test_plan_does_not_import_validate() -> None:
    """The plan decides; validation only refuses. A plan that reads validation's rules takes
    its decisions in the wrong stage (issue 17: plan imported validate.memory)."""
    reaching = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        if stage(module) == "plan"
        for target in sorted(targets)
        if stage(target) == "validate"
    ]
    assert not reaching, "the plan stage imports validation:\n  " + "\n  ".join(reaching)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles(GRAPH)
    assert not cycles, "modules that import each other: " + "; ".join(map(" <-> ".join, cycles))


def _unit(module: str) -> str:
    """A top-level unit of the package: a subpackage (moegen.fit) or a loose module."""
    return ".".join(module.split(".")[:2])


def test_no_package_import_cycle() -> None:
    """No two top-level units (subpackages, loose modules) import each other, through their
    faces or past them: a package is one concern, used one way."""
    units: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        for target in targets:
            if _unit(target) != _unit(module):
                units.setdefault(_unit(module), set()).add(_unit(target))
    cycles = _cycles(units)
    assert not cycles, "packages that import each other: " + "; ".join(map(" <-> ".join, cycles))


def test_no_import_of_another_packages_submodule() -> None:
    """Outside a package its face is its interface: a module of moegen.verify may import
    moegen.verify.memory.assigned, a module of moegen.fit only moegen.verify. (Loose modules of
    moegen itself are their own faces; a package's folders by role are its own business.)"""
    faces = {m for m, path in MODULES.items() if path.name == "__init__.py"}
    reaching = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if target != _unit(target) and _unit(target) in faces and _unit(module) != _unit(target)
    ]
    assert not reaching, "imports past a package's face:\n  " + "\n  ".join(reaching)


def test_verify_reads_hlo_through_one_parser() -> None:
    """The collective analysis, the loop trips and the ring overlap read HLO only through
    moegen.verify.hlo.parse; counters and loops no longer import each other."""
    readers = ("collectives", "loops", "overlap")
    for reader in readers:
        assert "moegen.verify.hlo.parse" in GRAPH[f"moegen.verify.hlo.{reader}"], reader
    assert "moegen.verify.hlo.counters" not in GRAPH["moegen.verify.hlo.loops"]
    parsers = [m for m, path in MODULES.items() if "def parse_instruction" in path.read_text()]
    assert parsers == ["moegen.verify.hlo.parse"], parsers


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}}, [["a", "b", "c"]]),
    ],
)
def test_the_cycle_finder(graph, expected) -> None:
    assert _cycles(graph) == expected


def test_imports_are_resolved_to_modules() -> None:
    """The edges this test relies on, as written in the sources."""
    assert "moegen.interrupts" in GRAPH["moegen.emit"]  # from moegen import interrupts
    assert "moegen.plan" in GRAPH["moegen.render"]  # from moegen.plan import Plan
    assert "moegen.verify.worker.cuda" in GRAPH["moegen.verify.worker.child"]  # inside a function
    assert "moegen.verify.twin" in GRAPH["moegen.verify"]


def _face_statement_problem(node: ast.stmt) -> str | None:
    """Why a statement does not belong in a package face (None: it does)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None  # the docstring
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in ("__all__", "__version__"):
            return None
    return f"line {node.lineno}: {type(node).__name__}"


@pytest.mark.parametrize(
    "package", sorted(m for m, p in MODULES.items() if p.name == "__init__.py")
)
def test_package_faces_only_re_export(package: str) -> None:
    """A package's __init__ names what the package offers; its logic lives in named modules
    (a reader finds `make_plan` in moegen/plan/assemble.py, not in a face)."""
    tree = ast.parse(MODULES[package].read_text())
    problems = [p for node in tree.body if (p := _face_statement_problem(node))]
    assert not problems, f"{package}/__init__.py holds logic: {problems}"
