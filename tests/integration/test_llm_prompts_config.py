"""Prompts (system/user split, overrides, backend guidance), configuration and budgets as
pure functions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernelflow.actors.decide import finish_event
from kernelflow.actors.prompts import agent_messages, conductor_messages
from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    TaskSubmitted,
    Usage,
)
from kernelflow.llm.budget import task_budget_error
from kernelflow.llm.config import Budgets, ProviderSpecError, load_config
from kernelflow.projections.task_state import fold
from kernelflow.projections.verl_format import DATASET_ROW, DatasetRow, encode_dataset_row
from kernelflow.workflows.loader import load_workflow, parse_workflow
from tests.conftest import EXAMPLES, as_user

WORKFLOW, WORKFLOW_YAML = load_workflow("default")


def events(backend: str = "triton", *more: Event) -> list[Event]:
    base: list[Event] = [
        TaskSubmitted(
            task_id="t1",
            seq=1,
            task_name="relu",
            task_source=(EXAMPLES / "tasks" / "relu.py").read_text(),
            workflow_name="default",
            workflow_yaml=WORKFLOW_YAML,
            backend=backend,
            group_id="g",
        ),
        AgentDispatched(task_id="t1", seq=2, agent="designer", step=1, dispatch_id="t1:d1"),
    ]
    return base + list(more)


def test_prompts_split_static_system_part_from_the_task() -> None:
    messages = agent_messages(fold("t1", events()), WORKFLOW, "coder")
    assert [m.role for m in messages] == ["system", "user"]
    system, user = messages[0].content, messages[1].content
    assert "Rules the verifier enforces" in system and "@triton.jit" in system
    assert "def get_inputs" in user and "def get_inputs" not in system
    # The static part is the same for another task: providers can cache it.
    other = agent_messages(fold("t2", [e for e in events()]), WORKFLOW, "designer")
    assert other[0].content != system and "You are the designer" in other[0].content
    cupy = agent_messages(fold("t1", events("cupy")), WORKFLOW, "coder")[0].content
    assert "RawModule" in cupy and "cupy" in cupy and "@triton.jit" not in cupy
    cuda = agent_messages(fold("t1", events("cuda")), WORKFLOW, "coder")[0].content
    assert "cuda_sources" in cuda and "__global__" in cuda and "RawModule" not in cuda
    cpp = agent_messages(fold("t1", events("cpp")), WORKFLOW, "coder")[0].content
    assert "load_inline" in cpp and "#pragma omp parallel for" in cpp and "on the CPU" in cpp
    conductor = conductor_messages(fold("t1", events()), WORKFLOW, ("coder", "finish"), "coder")
    assert '"decision"' in conductor[0].content and "coder, finish" in conductor[1].content


def test_prompts_dir_overrides_a_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "coder.system.txt").write_text("House rules for $backend_name.\n")
    monkeypatch.setenv("KF_PROMPTS_DIR", str(tmp_path))
    messages = agent_messages(fold("t1", events()), WORKFLOW, "coder")
    assert messages[0].content == "House rules for Triton."
    assert "class Model" in messages[1].content  # the user part is still the built-in one


def test_config_file_and_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(
        "provider: anthropic:claude-a\nmax_tokens: 2000\n"
        "agents: {coder: {temperature: 0.7}}\n"
        "limits: {max_concurrency: 3}\nbudgets: {task_tokens: 100}\n"
        "prices: {my-model: {input: 1, output: 2}}\n"
    )
    env = {"KF_LLM_CONFIG": str(path), "KF_LLM_CONCURRENCY": "5", "KF_AGENT_CODER_LLM": "x:y"}
    config = load_config(env)
    assert config.limits.max_concurrency == 5 and config.budgets.task_tokens == 100
    coder = config.for_agent("coder", env)
    assert (coder.provider, coder.temperature, coder.max_tokens) == ("x:y", 0.7, 2000)
    assert config.for_agent("designer", env).provider == "anthropic:claude-a"
    assert config.prices["my-model"].input == 1
    path.write_text("limits: {max_concurency: 3}\n")
    with pytest.raises(ProviderSpecError, match=r"limits.max_concurency: unknown key"):
        load_config(env)
    with pytest.raises(ProviderSpecError, match="KF_BUDGET_TASK_USD"):
        load_config({"KF_BUDGET_TASK_USD": "lots"})


# 0 is usable for most limits (or means none), but not for these: a call that may write no
# token, or gets no time, fails every attempt.
@pytest.mark.parametrize(
    "name, raw, problem",
    [
        ("KF_LLM_TIMEOUT", "0", "must be a finite number, positive"),
        ("KF_LLM_MAX_TOKENS", "0", "must be a finite number, positive"),
        ("KF_AGENT_CODER_MAX_TOKENS", "0", "must be a finite number, positive"),
        ("KF_LLM_RPM", "nan", "must be a finite number, not negative"),
    ],
)
def test_env_settings_that_cannot_work_are_refused(name: str, raw: str, problem: str) -> None:
    env = {name: raw}
    with pytest.raises(ProviderSpecError) as refused:
        load_config(env).for_agent("coder", env)
    assert str(refused.value) == f"{name}={raw!r}: {problem}"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("limits: {timeout_s: 0}", "limits.timeout_s: must be positive"),
        ("agents: {coder: {max_tokens: 0}}", "agents.coder.max_tokens: must be positive"),
        ("limits: {rate_window_s: .inf}", "limits.rate_window_s: inf is not a valid float"),
    ],
)
def test_file_settings_that_cannot_work_are_refused(
    text: str, problem: str, tmp_path: Path
) -> None:
    path = tmp_path / "llm.yaml"
    path.write_text(text)
    with pytest.raises(ProviderSpecError, match=re.escape(problem)):
        load_config({"KF_LLM_CONFIG": str(path)})


def call(tokens: int, cost: float | None, seq: int) -> LLMCalled:
    return LLMCalled(
        task_id="t1",
        seq=seq,
        agent="designer",
        dispatch_id="t1:d1",
        provider="p",
        model="m",
        messages=[],
        response_text="",
        usage=Usage(input_tokens=tokens, cache_read_input_tokens=1),
        cost_usd=cost,
    )


def test_task_budget_is_a_fold_of_the_recorded_calls() -> None:
    state = fold("t1", events("triton", call(50, 0.01, 3), call(49, 0.02, 4)))
    assert task_budget_error(state, Budgets()) is None
    assert task_budget_error(state, Budgets(task_tokens=102)) is None
    assert "101 tokens of its 101" in str(task_budget_error(state, Budgets(task_tokens=101)))
    assert "$0.0300" in str(task_budget_error(state, Budgets(task_cost_usd=0.03)))


def test_budget_failure_finishes_with_its_own_status() -> None:
    error = task_budget_error(
        fold("t1", events("triton", call(500, None, 3))), Budgets(task_tokens=10)
    )
    assert error is not None
    failed = AgentFailed(task_id="t1", seq=4, agent="designer", dispatch_id="t1:d1", error=error)
    decided = ConductorDecided(
        task_id="t1", seq=5, after_agent="designer", options=[], mode="auto", chosen="finish",
        reason="designer could not complete its work",
    )  # fmt: skip
    finished = finish_event(fold("t1", events("triton", failed, decided)), WORKFLOW, decided)
    assert finished.status == "budget_exceeded" and finished.reason == error
    other = AgentFailed(task_id="t1", seq=4, agent="designer", dispatch_id="t1:d1", error="down")
    state = fold("t1", events("triton", other, decided))
    assert finish_event(state, WORKFLOW, decided).status == "failed"


def test_per_agent_flags_and_workflow_prompts_reach_the_recorded_calls(
    nats_url: str, tmp_path: Path
) -> None:
    """`--agent-temperature coder=0.3` changes only the coder's calls; a workflow's inline
    prompt template replaces the built-in one and is recorded with the task."""
    import json

    import yaml

    from tests.conftest import run_cli
    from tests.daemons import task_events

    workflow = yaml.safe_load((EXAMPLES.parent / "workflows" / "default.yaml").read_text())
    workflow["agent_info"]["designer"]["prompt"] = {
        "system": "You sketch kernels for $backend_name.",
        "user": "Sketch a kernel for:\n$task_source\n$output_format",
    }
    path = tmp_path / "custom_prompt.yaml"
    path.write_text(yaml.safe_dump(workflow))
    result = run_cli(
        "run", "examples/tasks/relu.py", "--workflow", str(path),
        "--llm", "scripted:examples/scripted/relu.yaml", "--agent-temperature", "coder=0.3",
        "--agent-max-tokens", "coder=2048", *as_user("daemon", nats_url), "--out", str(tmp_path),
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    task_id = json.loads(result.stdout.strip().splitlines()[-1])["task_id"]
    calls = [e for e in task_events(nats_url, task_id) if isinstance(e, LLMCalled)]
    coder = [c for c in calls if c.agent == "coder"]
    assert coder and all(
        c.params["temperature"] == 0.3 and c.params["max_tokens"] == 2048 for c in coder
    )
    designer = next(c for c in calls if c.agent == "designer")
    assert "temperature" not in designer.params
    assert designer.messages[0].content == "You sketch kernels for Triton."
    assert designer.messages[1].content.startswith('Sketch a kernel for:\n"""Elementwise ReLU')
    bad = run_cli("run", "examples/tasks/relu.py", "--agent-temperature", "coder=hot")
    assert bad.returncode == 2 and "'hot' is not float" in bad.stderr


FREE_TEXT = """
agent_info:
  designer:
    possible_next_agent: [coder]
  coder:
    possible_next_agent: [verifier]
  verifier:
    possible_next_agent: [finish, coder]
start_agent: designer
limitation_info:
  required:
    max_step: 20
"""


def test_free_text_agents_are_asked_for_plain_text_and_their_design_reaches_the_coder() -> None:
    workflow = parse_workflow(FREE_TEXT, "free")
    design = "Use one program per block of 1024 elements.\n```python\nBLOCK = 1024\n```"
    state = fold(
        "t1",
        events(
            "triton",
            OutputParsed(
                task_id="t1", seq=3, agent="designer", dispatch_id="t1:d1",
                fields={"answer": design, "code": "BLOCK = 1024\n"},
            ),
            AgentDispatched(task_id="t1", seq=4, agent="coder", step=2, dispatch_id="t1:d2"),
        ),
    )  # fmt: skip
    user = agent_messages(state, workflow, "coder")[-1].content
    assert "Answer in plain text" in user and "JSON object" not in user
    assert "one program per block of 1024 elements" in user  # the whole design, prose too


def test_a_multi_turn_dataset_prompt_reaches_the_model_as_turns() -> None:
    row = DatasetRow(
        prompt=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 6 times 7?"},
            {"role": "assistant", "content": "41"},
            {"role": "user", "content": "Check again."},
        ],
        data_source="arith",
    )
    submitted = TaskSubmitted(
        task_id="p1", seq=1, task_name="p", task_source="", workflow_name="rollout",
        workflow_yaml=WORKFLOW_YAML, backend="triton", group_id="g",
        prompt="What is 6 times 7?\n\n41\n\nCheck again.",
        metadata={DATASET_ROW: encode_dataset_row(row)},
    )  # fmt: skip
    state = fold("p1", [submitted])
    solver = "agent_info:\n  solver:\n    possible_next_agent: [finish]\nstart_agent: solver\n"
    solver += "limitation_info:\n  required:\n    max_step: 4\n"
    messages = agent_messages(state, parse_workflow(solver, "solver"), "solver")
    assert [m.role for m in messages] == ["system", "user", "assistant", "user"]
    assert [m.content for m in messages[1:3]] == ["What is 6 times 7?", "41"]
    assert "Check again." in messages[3].content and "41" not in messages[3].content
