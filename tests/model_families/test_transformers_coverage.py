"""Every MoE block of the installed transformers is checked by the oracle, refused, or pending.

The oracle (tests/model_families/test_transformers_oracle.py) covers the transformers it runs against, not a
list: this test walks the model packages of the installed transformers
(transformers/models/*/modeling_*.py), finds their MoE block classes, and fails on a block
that is neither
  (a) checked: a family of the table (tests/support/families.py) names it as its block,
  (b) refused: listed in tests/support/oracle/coverage.py with what differs from what moegen expresses,
  (c) pending: listed there with the issue-29 table row it waits for;
and on a stale table entry (a class listed that is no longer a block of transformers, or listed
twice: checked and refused, or refused and pending).

What a MoE block is. The source files are read (parsing ~540 files is quick; importing them
is not); a class defined at the top level of a modeling file is a MoE block when its body
assigns to attributes of `self`
  - routed experts: an attribute named `experts`, or an instance of a class whose name ends
    in `Experts` (shared experts excluded: a class name with `Shared` in it), and
  - a router: an attribute named `gate`, `router` or `router_gate`, or an instance of a class
    whose name holds `Router` or `Gating`;
or one of the two where its name says it is a mixture (it holds `MoE`, `Moe` or `MoA` past
the model's prefix): experts chosen by an input (ViTPose's dataset index), or experts that
are no module of their own (Doge's embedding rows); or when it owns two or more MoE blocks (a
modality split: ERNIE-4.5-VL's text and vision experts behind one layer). A class named as
the experts alone (`...Experts`) or as a router (`Router`, `Gating`) is a part of a block, not
one. Each block found is then imported (a module that fails to import is a failure, listed)
and must be an nn.Module; two names of one class count once (the class object decides).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from oracle_gate import require_oracle

require_oracle()  # torch and transformers, or this module skipped (CI: failed)

import families  # noqa: E402
from oracle.coverage import PENDING, REFUSED  # noqa: E402
from torch import nn  # noqa: E402

ROUTER_NAMES = {"gate", "router", "router_gate"}
ROUTER_CLASS = re.compile(r"Router|Gating")
MIXTURE_NAME = re.compile(r"Mo[EA]|Moe")


@dataclass(frozen=True)
class Owned:
    """What a class's body assigns to attributes of `self`: name -> the class it calls, or
    None where the value is no call of a name."""

    attributes: dict[str, str | None]

    def callees(self) -> set[str]:
        return {callee for callee in self.attributes.values() if callee}


def _callee(value: ast.expr) -> str | None:
    """`Foo(...)` or `module.Foo(...)` -> "Foo"."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _owned(node: ast.ClassDef) -> Owned:
    attributes: dict[str, str | None] = {}
    for sub in ast.walk(node):
        targets = sub.targets if isinstance(sub, ast.Assign) else []
        if isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                if target.value.id == "self":
                    value = getattr(sub, "value", None)
                    callee = _callee(value) if value is not None else None
                    attributes[target.attr] = attributes.get(target.attr) or callee
    return Owned(attributes)


def _owns_experts(owned: Owned) -> bool:
    if "experts" in owned.attributes:
        return True
    return any(c.endswith("Experts") and "Shared" not in c for c in owned.callees())


def _owns_router(owned: Owned) -> bool:
    if ROUTER_NAMES & set(owned.attributes):
        return True
    return any(ROUTER_CLASS.search(callee) for callee in owned.callees())


def _is_block(name: str, prefix: str, owned: Owned) -> bool:
    """Routed experts and a router, or either of them in a class named a mixture."""
    if name.endswith("Experts") or ROUTER_CLASS.search(name):  # a part of a block
        return False
    mixture = bool(MIXTURE_NAME.search(name[len(prefix) :]))
    experts, router = _owns_experts(owned), _owns_router(owned)
    return (experts and router) or (mixture and (experts or router))


def _model_prefix(names: list[str]) -> str:
    """The prefix every class of a modeling file shares with its PreTrainedModel (Qwen3Moe
    of Qwen3MoePreTrainedModel): a mixture named in it says nothing about one class."""
    for name in names:
        if name.endswith("PreTrainedModel"):
            return name[: -len("PreTrainedModel")]
    return ""


def blocks_in_source(text: str) -> list[str]:
    """The MoE block classes a modeling file's source defines (the criterion above)."""
    classes = [node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)]
    prefix = _model_prefix([node.name for node in classes])
    owned = {node.name: _owned(node) for node in classes}
    found = [
        name
        for name, owns in owned.items()
        if _is_block(name, prefix if name.startswith(prefix) else "", owns)
    ]
    wrappers = [
        name
        for name, owns in owned.items()
        if name not in found and len([c for c in owns.attributes.values() if c in found]) >= 2
    ]
    return found + wrappers


@dataclass(frozen=True)
class Found:
    blocks: dict[str, type]  # "folder.Class" -> the class, one name per class
    failures: list[str]  # modules that did not import, names that are no nn.Module


def _modeling_files() -> Iterator[Path]:
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    yield from sorted((Path(spec.origin).parent / "models").glob("*/modeling_*.py"))


def _confirmed(path: Path, names: list[str], seen: dict[int, str], found: Found) -> None:
    """Import the module of `path` and record its blocks `names` (a class seen under an
    earlier name counts once)."""
    module_name = f"transformers.models.{path.parent.name}.{path.stem}"
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is reported, not skipped
        found.failures.append(f"{module_name}: {type(error).__name__}: {error}")
        return
    for name in names:
        cls = getattr(module, name)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            found.failures.append(f"{module_name}.{name} is no nn.Module")
        elif id(cls) not in seen:
            seen[id(cls)] = name
            found.blocks[f"{path.parent.name}.{name}"] = cls


@functools.cache
def found_blocks() -> Found:
    """The MoE blocks of the installed transformers (the criterion of the docstring)."""
    found = Found({}, [])
    seen: dict[int, str] = {}
    for path in _modeling_files():
        names = blocks_in_source(path.read_text(encoding="utf-8"))
        if names:
            _confirmed(path, names, seen, found)
    return found


def checked() -> set[str]:
    """The blocks a family of the table names (the oracle runs each)."""
    return {f"{family.transformers.block_folder}.{family.block}" for family in families.FAMILIES}


def test_every_moe_block_is_checked_refused_or_pending() -> None:
    found = found_blocks()
    assert not found.failures, "transformers modules with MoE blocks failed:\n" + "\n".join(
        found.failures
    )
    accounted = checked() | set(REFUSED) | set(PENDING)
    missing = sorted(set(found.blocks) - accounted)
    assert not missing, (
        "MoE blocks of transformers neither checked by the oracle (tests/support/families.py) nor "
        f"refused or pending (tests/support/oracle/coverage.py): {missing}"
    )
    # the count says what "every" was: the oracle's families, refusals and waits
    print(
        f"{len(found.blocks)} MoE blocks: {len(checked())} checked, {len(REFUSED)} refused, "
        f"{len(PENDING)} pending"
    )


def test_table_has_no_stale_entries() -> None:
    blocks = set(found_blocks().blocks)
    listed = {"checked (tests/support/families.py)": checked()}
    listed |= {"refused": set(REFUSED), "pending": set(PENDING)}
    stale = {kind: sorted(names - blocks) for kind, names in listed.items() if names - blocks}
    assert not stale, f"listed but no MoE block of the installed transformers: {stale}"
    kinds = list(listed)
    for index, kind in enumerate(kinds):
        for other in kinds[index + 1 :]:
            both = sorted(listed[kind] & listed[other])
            assert not both, f"listed both {kind} and {other}: {both}"
    for name, pending in PENDING.items():
        assert pending.row and pending.differs, f"{name}: a pending block names its row"
    for name, reason in REFUSED.items():
        assert reason.strip(), f"{name}: a refusal says what differs"


def test_nllb_moe_runs_two_experts_whatever_it_routes() -> None:
    """The reason NLLB-MoE is refused (tests/support/oracle/coverage.py), held to the installed
    transformers: its block equals expert_1 on each token's top-1 weight plus expert_0 on
    the rest, and not the mixture of the experts the router chose."""
    import torch
    from transformers.models.nllb_moe import configuration_nllb_moe, modeling_nllb_moe

    torch.manual_seed(0)
    config = configuration_nllb_moe.NllbMoeConfig(
        d_model=16, num_experts=8, expert_capacity=1000, moe_token_dropout=0.0
    )
    block = modeling_nllb_moe.NllbMoeSparseMLP(config, 24).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        got = block(x).reshape(-1, 16)
        tokens = x.reshape(-1, 16)
        top_1, probs, _ = block.router(tokens)
        experts = [block.experts[f"expert_{e}"](tokens) for e in range(8)]
        first = (probs * top_1).sum(-1, keepdim=True)
        two_experts = experts[1] * first + experts[0] * (probs.sum(-1, keepdim=True) - first)
        mixture = sum(experts[e] * probs[:, e : e + 1] for e in range(8))
    assert set(top_1.argmax(-1).tolist()) - {0, 1}, "the router chose other experts"
    assert torch.allclose(got, two_experts, atol=1e-6)
    assert not torch.allclose(got, mixture, atol=1e-2)


# The criterion on sources written for it: what counts as a block and what does not.
CRITERION_SOURCE = """
class FooPreTrainedModel(PreTrainedModel): ...
class FooExperts(nn.Module):
    def __init__(self):
        self.gate_up_proj = nn.Parameter(torch.empty(1))
class FooRouter(nn.Module):
    def __init__(self):
        self.weight = nn.Parameter(torch.empty(1))
class FooSparseMoeBlock(nn.Module):
    def __init__(self, config):
        self.gate = FooRouter(config)
        self.experts = FooExperts(config)
class FooDenseMoe(nn.Module):
    def __init__(self, config):
        self.experts = FooExperts(config)
class FooRetrievalMoE(nn.Module):
    def __init__(self, config):
        self.router_gate = nn.Linear(1, 2)
        self.down_embed = nn.Embedding(4, 1)
class FooMLP(nn.Module):
    def __init__(self, config):
        self.shared_experts = FooSharedExperts(config)
        self.gate = nn.Linear(1, 1)
class FooModalities(nn.Module):
    def __init__(self, config):
        self.text = FooSparseMoeBlock(config)
        self.vision = FooSparseMoeBlock(config)
class FooMoeDecoderLayer(nn.Module):
    def __init__(self, config):
        self.mlp = FooSparseMoeBlock(config)
"""


def test_the_criterion_finds_blocks_and_wrappers_not_experts_or_layers() -> None:
    assert blocks_in_source(CRITERION_SOURCE) == [
        "FooSparseMoeBlock",  # a router and experts
        "FooDenseMoe",  # experts, named a mixture: chosen by an input
        "FooRetrievalMoE",  # a router, named a mixture: experts as embedding rows
        "FooModalities",  # two blocks behind one module
    ]
