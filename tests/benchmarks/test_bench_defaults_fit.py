"""bench.defaults_fit judges the build's own choice: for a trade the spec leaves open on a
TPU target, the one XLA's read chooses (moegen.fit.own_trade), compiled as the spec with that
trade written, the ledger's beside it. Stand-in reads and no compile here."""

from __future__ import annotations

import yaml
from over_hbm_specs import DEEPSEEK

import bench.defaults_fit as defaults_fit
from moegen.verify import preflight
from moegen.verify.memory import assigned

GiB = 2**30


def test_the_row_names_the_ledgers_choice_and_judges_the_builds(monkeypatch):
    read: list = []

    def assigned_peak(plan):
        read.append((plan.ffn.chunks, plan.experts.token_chunks))
        return 26 * GiB

    monkeypatch.setattr(assigned, "assigned_peak", assigned_peak)
    monkeypatch.setattr(preflight, "module_installed", lambda name: True)
    compiled: list = []

    def recorded(store, path, label, text, source, compile_missing):
        compiled.append((label, yaml.safe_load(text).get("memory")))
        return {"forward": {"peak": 20 * GiB}, "train": {"peak": 26 * GiB}}

    monkeypatch.setattr(defaults_fit, "recorded", recorded)
    row = defaults_fit.judge("deepseek", DEEPSEEK, {"modules": {}}, compile_missing=False)
    assert read == [(1, 1)]  # the layer whole: fastest, and it fits
    assert compiled == [("deepseek_chosen", {"ffn_chunks": 1, "token_chunks": 1})]
    cells = row.split(" | ")
    assert cells[0] == "deepseek" and cells[2] == "16 slices x 1 token chunks"
    assert cells[4:] == [
        "1 slices x 1 token chunks (XLA's read, 1 candidates)",
        "26.00",
        "26.00 of 32.00 GiB: fits",
    ]
