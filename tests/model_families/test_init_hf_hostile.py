"""`moegen init --from-hf` and `moegen init` against hostile input: layer counts up to what an
int32 holds (answered by arithmetic, not one entry a layer), per-layer work past its bound,
JSON that Python reads but a config must not hold (5,000-digit integers, duplicate keys), a
spec drafted from a config that fails validation (its diagnostics name a file never written,
and where the value came from), and paths that are not files.

Every refusal: its documented exit code (docs/reference/cli.md: 2 usage, 3 invalid spec),
a message naming the file and the key, no traceback or internal error, nothing written.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_no_traceback
from init_hf_cases import LAYER_LISTS
from init_hf_configs import DEEPSEEK, ERNIE, GEMMA4_26B, LLAMA4_TEXT, MIXTRAL, QWEN2, STEP3P7

from moegen.families import MAX_LAYERS, ConfigView, LayerSet, describe, read_json
from moegen.hf.layer_kinds import MAX_KINDS
from moegen.hf.layers import layers_of
from moegen.hf.mapping import _family, choices_of, model_of

INT32_MAX = 2**31 - 1
HUNYUAN = {
    "model_type": "hunyuan_v1_moe",
    "num_experts": 16,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 4,
}


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def write_config(folder: Path, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data)
    (folder / "config.json").write_text(text, encoding="utf-8")
    return folder / "config.json"


def init_from(invoke_main, config: Path, cwd: Path, *args: str):
    result = invoke_main("init", "--from-hf", config, *args, cwd=cwd)
    assert_no_traceback(result.output)
    return result


# ---- layer counts an int32 holds: the same rules, by arithmetic ------------------------------

HUGE = [
    ("every layer", {**MIXTRAL, "num_hidden_layers": INT32_MAX}, "0-2147483646", INT32_MAX),
    ("a billion layers", {**MIXTRAL, "num_hidden_layers": 10**9}, "0-999999999", 10**9),
    (
        "first_k_dense_replace",
        {"model_type": "deepseek_v3", **DEEPSEEK, "first_k_dense_replace": 2}
        | {"num_hidden_layers": INT32_MAX},
        "2-2147483646",
        INT32_MAX - 2,
    ),
    (
        "interleave step",
        {**LLAMA4_TEXT, "num_hidden_layers": INT32_MAX},
        "1, 3, ..., 2147483645",
        2**30 - 1,
    ),
    (
        "sparse step less mlp_only_layers",
        {**QWEN2, "decoder_sparse_step": 2, "mlp_only_layers": [3], "num_hidden_layers": INT32_MAX},
        "1, 5, 7, ..., 2147483645",
        2**30 - 2,
    ),
    (
        "expert period",
        {**MIXTRAL, "model_type": "jamba", "num_experts": 8, "num_hidden_layers": INT32_MAX},
        "1, 3, ..., 2147483645",
        2**30 - 1,
    ),
    (
        "window without an end",
        {k: v for k, v in ERNIE.items() if k != "moe_layer_end_index"}
        | {"num_hidden_layers": INT32_MAX, "moe_layer_interval": 3, "moe_layer_start_index": 1},
        "2, 5, ..., 2147483645",
        715827882,
    ),
    (
        "moe_layer_freq",
        {"model_type": "dots3_note_text", **DEEPSEEK, "moe_layer_freq": 2}
        | {"num_hidden_layers": INT32_MAX, "shared_experts_intermediate_size": 16},
        "2, 4, ..., 2147483646",
        2**30 - 1,
    ),
    (
        "enable_moe_block",
        {**GEMMA4_26B, "text_config": GEMMA4_26B["text_config"] | {"num_hidden_layers": INT32_MAX}},
        "0-2147483646",
        INT32_MAX,
    ),
]


@pytest.mark.parametrize(("name", "config", "layers", "count"), HUGE, ids=[c[0] for c in HUGE])
def test_a_layer_count_an_int32_holds_is_answered(
    name, config, layers, count, tmp_path, invoke_main
):
    """In-process and timing-free: 2**31 - 1 layers one at a time would take hours and
    gigabytes; the answer here proves it was not built so."""
    path = write_config(tmp_path / "model", config)
    result = init_from(invoke_main, path, tmp_path, "out/a.yaml")
    assert result.code == 0, result.stderr
    text = (tmp_path / "out" / "a.yaml").read_text(encoding="utf-8")
    total = config.get("text_config", config)["num_hidden_layers"]
    assert f"MoE layers {layers} of {total} (from config.json)" in text, text
    assert f"# This spec: layers {layers} ({count} of {total} decoder layers)." in text, text


# ---- per-layer work past its bound, and other refusals of the config --------------------------

REFUSED = [
    (
        "per_layer_config and a short per-layer list over a huge layer count",
        {**HUNYUAN, "num_hidden_layers": INT32_MAX, "moe_topk": [4, 4, 2]}
        | {"per_layer_config": {"0000": {"num_experts_per_tok": 1}}},
        ("config.json: moe_topk: a per-layer list of 3, no value for layer 3",),
    ),
    (
        "a per-layer list over a huge layer count",
        {**HUNYUAN, "num_hidden_layers": INT32_MAX, "moe_topk": [2] * (MAX_LAYERS + 1)},
        ("config.json: moe_topk: read one decoder layer at a time", f"at most {MAX_LAYERS}"),
    ),
    (
        "per_layer_config past the bound",
        {**MIXTRAL, "num_hidden_layers": INT32_MAX}
        | {"per_layer_config": {str(i): {} for i in range(MAX_LAYERS + 1)}},
        ("config.json: per_layer_config: read one decoder layer at a time",),
    ),
    (
        "moe_layer_freq list past the bound",
        {"model_type": "dots3_note_text", **DEEPSEEK, "num_hidden_layers": MAX_LAYERS + 1}
        | {"moe_layer_freq": [1] * (MAX_LAYERS + 1), "shared_experts_intermediate_size": 16},
        ("config.json: moe_layer_freq: read one decoder layer at a time",),
    ),
    (
        "a 5000-digit integer",
        '{"model_type": "mixtral", "hidden_size": ' + "7" * 5000 + "}",
        ("config.json: hidden_size: an integer of 5000 digits",),
    ),
    (
        "a 5000-digit integer in a list",
        '{"model_type": "mixtral", "moe_topk": [1, -' + "7" * 5000 + "]}",
        ("config.json: moe_topk[1]: an integer of 5000 digits",),
    ),
    (
        "a duplicate key",
        '{"model_type": "mixtral", "num_local_experts": 8, "num_local_experts": 4}',
        ("config.json: num_local_experts: given 2 times in one object",),
    ),
    (
        "a duplicate key nested",
        '{"model_type": "gemma4", "text_config": {"top_k_experts": 8, "top_k_experts": 2}}',
        ("config.json: text_config.top_k_experts: given 2 times in one object",),
    ),
    (
        "more kinds than specs moegen writes",
        {**MIXTRAL, "num_hidden_layers": 100}
        | {"router_aux_loss_coef": [i / 1000 for i in range(100)]},
        (f"differ in more than {MAX_KINDS} ways", f"layer {MAX_KINDS} starts kind"),
    ),
    (
        "a list where a name is",
        {"model_type": "deepseek_v2", **DEEPSEEK, "topk_method": [["greedy"]] * 5},
        ("config.json: topk_method: ['greedy'] is not mapped",),
    ),
    (
        "an index that is a digit to str.isdigit",
        {**STEP3P7, "moe_layers_enum": "1,\u00b2"},
        ("config.json: moe_layers_enum: must list layer indices",),
    ),
    (
        "a megabyte value in the message",
        {**MIXTRAL, "num_local_experts": "8" * 10**6},
        ("config.json: num_local_experts: must be an integer", "..."),
    ),
]


@pytest.mark.parametrize(("name", "config", "message"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_hostile_config_is_refused_naming_file_and_key(
    name, config, message, tmp_path, invoke_main
):
    path = write_config(tmp_path / "model", config)
    before = tree(tmp_path)
    result = init_from(invoke_main, path, tmp_path, "out/a.yaml")
    assert result.code == 2, result.stderr
    for part in message:
        assert part in result.stderr, result.stderr
    assert "set_int_max_str_digits" not in result.stderr
    assert len(result.stderr) < 1000, "a message quotes a value, not all of it"
    assert "nothing written" in result.stderr and tree(tmp_path) == before


MAPPED = [
    (
        "per_layer_config keys that are no index",
        {**MIXTRAL, "per_layer_config": {"\u00b2": {}, "9" * 5000: {}, "007": {"x": 1}}},
        ["a.yaml"],
    ),
    (
        "a kind without the shared expert the first has",
        {"model_type": "glm4_moe", **DEEPSEEK, "first_k_dense_replace": 0}
        | {"n_shared_experts": [1, 1, 0, 0, 0]},
        ["a_shared0.yaml", "a_shared16.yaml"],
    ),
]


@pytest.mark.parametrize(("name", "config", "specs"), MAPPED, ids=[c[0] for c in MAPPED])
def test_odd_but_mappable_configs_are_mapped(name, config, specs, tmp_path, invoke_main):
    path = write_config(tmp_path / "model", config)
    result = init_from(invoke_main, path, tmp_path, "out/a.yaml")
    assert result.code == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("*.yaml")) == specs


# ---- a drafted spec that fails validation: not written, and where its value came from ---------

UNWRITTEN = [
    (
        "mesh axis 0",
        MIXTRAL,
        ("--mesh", "data=0"),
        r"out/a\.yaml \(not written\):\d+:\d+: mesh\.axes\.data: must be > 0.* \(from --mesh data=0\)$",
    ),
    (
        "top-k over the experts",
        {**MIXTRAL, "num_experts_per_tok": 9},
        (),
        r"out/a\.yaml \(not written\):\d+:\d+: router\.top_k: .*9 \(from \S*config\.json: "
        r"num_experts_per_tok\)$",
    ),
    (
        "a module name that is no identifier",
        MIXTRAL,
        ("--batch", "8"),
        r"out/a-b\.yaml \(not written\):1:1: file name 'a-b' must be a Python identifier",
    ),
]


@pytest.mark.parametrize(
    ("name", "config", "args", "pattern"), UNWRITTEN, ids=[c[0] for c in UNWRITTEN]
)
def test_diagnostics_of_a_spec_not_written_say_so_and_where_from(
    name, config, args, pattern, tmp_path, invoke_main
):
    path = write_config(tmp_path / "model", config)
    target = "out/a-b.yaml" if "identifier" in name else "out/a.yaml"
    result = init_from(invoke_main, path, tmp_path, target, *args)
    assert result.code == 3, result.output
    assert re.search(pattern, result.output, re.MULTILINE), result.output
    assert not (tmp_path / "out").exists()


MESH = [
    ("data=2,data=2", "'data=2': the axis 'data' is given twice"),
    ("data=2,expert=2,data=4", "'data=4': the axis 'data' is given twice"),
    ("data=\u00b2", "write NAME=SIZE pairs"),
]


@pytest.mark.parametrize(("mesh", "message"), MESH, ids=[m for m, _ in MESH])
def test_a_mesh_option_that_cannot_be_a_mesh(mesh, message, tmp_path, invoke_main):
    path = write_config(tmp_path / "model", MIXTRAL)
    result = init_from(invoke_main, path, tmp_path, "out/a.yaml", "--mesh", mesh)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


# ---- a target path that is there and is not a file -------------------------------------------


def _fifo(path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    os.mkfifo(path)


def _socket(path: Path) -> None:
    if not hasattr(socket, "AF_UNIX") or len(str(path)) > 100:
        pytest.skip("no short Unix socket path here")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


THERE = [
    ("fifo", _fifo, "x.yaml exists (a FIFO, a named pipe)"),
    ("socket", _socket, "x.yaml exists (a socket)"),
    (
        "dangling symlink",
        lambda p: p.symlink_to("nowhere"),
        "a dangling symbolic link to 'nowhere'",
    ),
    (
        "symlink loop",
        lambda p: p.symlink_to(p.name),
        "a symbolic link to 'x.yaml' that cannot be followed",
    ),
    (
        "symlink to a file",
        lambda p: (p.parent / "real").write_text("") or p.symlink_to("real"),
        "a symbolic link to 'real', a file",
    ),
]


@pytest.mark.parametrize(("kind", "make", "message"), THERE, ids=[t[0] for t in THERE])
def test_init_says_what_is_in_the_way(kind, make, message, tmp_path, invoke_main):
    make(tmp_path / "x.yaml")
    before = tree(tmp_path)
    result = invoke_main("init", "x.yaml", cwd=tmp_path)
    assert_no_traceback(result.output)
    assert result.code == 2 and message in result.stderr, result.stderr
    assert "not replacing it" in result.stderr and "nothing written" in result.stderr
    assert tree(tmp_path) == before


# ---- the grouping is the one layer-at-a-time mapping, and LayerSet's text ---------------------

EQUIVALENT = [
    *[(c.name, c.config) for c in LAYER_LISTS],
    (
        "per-layer list and per_layer_config",
        {**HUNYUAN, "num_hidden_layers": 9, "moe_topk": [8, 8, 4, 4, 8, 4, 8, 8, 4]}
        | {"per_layer_config": {"3": {"moe_topk": 8}, "07": {"num_experts": 8}, "x": {}}},
    ),
    (
        "per_layer_config past the lists",
        {**HUNYUAN, "num_hidden_layers": 40, "moe_topk": [2, 4]}
        | {"per_layer_config": {str(i): {"moe_topk": 2} for i in range(2, 40, 5)}},
    ),
]


@pytest.mark.parametrize(("name", "config"), EQUIVALENT, ids=[e[0] for e in EQUIVALENT])
def test_kinds_are_those_of_mapping_each_layer(name, config, tmp_path):
    """What moegen.hf.layer_kinds finds by groups is what running the rules on every MoE
    layer finds: the same kinds, layers, choices and comments (those of each kind's first)."""
    path = write_config(tmp_path / "model", config)
    try:
        model = model_of(path)
    except Exception as err:  # then layer by layer refuses it the same
        naive: Any = _layer_by_layer(path)
        assert isinstance(naive, type(err)) and str(naive) == str(err)
        return
    want = _layer_by_layer(path)
    assert [(k.choices, list(k.layers)) for k in model.kinds] == want


def _layer_by_layer(path: Path) -> Any:
    """[(choices, layers)] of each kind, the rules run on each MoE layer in turn (as moegen
    did before it grouped them), or the refusal."""
    try:
        model_type, family, view = _family(path, read_json(path))
        layers = layers_of(family, view).moe
        choose = choices_of(family)
        kinds: dict[str, tuple[Any, list[int]]] = {}
        for layer in layers:
            choices = choose(ConfigView(view.file, view.data, view.prefix), layer)
            key = json.dumps([(c.field, c.value) for c in choices], sort_keys=True)
            kinds.setdefault(key, (choices, []))[1].append(layer)
    except Exception as err:  # the refusal, to compare
        return err
    return list(kinds.values())


@pytest.mark.parametrize(
    ("layers", "text"),
    [
        (LayerSet.of([0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8"),
        (LayerSet.span(range(1, 48, 2)), ", ".join(str(i) for i in range(1, 48, 2))),
        (LayerSet.span(range(1, INT32_MAX, 2)).without([3]), "1, 5, 7, ..., 2147483645"),
        (LayerSet.joined([LayerSet.of([4]), LayerSet.span(range(0, 4))]), "0-4"),
    ],
)
def test_layer_sets_read_as_before_and_stay_short(layers, text):
    assert describe(layers) == text
    if len(layers) < 1000:
        assert list(layers) == sorted(set(layers)) and len(list(layers)) == len(layers)
