"""Stage 2, `moegen.validate`: sizes (parameter count, expert limit, int32 indexing, values at the schema's limit)."""

from __future__ import annotations

import re
from pathlib import Path

from validate_cases import (
    KEY,
    REPO_ROOT,
    TWO_V5E_SLICES,
    VALUE,
    Cases,
    case_yaml,
    found,
    loaded_spec,
    located,
    position,
    rule_tests,
)

from moegen.load import LoadedSpec, load_spec_bytes
from moegen.sizes import divisors, listed
from moegen.validate import check_rules
from moegen.validate.bounds import MAX_EXPERTS

# rule name -> [(spec choices over BASE, expected diagnostics: (field, KEY or VALUE, message))].
CASES: Cases = {
    "indices_fit_int32": [
        ({}, []),
        # per device: (2**18 - 1) * 2 rows of width 4096 = 2**31 - 8192 elements: fits
        ({"embed": 4096, "ffn": 1024, "batch": 1, "seq_len": 262143, "axes": {"data": 1}}, []),
        (
            {"embed": 4096, "ffn": 1024, "batch": 1, "seq_len": 262144, "axes": {"data": 1}},
            [
                (
                    "shapes.batch",
                    VALUE,
                    (
                        "each device routes 524288 rows of width 4096: 2147483648 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                )
            ],
        ),
        # the width is the larger of embed_dim and ffn_dim
        (
            {"embed": 1024, "ffn": 4096, "batch": 2, "seq_len": 262144, "axes": {"data": 2}},
            [
                (
                    "shapes.batch",
                    VALUE,
                    (
                        "each device routes 524288 rows of width 4096: 2147483648 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                )
            ],
        ),
        # global token slots: 256 * (2**20 - 1) * 8 < 2**31 fits; 256 * 2**20 * 8 does not
        (
            {
                "embed": 8,
                "ffn": 8,
                "batch": 256,
                "seq_len": 1048575,
                "top_k": 8,
                "axes": {"data": 256},
            },
            [],
        ),
        (
            {
                "embed": 8,
                "ffn": 8,
                "batch": 256,
                "seq_len": 1048576,
                "top_k": 8,
                "axes": {"data": 256},
            },
            [
                (
                    "shapes.seq_len",
                    VALUE,
                    (
                        "batch*seq_len*top_k = 2147483648 token slots overflow int32 (< 2**31); "
                        "reduce shapes.batch, shapes.seq_len or router.top_k"
                    ),
                )
            ],
        ),
        (
            {"embed": 4096, "batch": 256, "seq_len": 1048576, "top_k": 8, "axes": {"data": 2}},
            [
                (
                    "shapes.batch",
                    VALUE,
                    (
                        "each device routes 1073741824 rows of width 4096: 4398046511104 elements "
                        "overflow int32 indexing (< 2**31); shard the batch over more devices, "
                        "or reduce shapes.batch or shapes.seq_len"
                    ),
                ),
                (
                    "shapes.seq_len",
                    VALUE,
                    (
                        "batch*seq_len*top_k = 2147483648 token slots overflow int32 (< 2**31); "
                        "reduce shapes.batch, shapes.seq_len or router.top_k"
                    ),
                ),
            ],
        ),
    ],
    "parameters_reasonably_sized": [
        ({}, []),
        ({"experts": 1023, "embed": 32768, "ffn": 32768}, []),  # just under 2**40 elements
        (
            {"experts": 1024, "embed": 32768, "ffn": 32768},
            [
                (
                    "layer",
                    KEY,
                    (
                        "expert weights of num_experts*embed_dim*ffn_dim = 1099511627776 elements "
                        "(>= 2**40) per projection; check the sizes"
                    ),
                )
            ],
        ),
        # in a latent width the experts' weights are that wide; the projections have their own
        ({"experts": 1024, "embed": 32768, "ffn": 32768, "latent": 1024}, []),
        (
            {"experts": 8, "embed": 2**20, "ffn": 64, "latent": 2**20},
            [
                (
                    "layer",
                    KEY,
                    (
                        "latent projections of embed_dim*latent_dim = 1099511627776 elements "
                        "(>= 2**40) per projection; check the sizes"
                    ),
                )
            ],
        ),
    ],
    "experts_within_limit": [
        ({}, []),
        ({"experts": 4096}, []),  # boundary: MAX_EXPERTS
        (
            {"experts": 4097},
            [
                (
                    "layer.num_experts",
                    VALUE,
                    (
                        "4097 experts; at most 4096: the shrunken twin `moegen build` verifies "
                        "keeps every expert, and its dense reference runs every token through each "
                        "of them on CPU (the largest published MoE layers have 2048, Switch-C)"
                    ),
                )
            ],
        ),
    ],
    "chunks_within_limit": [
        ({}, []),
        ({"ffn": 128, "ffn_chunks": 64}, []),  # boundary: MAX_CHUNKS
        (
            {"ffn": 130, "ffn_chunks": 65},
            [
                (
                    "memory.ffn_chunks",
                    VALUE,
                    (
                        "65 FFN slices; at most 64: each is a step of the generated layer (and of "
                        "the twin `moegen build` verifies), and pieces this narrow cost more in step "
                        "overhead than they save"
                    ),
                )
            ],
        ),
    ],
}


test_rule, test_only_the_rule_under_test_fires_in_check_rules = rule_tests(CASES)


def test_shared_expert_width_counts_for_int32_indexing() -> None:
    # 2**18 tokens a device, top-2: 2**19 routed rows of width 1024 fit (2**29 elements);
    # the shared expert runs once per token, not per routed copy: its 2**18 rows of width 8191
    # fit (2**31 - 2**18 elements), though 2**19 rows of that width would not
    shape = {"embed": 1024, "ffn": 1024, "batch": 2, "seq_len": 2**18, "axes": {"data": 2}}
    assert check_rules(loaded_spec({**shape, "shared_ffn": 8191})) == []
    # 2**18 rows of width 2**13 are 2**31 elements alone: reported at the shared width
    wide = {**shape, "shared_ffn": 8192}
    found = [(d.line, d.column, d.field, d.message) for d in check_rules(loaded_spec(wide))]
    assert found == located(
        wide,
        [
            (
                "layer.shared_ffn_dim",
                VALUE,
                "the shared expert's hidden activations on each device hold 262144 x 8192 = "
                "2147483648 elements, overflowing int32 indexing (< 2**31); shard the batch over "
                "more devices, or reduce shapes.batch or shapes.seq_len",
            )
        ],
    )
    # a narrow shared expert changes nothing
    assert check_rules(loaded_spec({**shape, "shared_ffn": 512})) == []


def test_shared_expert_is_not_counted_per_routed_copy() -> None:
    shape = {"embed": 1024, "ffn": 1024, "batch": 2, "seq_len": 2**18, "axes": {"data": 2}}
    assert check_rules(loaded_spec({**shape, "shared_ffn": 4096})) == []


# ---------------------------------------------------------------------------------------
# Sizes as large as the schema allows (< 2**31): every rule finishes at once (divisors are
# enumerated by pairs up to the square root, never by a scan up to the value) and says what
# is wrong where, listing at most MAX_LISTED valid values.

INT32_MAX = 2**31 - 1
HIGHLY_COMPOSITE = 735134400  # 1344 divisors


def _fired(loaded: LoadedSpec, field: str) -> list[tuple[int, int, str]]:
    return [(d.line, d.column, d.message) for d in check_rules(loaded) if d.field == field]


def _listed_values(message: str, after: str) -> tuple[list[int], int | None]:
    """The values listed after `after`, and how many there are when the list is cut short."""
    match = re.search(
        re.escape(after) + r"(\d+(?:, \d+)*)(?: \(the \d+ nearest \d+ of (\d+)\))?", message
    )
    assert match, message
    total = int(match.group(2)) if match.group(2) else None
    return [int(v) for v in match.group(1).split(", ")], total


def test_prime_expert_count_at_the_schema_limit_splits_into_no_groups() -> None:
    choices = {"experts": INT32_MAX, "group_limit": (2, 1)}
    loaded = loaded_spec(choices)
    assert _fired(loaded, "router.group_limit.groups") == [
        (
            *position(choices, "router.group_limit.groups"),
            "2147483647 experts do not split into 2 equal groups; valid: 2147483647",
        )
    ]
    [(line, column, message)] = _fired(loaded, "layer.num_experts")
    assert (line, column) == position(choices, "layer.num_experts")
    assert message.startswith("2147483647 experts; at most 4096")


def test_group_count_at_the_schema_limit_lists_its_keeps() -> None:
    groups = 2**30  # of one expert each: their score is their one expert's (top_per_group 1)
    limit = {"groups": groups, "keep": groups, "top_per_group": 1}
    choices = {"experts": 2**30, "group_limit": limit}
    assert _fired(loaded_spec(choices), "router.group_limit.keep") == [
        (
            *position(choices, "router.group_limit.keep"),
            f"keeping {groups} of {groups} groups limits nothing; valid keep: 2 to {groups - 1}; "
            "or remove group_limit",
        )
    ]


def test_no_keep_works_lists_the_group_counts_that_do_nearest_the_one_written() -> None:
    top_k = 720720000  # more than the 367567200 experts of each of 2 groups: keep 1 fails
    choices = {"experts": HIGHLY_COMPOSITE, "top_k": top_k, "group_limit": (2, 1)}
    [(line, column, message)] = _fired(loaded_spec(choices), "router.group_limit.keep")
    assert (line, column) == position(choices, "router.group_limit.keep")
    assert "no keep works for top_k = 720720000 with 2 groups of 367567200" in message
    groups, total = _listed_values(message, "groups that work: ")
    assert len(groups) == 8 and total is not None and total > 8, message
    assert groups == sorted(groups) and all(HIGHLY_COMPOSITE % g == 0 for g in groups)
    for count in groups:  # each listed group count has a keep that passes the rule: the fewest
        fewest = -(-top_k // (HIGHLY_COMPOSITE // count))
        assert fewest < count, count
        assert not found(
            "group_limit_can_pick_top_k",
            {"experts": HIGHLY_COMPOSITE, "top_k": top_k, "group_limit": (count, fewest)},
        ), count


def test_axis_at_the_schema_limit_over_slices() -> None:
    choices = {**TWO_V5E_SLICES, "axes": {"data": INT32_MAX}, "dcn_axes": {"data": 2}}
    loaded = loaded_spec(choices)
    assert _fired(loaded, "mesh.dcn_axes.data") == [
        (
            *position(choices, "mesh.dcn_axes.data"),
            "data = 2147483647 does not split into 2 slices; valid: 1, 2147483647",
        )
    ]
    assert _fired(loaded, "mesh.axes")  # and the mesh is far larger than the slices


def test_axis_with_many_divisors_lists_those_nearest_the_slices_written() -> None:
    axes = {"data": HIGHLY_COMPOSITE}
    choices = {**TWO_V5E_SLICES, "axes": axes, "dcn_axes": {"data": 19}}
    [(line, column, message)] = _fired(loaded_spec(choices), "mesh.dcn_axes.data")
    assert (line, column) == position(choices, "mesh.dcn_axes.data")
    values, total = _listed_values(message, "valid: ")
    assert values == [14, 15, 16, 17, 18, 20, 21, 22] and total == 1344, message


def test_every_example_expert_count_is_within_the_limit() -> None:
    for path in sorted((REPO_ROOT / "specs").glob("*.yaml")):
        loaded = load_spec_bytes(path.read_bytes(), path.name, path.stem, path.parent)
        assert loaded.spec.layer.num_experts <= MAX_EXPERTS, path.name


def test_expert_count_past_the_limit_is_exit_3_located(tmp_path: Path, run_moegen) -> None:
    spec = tmp_path / "many.yaml"
    choices = {"experts": INT32_MAX, "group_limit": (2, 1)}
    spec.write_text(case_yaml(choices))
    result = run_moegen("build", "--no-verify", "--out", tmp_path / "out", spec, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    output = result.stdout + result.stderr
    line, column = position(choices, "layer.num_experts")
    assert (
        f"many.yaml:{line}:{column}: layer.num_experts: 2147483647 experts; at most 4096" in output
    )
    line, column = position(choices, "router.group_limit.groups")
    assert f"many.yaml:{line}:{column}: router.group_limit.groups:" in output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_divisors_and_listed() -> None:
    assert divisors(1) == [1] and divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]
    assert divisors(INT32_MAX) == [1, INT32_MAX]
    assert len(divisors(HIGHLY_COMPOSITE)) == 1344
    assert listed([2, 4, 8], 3) == "2, 4, 8"
    assert (
        listed(list(range(1, 101)), 50)
        == "46, 47, 48, 49, 50, 51, 52, 53 (the 8 nearest 50 of 100)"
    )


def test_no_nearest_valid_size_is_past_what_a_spec_may_hold():
    from moegen.sizes import nearest_multiples

    assert nearest_multiples(2**31 - 1, 8) == [2**31 - 8]  # 2**31 would be refused in turn
    assert nearest_multiples(13, 4) == [12, 16]
