"""bench.rekey maps the stores' keys: pairs joined by the plan both trees render, applied to
every store's keys and packing rows' module fields (the readers themselves stood in)."""

from __future__ import annotations

import json

import bench.rekey as rekey


def test_pairs_join_each_plan_old_key_to_its_key_here(tmp_path, monkeypatch, capsys):
    old = {"plan-a": "old-a", "plan-b": "old-b", "plan-gone": "old-c"}
    (tmp_path / "plans.json").write_text(json.dumps(old))
    answered: list[dict] = []

    def keys_here(reads, answers):
        answered.append(answers)  # the readers look records up under the old keys
        return {"plan-a": "new-a", "plan-b": "new-b", "plan-new": "new-d"}

    monkeypatch.setattr(rekey, "_keys_by_plan", keys_here)
    out = tmp_path / "pairs.json"
    assert rekey.main(["plan-pairs", str(tmp_path / "plans.json"), str(out), "reads"]) == 0
    assert answered == [old]
    assert json.loads(out.read_text()) == {"old-a": "new-a", "old-b": "new-b"}
    assert "only in the old tree: 1, only here: 1" in capsys.readouterr().out


def test_an_old_key_two_plans_render_differently_here_is_refused(tmp_path, monkeypatch):
    (tmp_path / "plans.json").write_text(json.dumps({"plan-a": "old", "plan-b": "old"}))
    monkeypatch.setattr(
        rekey, "_keys_by_plan", lambda reads, answers: {"plan-a": "x", "plan-b": "y"}
    )
    out = tmp_path / "pairs.json"
    assert rekey.main(["plan-pairs", str(tmp_path / "plans.json"), str(out), "reads"]) == 1
    assert not out.exists()


def test_apply_maps_store_keys_variants_and_packing_rows(tmp_path):
    (tmp_path / "pairs.json").write_text(json.dumps({"old-a": "new-a"}))
    store, packing = tmp_path / "store.json", tmp_path / "packing.json"
    records = {"old-a": {"spec": "s0"}, "old-a:v1": {"spec": "s0"}, "other": {"spec": "s1"}}
    store.write_text(json.dumps({"modules": records}))
    packing.write_text(json.dumps([{"spec": "s0", "module": "old-a"}, {"module": "other"}]))
    assert rekey.main(["apply", str(tmp_path / "pairs.json"), str(store), str(packing)]) == 0
    assert set(json.loads(store.read_text())["modules"]) == {"new-a", "new-a:v1", "other"}
    assert [row["module"] for row in json.loads(packing.read_text())] == ["new-a", "other"]
