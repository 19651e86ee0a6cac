"""The plan chooses its trades (token chunks, FFN slices) and lists its candidates from one
shape's quantities: one full plan per shape, each trade planned once, no spec rewritten and
planned again (issue 28: a rewritten spec re-planned cost 27 full plans per make_plan)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import EXAMPLE_SPECS

import moegen.plan.assemble as assemble
import moegen.plan.trades as trades
from moegen.pipeline import load_valid
from moegen.plan import make_plan
from moegen.plan.model import Trade
from moegen.plan.trades import shape_basis, traded
from moegen.spec import Spec

ONE_SHAPE = [p for p in EXAMPLE_SPECS if not load_valid(p).spec.shapes.variants]


@pytest.mark.parametrize("path", ONE_SHAPE, ids=lambda p: p.stem)
def test_one_full_plan_and_no_rewritten_spec(path, monkeypatch) -> None:
    loaded = load_valid(path)
    full_plans, trades_planned = [], []
    real_plan, real_traded = assemble._plan, trades.traded

    def counting_plan(*args, **kwargs):
        full_plans.append(args)
        return real_plan(*args, **kwargs)

    def counting_traded(basis, trade):
        trades_planned.append(trade)
        return real_traded(basis, trade)

    def no_copy(self, *args, **kwargs):
        raise AssertionError("the plan rewrote the spec to plan a candidate")

    monkeypatch.setattr(assemble, "_plan", counting_plan)
    monkeypatch.setattr(trades, "traded", counting_traded)
    monkeypatch.setattr(Spec, "model_copy", no_copy)
    plan = make_plan(loaded)
    assert len(full_plans) == 1
    assert len(trades_planned) == len(set(trades_planned)), "a trade was planned twice"
    listed = plan.chunk_candidates.token_chunks + plan.chunk_candidates.sliced_token_chunks
    assert len(trades_planned) >= len({(o.chunks, o.ffn_chunks) for o in listed})


@pytest.mark.parametrize("path", ONE_SHAPE, ids=lambda p: p.stem)
def test_the_chosen_trade_is_the_plans_own(path) -> None:
    """The plan's layer is the trade it chose, planned alone: the same memory and FLOPs as
    that trade's candidate row, so `moegen plan` lists what the module runs."""
    loaded = load_valid(path)
    plan = make_plan(loaded)
    alone = traded(
        shape_basis(loaded, False, None), Trade(plan.experts.token_chunks, plan.ffn.chunks)
    )
    assert alone.chosen.memory == plan.memory
    # (the plan adds the layer whole's step time, which its trade's is a multiple of)
    assert replace(alone.roofline, whole_step=plan.roofline.whole_step) == plan.roofline
    assert alone.network == plan.network
