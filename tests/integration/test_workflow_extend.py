"""Workflows that extend another (docs/workflows.md, "Extending a workflow"): the merge's
rules hold for all documents; the workflow spec's extension example with ``base:
default`` added validates, is recorded whole, and ``workflow show`` lists its optimizer
and where each value came from; a problem is named in the file that set it; bases chain,
and a cycle is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.workflows.extend import merge, origins_of, whole_values
from kernelflow.workflows.loader import (
    WorkflowError,
    extend,
    find_workflow,
    load_workflow,
    resolve_workflow,
)
from kernelflow.workflows.model import FINISH, VERIFIER
from tests.conftest import EXAMPLES, REPO, run_cli

EXTENDED = EXAMPLES / "workflows" / "default_with_optimizer.yaml"

# Documents shaped like workflows: agents with a few keys, limits, other top-level keys.
_scalars = st.one_of(st.integers(-3, 30), st.sampled_from(["a", "b", "coder", "x y"]))
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))
_agent = st.dictionaries(
    st.sampled_from(["possible_next_agent", "output_format", "agent_kind", "tools"]),
    st.one_of(_values, st.dictionaries(st.sampled_from(["p", "q"]), _scalars, max_size=2)),
    max_size=3,
)
_limits = st.fixed_dictionaries(
    {},
    optional={
        "required": st.fixed_dictionaries({}, optional={"max_step": st.integers(1, 30)}),
        "optional": st.fixed_dictionaries(
            {},
            optional={
                "repeat_limits": st.fixed_dictionaries(
                    {},
                    optional={
                        "single_agent": st.dictionaries(
                            st.sampled_from(["coder", "x"]), st.integers(1, 4), max_size=2
                        ),
                        "sequences": st.dictionaries(
                            st.sampled_from(["s", "t"]), _values, max_size=2
                        ),
                    },
                )
            },
        ),
    },
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "agent_info": st.dictionaries(
            st.sampled_from(["designer", "coder", "verifier", "optimizer"]), _agent, max_size=3
        ),
        "start_agent": _scalars,
        "mandatory_llm_analysis": _values,
        "limitation_info": _limits,
        "trainable_agents": _values,
    },
)


def leaves(doc: Any) -> dict[tuple[str, ...], Any]:
    return dict(whole_values(doc))


@settings(max_examples=300, deadline=None)
@given(documents, documents)
def test_a_layer_wins_where_it_speaks_and_the_base_stays_elsewhere(base: Any, layer: Any) -> None:
    merged, origins = merge(base, layer, origins_of(base, "base"), "layer")
    base_leaves, layer_leaves, merged_leaves = leaves(base), leaves(layer), leaves(merged)
    # Every value the layer gives is in the result as it gave it, and said to come from it.
    for path, value in layer_leaves.items():
        assert merged_leaves[path] == value and origins[path] == "layer"
    # Every value of the base the layer does not replace (itself or a mapping above it
    # that is not merged into) stays, and is said to come from the base.
    for path, value in base_leaves.items():
        if path in layer_leaves:
            continue
        replaced = any(path[: len(p)] == p for p in layer_leaves)
        if not replaced:
            assert merged_leaves[path] == value and origins[path] == "base"
    # Nothing else is in the result, and every value of it has one origin.
    assert set(merged_leaves) <= set(base_leaves) | set(layer_leaves)
    assert set(origins) == set(merged_leaves)
    # The base's agents keep their places; a layer's new agents come after them.
    agents = (
        list(merged.get("agent_info", {})) if isinstance(merged.get("agent_info"), dict) else []
    )
    base_agents = list(base.get("agent_info", {}))
    assert agents[: len(base_agents)] == base_agents or not isinstance(
        layer.get("agent_info"), dict
    )


@settings(max_examples=200, deadline=None)
@given(documents, documents, documents)
def test_layers_merge_the_same_way_however_they_are_grouped(a: Any, b: Any, c: Any) -> None:
    """A file over a file over a base is the same workflow as the two files merged first."""
    ab, ab_origins = merge(a, b, origins_of(a, "a"), "b")
    left, _ = merge(ab, c, ab_origins, "c")
    bc, _ = merge(b, c, origins_of(b, "b"), "c")
    right, _ = merge(a, bc, origins_of(a, "a"), "bc")
    assert left == right
    assert merge(a, {}, origins_of(a, "a"), "none")[0] == a  # an empty layer changes nothing


def test_the_seed_extension_example_over_default_validates_and_is_recorded_whole() -> None:
    workflow, text = load_workflow(str(EXTENDED))
    assert list(workflow.agents) == ["designer", "coder", "verifier", "optimizer"]
    assert workflow.agents[VERIFIER].possible_next == (FINISH, "coder", "optimizer")
    assert workflow.mandatory_llm_analysis == {"optimizer"}  # the file's replaces default's
    assert workflow.max_step == 20  # default's limits, inherited
    # The designer's and coder's output formats are default's: the file gave other keys.
    assert [f.name for f in workflow.agents["coder"].output_fields] == ["code"]
    assert workflow.agents["optimizer"].code_field == "code"  # free text: its fenced block
    recorded = yaml.safe_load(text)
    assert "base" not in recorded and recorded["limitation_info"] == {"required": {"max_step": 20}}


def test_a_problem_is_named_where_its_value_was_set(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "base: default\nagent_info:\n  coder:\n    possible_next_agent: [verifier, tunr]\n"
        "limitation_info:\n  required:\n    max_step: 0\n"
    )
    with pytest.raises(WorkflowError) as err:
        resolve_workflow(str(mine))
    message = str(err.value)
    assert (
        f"{mine}: agent_info.coder.possible_next_agent[1]: unknown agent 'tunr' (line 4)" in message
    )
    assert (
        "limitation_info.required.max_step: must be a positive integer, got an integer 0 (line 7)"
        in message
    )
    # A value the base set is named with the base.
    (tmp_path / "shared.yaml").write_text(
        (EXAMPLES / "workflows" / "custom_optimizer.yaml")
        .read_text()
        .replace("max_step: 12", "max_step: -1")
    )
    (tmp_path / "team.yaml").write_text("base: shared.yaml\nstart_agent: coder\n")
    with pytest.raises(
        WorkflowError,
        match=r"max_step: must be a positive integer, got an integer -1 \(set in shared.yaml\)",
    ):
        resolve_workflow(str(tmp_path / "team.yaml"))


def test_bases_chain_by_name_or_path_and_a_cycle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mid.yaml").write_text("base: default\nmandatory_llm_analysis: []\n")
    (tmp_path / "top.yaml").write_text("base: mid\nlimitation_info:\n  required: {max_step: 7}\n")
    extended = extend(find_workflow("top", [tmp_path]), [tmp_path])
    assert extended.bases == (str(tmp_path / "mid.yaml"), "default")
    workflow, _ = load_workflow("top", [tmp_path])
    assert (workflow.max_step, workflow.mandatory_llm_analysis) == (7, frozenset())
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(WorkflowError, match="a workflow cannot be its own base"):
        resolve_workflow(str(tmp_path / "a.yaml"))
    (tmp_path / "lost.yaml").write_text("base: nowhere\n")
    with pytest.raises(
        WorkflowError, match=r"lost.yaml: base: unknown workflow 'nowhere'; available: agentflow"
    ):
        resolve_workflow(str(tmp_path / "lost.yaml"))


def test_workflow_show_lists_the_optimizer_and_where_each_value_came_from() -> None:
    shown = run_cli("workflow", "show", str(EXTENDED))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "optimizer    → verifier, optimizer [LLM analysis]" in out
    assert f"{EXTENDED} over default, merged:" in out
    assert f"    possible_next_agent: [finish, coder, optimizer]  # {EXTENDED}" in out
    assert "    output_format:  # default" in out  # the coder's, from the base
    assert "    max_step: 20  # default" in out
    checked = run_cli("workflow", "validate", str(EXTENDED))
    assert checked.stdout.strip() == f"{EXTENDED}: ok (4 agents, max_step 20, over default)"


def test_every_workflow_the_page_prints_validates(tmp_path: Path) -> None:
    """docs/workflows.md's YAML blocks that are whole workflows, as printed: the file, the
    verifier's custom workflow, the layer over default."""
    page = (REPO / "docs" / "workflows.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```yaml\n")[1:]]
    workflows = [b for b in blocks if b.startswith(("agent_info:", "base:"))]
    assert len(workflows) == 3
    for n, block in enumerate(workflows):
        path = tmp_path / f"printed_{n}.yaml"
        path.write_text(block)
        workflow, _ = load_workflow(str(path))
        assert workflow.start_agent in workflow.agents
    layer, _ = load_workflow(str(tmp_path / "printed_2.yaml"))
    assert layer.agents[VERIFIER].possible_next == (FINISH, "coder", "optimizer")
    custom, _ = load_workflow(str(tmp_path / "printed_1.yaml"))
    assert custom.agents["custom_optimizer"].code_field == "optimized_code"
