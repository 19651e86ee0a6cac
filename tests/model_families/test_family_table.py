"""Everything moegen knows of a model family is one entry in one table (issue 53):
moegen.families' FAMILIES, one entry per config.json model_type, read by the checkpoint loader
and by `moegen init --from-hf` alike.

- Every entry says its sizes' keys, its rules, which decoder layers are MoE layers, and (for
  the families moegen loads) where its checkpoints keep the weights; the loader's families are
  exactly the entries that say the last, and neither path keeps a table of its own.
- Both paths run the entry's rule: change the entry and both answer with it.
- For every family both know, a config.json's MoE layers come out the same through both,
  its schedule keys set to values other than the config class's defaults.
- Each path still refuses a bad value in its own terms, naming the file and the key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args

import pytest

from moegen.checkpoints import FAMILIES as LOADABLE
from moegen.checkpoints import CheckpointError
from moegen.checkpoints.schedule import HASH, MOE, schedule_of
from moegen.families import FAMILIES, ConfigReader, Family, LayerRule, Layers, LayerSet, Sizes
from moegen.hf import HfConfigError
from moegen.hf.layers import layers_of
from moegen.hf.mapping import _family

FILE = Path("config.json")


def test_every_entry_says_all_a_family_is() -> None:
    for model_type, entry in FAMILIES.items():
        assert isinstance(entry, Family), model_type
        assert isinstance(entry.sizes, Sizes), model_type
        assert all(entry.sizes.keys(name) for name in ("experts", "embed", "ffn", "top_k"))
        assert isinstance(entry.layers, get_args(LayerRule)), (model_type, entry.layers)


def test_the_loader_covers_the_entries_with_checkpoint_keys() -> None:
    """One loader family per text model's entry; a multimodal twin (text_config) adds its
    model_type to it."""
    with_keys = {t for t, entry in FAMILIES.items() if entry.checkpoint is not None}
    named = {t for family in LOADABLE.values() for t in family.model_types}
    assert named == with_keys
    for name, family in LOADABLE.items():
        assert family.entry is FAMILIES[name] and not family.entry.text_config
        for twin in family.model_types[1:]:
            assert FAMILIES[twin] == dataclasses.replace(family.entry, text_config=True)


def _hf(config: dict[str, Any]) -> Layers:
    """The MoE layers init --from-hf finds (its family look-up, then its reading of the rule)."""
    model_type, _, view = _family(FILE, config)
    return layers_of(FAMILIES[model_type], view)


def _checkpoint(config: dict[str, Any]) -> tuple[list[int], list[int]]:
    """(MoE layers, hash-routed layers) the checkpoint loader finds in [0, count)."""
    model_type = config["model_type"]
    family = next(f for f in LOADABLE.values() if model_type in f.model_types)
    schedule = schedule_of(family, config, FILE)
    assert schedule.count is not None
    kinds = [schedule.kind(i) for i in range(schedule.count)]
    moe = [i for i, kind in enumerate(kinds) if kind == MOE]
    return moe, [i for i, kind in enumerate(kinds) if kind == HASH]


@dataclasses.dataclass(frozen=True)
class Marked:
    """A rule that answers the same whatever the config says: put in the table, it shows
    which paths read the table."""

    answer: Layers

    def moe_layers(self, reader: ConfigReader) -> Layers:
        return self.answer


def _plain_config(model_type: str) -> dict[str, Any]:
    if FAMILIES[model_type].text_config:  # a multimodal config: the text model's keys inside
        return {"model_type": model_type, "text_config": {"num_hidden_layers": 6}}
    return {"model_type": model_type, "num_hidden_layers": 6}


@pytest.mark.parametrize("model_type", sorted(t for f in LOADABLE.values() for t in f.model_types))
def test_both_paths_answer_with_the_tables_entry(model_type: str, monkeypatch) -> None:
    answer = Layers(LayerSet.of([1, 4]), "marked", 6, LayerSet.of([2]))
    family = next(f for f in LOADABLE.values() if model_type in f.model_types)
    marked = dataclasses.replace(FAMILIES[family.name], layers=Marked(answer))  # type: ignore[arg-type]
    monkeypatch.setitem(FAMILIES, family.name, marked)  # type: ignore[index]
    if model_type != family.name:  # the multimodal twin's own entry, for init
        twin = dataclasses.replace(marked, text_config=True)
        monkeypatch.setitem(FAMILIES, model_type, twin)  # type: ignore[index]
    config = _plain_config(model_type)
    found = _hf(config)
    assert (list(found.moe), list(found.hashed)) == ([1, 4], [2])
    assert _checkpoint(config) == ([1, 4], [2])


# name -> (config.json, its MoE layers, its hash-routed layers), each family the loader knows
# with its schedule keys off their config class's defaults
# fmt: off
SAME: dict[str, tuple[dict[str, Any], list[int], list[int]]] = {
    **{f"{t} every": ({"model_type": t, "num_hidden_layers": 3}, [0, 1, 2], []) for t in (
        "mixtral", "olmoe", "granitemoe", "hunyuan_v1_moe", "minimax", "gpt_oss", "kolibri1")},
    "dbrx n_layers": ({"model_type": "dbrx", "n_layers": 2}, [0, 1], []),
    "deepseek_v3 first 1 freq 2": ({"model_type": "deepseek_v3", "num_hidden_layers": 7,
                                    "first_k_dense_replace": 1, "moe_layer_freq": 2}, [2, 4, 6], []),
    "glm4_moe first 2 freq 3": ({"model_type": "glm4_moe", "num_hidden_layers": 9,
                                 "first_k_dense_replace": 2, "moe_layer_freq": 3}, [3, 6], []),
    "dots1 first 3": ({"model_type": "dots1", "num_hidden_layers": 5,
                       "first_k_dense_replace": 3}, [3, 4], []),
    "deepseek_v2 first 2 freq 2": ({"model_type": "deepseek_v2", "num_hidden_layers": 6,
                                    "first_k_dense_replace": 2, "moe_layer_freq": 2}, [2, 4], []),
    "deepseek_v32 types": ({"model_type": "deepseek_v32", "num_hidden_layers": 3,
                            "mlp_layer_types": ["dense", "sparse", "sparse"]}, [1, 2], []),
    "deepseek_v32 derived": ({"model_type": "deepseek_v32", "num_hidden_layers": 5,
                              "first_k_dense_replace": 2}, [2, 3, 4], []),
    # the config classes' defaults, no schedule key given
    "deepseek_v3 default": ({"model_type": "deepseek_v3", "num_hidden_layers": 5}, [3, 4], []),
    "glm4_moe default": ({"model_type": "glm4_moe", "num_hidden_layers": 3}, [1, 2], []),
    "ernie4_5_moe default": ({"model_type": "ernie4_5_moe", "num_hidden_layers": 3}, [1, 2], []),
    "kolibri1_1 default": ({"model_type": "kolibri1_1", "num_hidden_layers": 4}, [2, 3], []),
    "deepseek_v4 default": ({"model_type": "deepseek_v4", "num_hidden_layers": 4}, [3], [0, 1, 2]),
    "minicpm5_moe types": ({"model_type": "minicpm5_moe", "num_hidden_layers": 4,
                            "mlp_layer_types": ["sparse", "dense", "sparse", "sparse"]}, [0, 2, 3], []),
    "minicpm5_moe derived": ({"model_type": "minicpm5_moe", "num_hidden_layers": 4,
                              "first_k_dense_replace": 2, "moe_layer_freq": 2}, [2, 3], []),
    "axk1 types": ({"model_type": "axk1", "num_hidden_layers": 3,
                    "mlp_layer_types": ["sparse", "dense", "sparse"]}, [0, 2], []),
    "axk1 derived": ({"model_type": "axk1", "num_hidden_layers": 7, "first_k_dense_replace": 0,
                      "moe_layer_freq": 3}, [0, 3, 6], []),
    "ergo default": ({"model_type": "ergo", "num_hidden_layers": 3}, [1, 2], []),
    "ergo num_dense_blocks": ({"model_type": "ergo", "num_hidden_layers": 4,
                               "num_dense_blocks": 2}, [2, 3], []),
    "ergo types": ({"model_type": "ergo", "num_hidden_layers": 3,
                    "mlp_layer_types": ["sparse", "dense", "sparse"]}, [0, 2], []),
    "kolibri1_1 listed": ({"model_type": "kolibri1_1", "num_hidden_layers": 5,
                           "mlp_only_layers": [1, 3]}, [0, 2, 4], []),
    "qwen2_moe step 2 less 3": ({"model_type": "qwen2_moe", "num_hidden_layers": 8,
                                 "decoder_sparse_step": 2, "mlp_only_layers": [3]}, [1, 5, 7], []),
    "qwen2_moe null mlp_only_layers": ({"model_type": "qwen2_moe", "num_hidden_layers": 2,
                                        "mlp_only_layers": None}, [0, 1], []),
    "qwen3_moe step 3": ({"model_type": "qwen3_moe", "num_hidden_layers": 9,
                          "decoder_sparse_step": 3, "num_experts": 8}, [2, 5, 8], []),
    "qwen3_moe no experts": ({"model_type": "qwen3_moe", "num_hidden_layers": 2,
                              "num_experts": 0}, [], []),
    "jamba period 3 offset 0": ({"model_type": "jamba", "num_hidden_layers": 7,
                                 "expert_layer_period": 3, "expert_layer_offset": 0,
                                 "num_experts": 4}, [0, 3, 6], []),
    "jamba one expert": ({"model_type": "jamba", "num_hidden_layers": 4, "num_experts": 1}, [], []),
    "llama4 moe_layers in text_config": ({"model_type": "llama4", "text_config": {
        "num_hidden_layers": 5, "moe_layers": [0, 2, 4]}}, [0, 2, 4], []),
    "llama4_text step 3": ({"model_type": "llama4_text", "num_hidden_layers": 7,
                            "interleave_moe_layer_step": 3}, [2, 5], []),
    "ernie4_5_moe window": ({"model_type": "ernie4_5_moe", "num_hidden_layers": 10,
                             "moe_layer_start_index": 2, "moe_layer_end_index": 7,
                             "moe_layer_interval": 2}, [3, 5, 7], []),
    "ernie4_5_moe end -1": ({"model_type": "ernie4_5_moe", "num_hidden_layers": 7,
                             "moe_layer_start_index": 0, "moe_layer_end_index": -1,
                             "moe_layer_interval": 3}, [2, 5], []),
    "deepseek_v4 types": ({"model_type": "deepseek_v4", "num_hidden_layers": 4,
                           "mlp_layer_types": ["hash_moe", "moe", "hash_moe", "moe"]}, [1, 3], [0, 2]),
    "deepseek_v4 num_hash_layers": ({"model_type": "deepseek_v4", "num_hidden_layers": 4,
                                     "num_hash_layers": 1}, [1, 2, 3], [0]),
}
# fmt: on


def test_the_cases_cover_every_family_the_loader_knows() -> None:
    types = {config["model_type"] for config, _, _ in SAME.values()}
    assert {f.name for f in LOADABLE.values() if types & set(f.model_types)} == set(LOADABLE)


@pytest.mark.parametrize("name", sorted(SAME))
def test_both_paths_find_the_same_moe_layers(name: str) -> None:
    config, moe, hashed = SAME[name]
    found = _hf(config)
    assert (list(found.moe), list(found.hashed)) == (moe, hashed), found.how
    assert _checkpoint(config) == (moe, hashed)


# (model_type, config.json change, the key as each path names it)
BAD = [
    ("qwen2_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen2_moe", {"mlp_only_layers": "3"}, "mlp_only_layers"),
    ("deepseek_v3", {"first_k_dense_replace": -1}, "first_k_dense_replace"),
    ("deepseek_v3", {"num_hidden_layers": True}, "num_hidden_layers"),
    ("jamba", {"expert_layer_offset": 2}, "expert_layer_offset"),
    ("llama4", {"text_config": {"num_hidden_layers": 4, "moe_layers": [1, "2"]}}, "moe_layers"),
    ("deepseek_v4", {"mlp_layer_types": ["moe", "sparse"]}, "mlp_layer_types"),
]


@pytest.mark.parametrize(("model_type", "change", "key"), BAD, ids=[f"{b[0]}-{b[2]}" for b in BAD])
def test_each_path_refuses_a_bad_value_in_its_own_terms(
    model_type: str, change: dict[str, Any], key: str
) -> None:
    count = {} if "text_config" in change else {"num_hidden_layers": 2}
    config = {"model_type": model_type, **count} | change
    with pytest.raises(HfConfigError) as hf:
        _hf(config)
    with pytest.raises(CheckpointError) as loader:
        _checkpoint(config)
    for error in (hf, loader):
        assert str(error.value).startswith(f"{FILE}: ") and key in str(error.value), error.value


def test_every_family_has_a_transformers_case() -> None:
    """A family is one entry of the table plus its test cases (tests/support/families.py), which read
    the entry's classes and size keys: every case is of an entry (or of a family init refuses),
    and every entry but a multimodal twin has a case, which the oracle, init and (with
    checkpoint keys) the loader tests then run."""
    from families import FAMILIES as CASES

    from moegen.hf import REFUSED

    of = {case.model_type or case.name for case in CASES}
    assert of - set(FAMILIES) <= set(REFUSED), of - set(FAMILIES)
    untested = {t for t, entry in FAMILIES.items() if not entry.text_config} - of
    assert not untested, f"families with no case in tests/families*.py: {sorted(untested)}"
