"""`moegen init --from-hf`: the specs of a transformers model's MoE layers from its config.json.

For every family of tests/support/families.py, its config class built at the oracle's tiny sizes and
saved by transformers itself must map to a spec that validates and routes as the oracle's
spec for that family (tests/support/oracle/families.py), which test_transformers_oracle holds against
transformers' own block; a few are rendered and compared with the block here too. A family
the mapper does not know fails its case, naming it. Layer lists of mixed dense/MoE models,
refusals and hostile config.json files (nothing written) are checked from hand-written JSON.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import REPO_ROOT, assert_no_traceback
from families import EMBED, FAMILIES, ORACLE_FFN, ModelFamily
from init_hf_cases import HOSTILE, LAYER_LISTS, REFUSALS
from init_hf_configs import DEEPSEEK
from oracle.moegen_side import provide_cpu_devices

from moegen.diagnostics import SpecError
from moegen.hf import REFUSED as REFUSED_TYPES
from moegen.load import load_spec_bytes
from moegen.spec import Router, Spec
from moegen.validate import validate

NOT_ROUTING = {"load_balance_loss", "load_balance_form"}  # the oracle's specs have no loss
provide_cpu_devices(2)  # the written specs' default mesh, data 2, before JAX starts


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def oracle_imports() -> None:
    if os.environ.get("MOEGEN_REQUIRE_ORACLE"):
        import transformers  # noqa: F401  (CI: a missing oracle is a failure, not a skip)
    else:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")


def saved_config(entry: ModelFamily, folder: Path) -> Path:
    """The family's config at the oracle's sizes, written by transformers' save_pretrained."""
    oracle_imports()
    module = importlib.import_module(
        f"transformers.models.{entry.folder}.configuration_{entry.folder}"
    )
    config = getattr(module, entry.config)(
        **entry.oracle.config_kwargs(entry.keys, EMBED, ORACLE_FFN)
    )
    config.save_pretrained(folder)
    return folder


def loaded(path: Path) -> Spec:
    """The written spec as moegen reads it (a refusal fails with its diagnostics)."""
    try:
        return validate(load_spec_bytes(path.read_bytes(), str(path), path.stem)).spec
    except SpecError as err:
        found = "\n".join(d.text() for d in err.diagnostics)
        raise AssertionError(f"{path} is refused:\n{found}\n{path.read_text()}") from None


def oracle_spec(name: str) -> Spec:
    from oracle.families import BY_NAME
    from spec_builder import spec_yaml, validated

    choices = BY_NAME[name].spec | {"batch": 8, "seq_len": 128, "axes": {"data": 2}}
    choices |= {"hardware": "cpu", "params_dtype": "float32", "compute_dtype": "float32"}
    result = validated(spec_yaml(choices), "oracle.yaml", "oracle")
    assert not isinstance(result, SpecError), result
    return result.spec


def init_from(invoke_main, config: Path, cwd: Path, *args: str):
    result = invoke_main("init", "--from-hf", config, *args, cwd=cwd)
    assert_no_traceback(result.output)
    return result


@pytest.mark.parametrize("entry", FAMILIES, ids=[e.name for e in FAMILIES])
def test_every_family_maps_to_the_oracles_routing(entry, tmp_path, invoke_main):
    config = saved_config(entry, tmp_path / "model")
    result = init_from(invoke_main, config, tmp_path, "specs/layer.yaml")
    model_type = json.loads((config / "config.json").read_text())["model_type"]
    if model_type in REFUSED_TYPES:  # the oracle checks its layer; the mapper says how to write it
        assert result.code != 0 and REFUSED_TYPES[model_type] in result.stderr, result.stderr
        assert not (tmp_path / "specs").exists()
        return
    assert result.code == 0, f"{entry.name}: moegen init --from-hf refused it:\n{result.stderr}"
    spec = loaded(tmp_path / "specs" / "layer.yaml")
    want = oracle_spec(entry.config_of or entry.name)
    assert spec.layer == want.layer
    routing = [name for name in Router.model_fields if name not in NOT_ROUTING]
    assert {n: getattr(spec.router, n) for n in routing} == {
        n: getattr(want.router, n) for n in routing
    }
    coefficient = _balance_coefficient(json.loads((config / "config.json").read_text()))
    assert spec.router.load_balance_loss == (coefficient or 0.0)


def _balance_coefficient(data: dict) -> float | None:
    """What the config trains the router with where its causal LM adds an aux loss."""
    if data["model_type"] == "dbrx":
        return data["ffn_config"]["moe_loss_weight"]
    if data["model_type"] == "jetmoe":  # JetMoeForCausalLM's key for it
        return data["aux_loss_coef"]
    loss_free = {"deepseek_v3", "glm4_moe", "dots1", "deepseek_v2", "hunyuan_v1_moe"}
    # a token classifier whose config keeps the key but adds no router loss
    loss_free |= {"llama4_text", "openai_privacy_filter"}
    return None if data["model_type"] in loss_free else data.get("router_aux_loss_coef")


def test_the_balance_loss_is_transformers_form_with_its_key_named(tmp_path, invoke_main):
    config = saved_config(next(e for e in FAMILIES if e.name == "mixtral"), tmp_path / "m")
    assert init_from(invoke_main, config, tmp_path, "specs/mixtral.yaml").code == 0
    text = (tmp_path / "specs" / "mixtral.yaml").read_text()
    assert "top_k: 2                    # num_experts_per_tok" in text
    assert "load_balance_loss: 0.001    # router_aux_loss_coef" in text
    if "load_balance_form" in Router.model_fields:
        assert (
            loaded(tmp_path / "specs" / "mixtral.yaml").router.load_balance_form == "transformers"
        )


def test_the_installed_command_writes_a_valid_spec(tmp_path):
    config = saved_config(next(e for e in FAMILIES if e.name == "qwen2_moe"), tmp_path / "q")
    moegen = REPO_ROOT / ".venv" / "bin" / "moegen"
    env = {k: v for k, v in os.environ.items() if k != "MOEGEN_DEBUG"} | {
        "PYTHONPATH": str(REPO_ROOT)
    }
    run = subprocess.run(
        [moegen, "init", "--from-hf", config / "config.json", "--mesh", "data=2,expert=2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "wrote specs/qwen2_moe.yaml" in run.stderr
    spec = loaded(tmp_path / "specs" / "qwen2_moe.yaml")
    assert dict(spec.mesh.axes) == {"data": 2, "expert": 2}
    assert spec.parallelism.experts == "ragged_all_to_all"
    assert spec.layer.shared_expert_gate and spec.layer.shared_ffn_dim == 4 * ORACLE_FFN


# ---- the written spec, rendered, against transformers' block --------------------------------


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3", "gpt_oss", "ernie4_5_moe", "axk1"])
def test_the_written_spec_runs_as_the_transformers_block(name, tmp_path, invoke_main):
    import jax
    from oracle import moegen_side
    from oracle.families import BATCH, BY_NAME, SEQ_LEN
    from oracle.hf_blocks import as_numpy, build_block, run_block

    from moegen.plan import make_plan
    from moegen.render import render

    entry = next(e for e in FAMILIES if e.name == name)
    config = saved_config(entry, tmp_path / "model")
    sizes = ("--batch", str(BATCH), "--seq-len", str(SEQ_LEN))
    assert init_from(invoke_main, config, tmp_path, "specs/layer.yaml", *sizes).code == 0
    path = tmp_path / "specs" / "layer.yaml"
    module_name = f"init_hf_{name}"
    spec = validate(load_spec_bytes(path.read_bytes(), str(path), module_name))
    module = moegen_side.import_source(render(make_plan(spec)), module_name)
    if len(jax.devices()) < module.NUM_DEVICES and not os.environ.get("MOEGEN_REQUIRE_ORACLE"):
        pytest.skip("a JAX computation ran in this process before this module was collected")
    family = BY_NAME[name]
    block = build_block(family.config, family.config_kwargs, family.block, (), family.init, 0)
    run = moegen_side.runner(module, as_numpy(family.weights(block)))
    x = np.random.default_rng(0).standard_normal((BATCH, SEQ_LEN, EMBED)).astype(np.float32)
    want_y, want_grad = run_block(block, x)
    got_y, got_grad = run(x)
    for got, want in ((got_y, want_y), (got_grad, want_grad)):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


# ---- layer lists, refusals, hostile files (hand-written config.json) ------------------------


def write_config(folder: Path, data: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        (folder / "config.json").write_bytes(data)
    else:
        text = data if isinstance(data, str) else json.dumps(data)
        (folder / "config.json").write_text(text, encoding="utf-8")
    return folder / "config.json"


@pytest.mark.parametrize("case", LAYER_LISTS, ids=[c.name for c in LAYER_LISTS])
def test_moe_layers_of_mixed_models(case, tmp_path, invoke_main):
    config = write_config(tmp_path / "model", case.config)
    result = init_from(invoke_main, config, tmp_path, "specs/moe.yaml")
    assert result.code == 0, result.stderr
    written = sorted(p.name for p in (tmp_path / "specs").glob("*.yaml"))
    assert written == sorted(case.specs)
    for name, (layers, top_k) in case.specs.items():
        spec = loaded(tmp_path / "specs" / name)
        assert f"MoE layers {layers} of" in spec.description, spec.description
        assert spec.router.top_k == top_k
        for dotted, want in case.fields.get(name, {}).items():
            if dotted == "description":
                assert want in spec.description, spec.description
                continue
            section, field = dotted.split(".")
            got = getattr(getattr(spec, section), field)
            got = got.model_dump(exclude_defaults=True) if hasattr(got, "model_dump") else got
            assert got == want, (name, dotted, got)


@pytest.mark.parametrize("case", REFUSALS, ids=[c.name for c in REFUSALS])
def test_unsupported_configs_are_refused_with_the_difference(case, tmp_path, invoke_main):
    config = write_config(tmp_path / "model", case.config)
    before = tree(tmp_path)
    result = init_from(invoke_main, config, tmp_path)
    assert result.code == 2
    for part in case.message:
        assert part in result.stderr, result.stderr
    assert "nothing written" in result.stderr and tree(tmp_path) == before


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_config_files_write_nothing(case, tmp_path, invoke_main):
    source = tmp_path / "model"
    if case.config is not None:
        write_config(source, case.config)
    elif case.name == "folder without config.json":
        source.mkdir()
    before = tree(tmp_path)
    result = init_from(invoke_main, source, tmp_path)
    assert result.code == 2, result.output
    for part in case.message:
        assert part in result.stderr, result.stderr
    assert "nothing written" in result.stderr and tree(tmp_path) == before


def test_an_existing_spec_is_not_replaced(tmp_path, invoke_main):
    config = write_config(tmp_path / "model", LAYER_LISTS[0].config)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "moe.yaml").write_text("mine\n")
    before = tree(tmp_path)
    result = init_from(invoke_main, config, tmp_path, "specs/moe.yaml")
    assert result.code == 2 and "specs/moe.yaml exists" in result.stderr
    assert tree(tmp_path) == before and (tmp_path / "specs" / "moe.yaml").read_text() == "mine\n"


def test_placement_flags_and_their_misuse(tmp_path, invoke_main):
    config = write_config(tmp_path / "model", LAYER_LISTS[0].config)
    flags = ("--mesh", "data=2,fsdp=2", "--batch", "16", "--seq-len", "64")
    assert init_from(invoke_main, config, tmp_path, "out/a.yaml", *flags).code == 0
    spec = loaded(tmp_path / "out" / "a.yaml")
    assert dict(spec.mesh.axes) == {"data": 2, "fsdp": 2}
    assert (spec.shapes.batch, spec.shapes.seq_len, spec.target.hardware) == (16, 64, "cpu")
    text = (tmp_path / "out" / "a.yaml").read_text()
    assert "major to minor; --mesh" in text and "# default; --hardware sets it" in text
    misuse = [
        ("init", "--mesh", "data=2"),
        ("init", "--from-hf", config, "--mesh", "data=two"),
        ("init", "--from-hf", config, "--model", "deepseek-v3-v5p"),
    ]
    for args in misuse:
        result = invoke_main(*args, cwd=tmp_path)
        assert result.code == 2 and "Error" in result.stderr, (args, result.stderr)
    assert tree(tmp_path / "out") == ["a.yaml", "moegen.schema.json"]


@pytest.mark.parametrize(
    ("hardware", "topology", "kernel"),
    [("tpu-v5e", "2x2", "pallas"), ("tpu-v6e", "2x2", "pallas"), ("cpu", None, "xla")],
)
def test_a_tpu_spec_gets_the_kernel_measured_fastest(
    hardware, topology, kernel, tmp_path, invoke_main
):
    """On a TPU target init writes kernel pallas, with the measurement as its comment
    (megablox 1.75x ragged_dot's speed on a v5e chip, bench/TPU_CHECK.md); elsewhere the
    schema's default, xla, stands."""
    config = write_config(tmp_path / "model", LAYER_LISTS[0].config)
    flags = ("--mesh", "data=2,fsdp=2", "--hardware", hardware)
    flags += ("--topology", topology) if topology else ()
    assert init_from(invoke_main, config, tmp_path, "out/a.yaml", *flags).code == 0
    spec = loaded(tmp_path / "out" / "a.yaml")
    assert (spec.target.hardware, spec.target.kernel) == (hardware, kernel)
    text = (tmp_path / "out" / "a.yaml").read_text()
    assert ("bench/TPU_CHECK.md" in text) == (kernel == "pallas")


@pytest.mark.parametrize("logits", [False, True, None])
def test_the_balance_loss_says_when_transformers_adds_it(logits, tmp_path, invoke_main):
    """transformers' causal LM adds router_aux_loss_coef x its balance loss only when it
    outputs the router logits. Published configs mostly say false (inference) and training
    turns it on, so the loss is kept; where the config says false its comment says so."""
    config = {
        "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128,
        "num_local_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
        "router_aux_loss_coef": 0.02,
    }  # fmt: skip
    if logits is not None:
        config["output_router_logits"] = logits
    path = write_config(tmp_path / "model", config)
    assert init_from(invoke_main, path, tmp_path, "out/a.yaml").code == 0
    assert loaded(tmp_path / "out" / "a.yaml").router.load_balance_loss == 0.02
    text = (tmp_path / "out" / "a.yaml").read_text()
    said = "transformers adds it only with output_router_logits: true" in text
    assert said == (logits is False)


def test_a_multimodal_config_maps_its_text_model(tmp_path, invoke_main):
    text_config = {**LAYER_LISTS[0].config, "model_type": "llama4_text"}
    data = {"model_type": "llama4", "text_config": text_config, "vision_config": {}}
    config = write_config(tmp_path / "model", data)
    assert init_from(invoke_main, config, tmp_path).code == 0
    spec_text = (tmp_path / "specs" / "llama4.yaml").read_text()
    assert "# text_config.num_local_experts" in spec_text
    spec = yaml.safe_load(spec_text)
    assert spec["router"]["weighting"] == "input" and spec["layer"]["shared_ffn_dim"] == 64


@pytest.mark.parametrize(("eps", "written"), [(0.01, "0.01"), (None, "1.0e-06")])
def test_axk1_normalises_the_output_with_rms_norm_eps(eps, written, tmp_path, invoke_main):
    """A.X-K1's block ends in post_mlp_layernorm, an RMSNorm with rms_norm_eps (without the
    key, AXK1Config's 1e-6): the spec's output norm, its key named."""
    config = {"model_type": "axk1", **DEEPSEEK, "n_group": 4, "topk_group": 2}
    if eps is not None:
        config["rms_norm_eps"] = eps
    path = write_config(tmp_path / "model", config)
    assert init_from(invoke_main, path, tmp_path, "specs/axk1.yaml").code == 0
    text = (tmp_path / "specs" / "axk1.yaml").read_text()
    assert re.search(rf"^  output_norm_eps: {re.escape(written)} +# rms_norm_eps", text, re.M)
    assert loaded(tmp_path / "specs" / "axk1.yaml").layer.output_norm_eps == (eps or 1e-6)
