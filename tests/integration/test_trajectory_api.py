"""The semantics a trainer relies on: the trajectory API answers as docs/agents.md says
(total reward, correctness of the final answer, tool calls, a chat transcript, tool
results), judge turns are not trainable turns, the report tells "finished" from
"correct", groups of one get verl's advantage on request, and a scripted model can vary
its answers across the samples of a group so the arithmetic example shows real
advantages."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
import pytest

from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    Event,
    LLMCalled,
    OutputParsed,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    ToolUse,
    Usage,
)
from kernelflow.host.settings import Settings
from kernelflow.llm.scripted import ScriptError, load_script, sample_index
from kernelflow.projections.flow_grpo import (
    GrpoOptions,
    GrpoSample,
    RewardFacts,
    RewardTable,
    SampleBuilder,
    Singleton,
)
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.trajectory import StepType, Trajectory, build_trajectory
from kernelflow.prompt_datasets import load_dataset
from kernelflow.rollout import Rollout, RolloutConfig
from tests.conftest import EXAMPLES, as_user, creds, run_cli

ARITHMETIC = EXAMPLES / "datasets" / "arithmetic.jsonl"


def prompt_task(
    tid: str,
    answer: str,
    *,
    native: bool = False,
    judge: bool = False,
    group: str = "g",
    reward: float | None = None,
) -> list[Event]:
    """A rollout's history: the solver calls the calculator (as text, or natively), then
    answers; rewards recorded after the finish (the judge's after its own call)."""
    events: list[Event] = []

    def add(e: Event) -> None:
        events.append(msgspec.structs.replace(e, seq=len(events) + 1, at=100.0 + len(events)))

    rewards = ["judge@1", "exact_match@1"] if judge else ["exact_match@1", "numeric_match@1"]
    add(
        TaskSubmitted(
            task_id=tid, task_name="mul", task_source="", workflow_name="rollout_react",
            workflow_yaml="x: 1", backend="triton", group_id=group,
            prompt="What is 6 times 7?", reference_answer="42", rewards=rewards,
        )
    )  # fmt: skip
    did = f"{tid}:2"
    add(AgentDispatched(task_id=tid, agent="solver", step=1, dispatch_id=did))
    system = ChatMessage(role="system", content="Solve it.")
    user = ChatMessage(role="user", content="What is 6 times 7?")
    call = ToolUse(id="call_1", name="calculator", args={"expression": "6 * 7"})
    first = "Thought: compute.\nAction: calculator(expression='6 * 7')"
    add(
        LLMCalled(
            task_id=tid, agent="solver", dispatch_id=did, provider="scripted", model="m",
            messages=[system, user], response_text="" if native else first,
            usage=Usage(input_tokens=8, output_tokens=6), tool_calls=[call] if native else [],
        )
    )  # fmt: skip
    add(
        ToolCalled(
            task_id=tid, agent="solver", dispatch_id=did, tool="calculator", ok=True, output="42",
            call_id="call_1" if native else f"{did}#0", args={"expression": "6 * 7"},
        )
    )  # fmt: skip
    seen = (
        ChatMessage(role="tool", content="42", tool_call_id="call_1")
        if native
        else (ChatMessage(role="user", content="Observation (calculator): 42"))
    )
    add(
        LLMCalled(
            task_id=tid, agent="solver", dispatch_id=did, provider="scripted", model="m",
            messages=[system, user, ChatMessage(role="assistant", content=first), seen],
            response_text=f"Thought: done.\nFinal Answer: {answer}",
            usage=Usage(input_tokens=20, output_tokens=5),
        )
    )  # fmt: skip
    add(OutputParsed(task_id=tid, agent="solver", dispatch_id=did, fields={"answer": answer}))
    add(TaskFinished(task_id=tid, status="success", reason="finished", final_answer=answer))
    value = reward if reward is not None else float(answer == "42")
    if judge:
        add(
            LLMCalled(
                task_id=tid, agent="judge", dispatch_id=f"{tid}:{len(events)}", provider="scripted",
                model="m", messages=[user], response_text='{"true_false": true}',
            )
        )  # fmt: skip
    for name in ("judge", "exact_match") if judge else ("exact_match", "numeric_match"):
        add(RewardAssigned(task_id=tid, reward_fn=name, version=1, value=value))
    return events


def test_the_trajectory_api_answers_as_the_seed_says() -> None:
    right = build_trajectory("r", prompt_task("r", "42"))
    wrong = build_trajectory("w", prompt_task("w", "41"))
    # get_total_reward is the trajectory's reward; the final answer is correct by it.
    assert right.final_reward == 1.0 and right.get_total_reward() == 1.0
    assert wrong.final_reward == 0.0 and wrong.get_total_reward() == 0.0
    assert right.steps[-1].step_type == StepType.FINAL_ANSWER
    assert right.steps[-1].is_correct is True and right.steps[-1].reward_score == 1.0
    assert wrong.steps[-1].is_correct is False  # status success, wrong answer
    assert wrong.metadata["status"] == "success"
    # Tool calls are the tools' only, and a result is what the tool returned.
    (call,) = right.get_tool_calls()
    assert (call.tool_name, call.tool_args) == ("calculator", {"expression": "6 * 7"})
    (result,) = [s for s in right.steps if s.step_type == StepType.ACTION_RESULT]
    assert result.tool_result == "42" and result.metadata["ok"] is True
    # A usable chat transcript: no routing text, each Action once, turns alternate.
    messages = right.get_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == right.steps[1].metadata["messages"][0]["content"]
    assert messages[3]["content"] == "Observation (calculator): 42"
    assert sum(m["content"].count("Action:") for m in messages) == 1
    assert messages[-1]["content"].endswith("Final Answer: 42")
    assert Trajectory.from_dict(json.loads(json.dumps(right.to_dict()))) == right


def test_native_tool_calls_make_tool_messages() -> None:
    t = build_trajectory("n", prompt_task("n", "42", native=True))
    messages = t.get_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    (call,) = messages[2]["tool_calls"]
    assert call["id"] == "call_1" and call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "6 * 7"}
    assert messages[3] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}


def test_a_kernel_is_correct_when_its_last_check_passed_then_by_its_reward() -> None:
    def kernel(tid: str, verdict: str, rewarded: bool) -> list[Event]:
        submitted = TaskSubmitted(
            task_id=tid, task_name="relu", task_source="class Model: ...", workflow_name="default",
            workflow_yaml="x: 1", backend="triton", group_id="k",
        )  # fmt: skip
        status = "success" if verdict == "pass" else "failed"
        events: list[Event] = [
            submitted,
            TaskFinished(task_id=tid, status=status, reason="r", verdict=verdict, final_code="c"),  # type: ignore[arg-type]
        ]
        if rewarded:
            value = float(verdict == "pass")
            events.append(RewardAssigned(task_id=tid, reward_fn="binary", version=1, value=value))
        return events

    assert build_trajectory("a", kernel("a", "pass", False)).steps[-1].is_correct is True
    assert build_trajectory("b", kernel("b", "mismatch", False)).steps[-1].is_correct is False
    scored = build_trajectory("c", kernel("c", "pass", True))
    assert scored.steps[-1].reward_score == 1.0 and scored.get_total_reward() == 1.0
    by_hand = Trajectory(request_id="x")
    assert by_hand.get_total_reward() == 0.0
    by_hand.final_reward = 0.5  # no step scored: the total is the final reward
    assert by_hand.get_total_reward() == 0.5


def fold_samples(
    events: list[Event], options: GrpoOptions
) -> tuple[RewardTable, list[GrpoSample], SampleBuilder]:
    metrics, facts = MetricsProjection(), RewardFacts()
    for pos, e in enumerate(events, 1):
        metrics.apply(pos, e)
        facts.apply(pos, e)
    table = RewardTable.from_tasks(metrics.tasks.values(), options, len(events), facts.tasks)
    samples: list[GrpoSample] = []
    builder = SampleBuilder(table, samples.append)
    for pos, e in enumerate(events, 1):
        builder.apply(pos, e)
    builder.finish()
    return table, samples, builder


def test_judge_turns_are_not_turns() -> None:
    events = [*prompt_task("a", "42", judge=True), *prompt_task("b", "41", judge=True, reward=0.0)]
    table, samples, _ = fold_samples(events, GrpoOptions(normalize="turn"))
    assert {r.turns for r in table.rollouts.values()} == {2}  # the solver's two, no judge
    assert len(samples) == 4
    # Over turns: values 1, 1, 0, 0 (no judge turn): mean 0.5, std sqrt(1/3).
    group = table.groups["g"]
    assert (group.values, group.mean) == (4, 0.5)
    # The task's own reward is the judge's, as recorded.
    assert {r.reward_fn for r in table.rollouts.values()} == {"judge@1"}


def test_a_group_of_one_gets_verls_advantage_on_request() -> None:
    events = prompt_task("solo", "42", group="alone")
    cases: list[tuple[Singleton, bool, list[float]]] = [
        ("keep", True, [0.0, 0.0]),  # the default: no signal in a group of one
        ("raw", True, [1.0 / (1.0 + 1e-6)] * 2),  # verl: mean 0, std 1
        ("raw", False, [1.0, 1.0]),
        ("drop", True, []),
    ]
    for singleton, scale_std, expected in cases:
        options = GrpoOptions(singleton=singleton, scale_std=scale_std)
        table, samples, builder = fold_samples(events, options)
        assert table.groups["alone"].verdict == "singleton"
        assert [s.advantage for s in samples] == pytest.approx(expected)
        assert builder.drops.singleton_group == (2 if singleton == "drop" else 0)


def test_scripted_choices_follow_the_sample_index(tmp_path: Path) -> None:
    assert [sample_index(t) for t in ("ro-ab12-3-0", "ro-ab12-3-1", "relu-2")] == [0, 1, 2]
    assert sample_index("no-number-x") == sample_index("no-number-x")
    script = load_script(EXAMPLES / "scripted" / "arithmetic_react.yaml")
    first = script["solver"][0]
    assert "calculator" in first.for_task("ro-x-0-0").text
    assert "Final Answer: 41" in first.for_task("ro-x-0-1").text
    assert first.for_task("ro-x-0-2") == first.for_task("ro-x-0-0")
    bad = tmp_path / "bad.yaml"
    for doc, problem in (
        ({"solver": [{"choices": []}]}, "non-empty list"),
        ({"solver": [{"choices": ["a"], "text": "b"}]}, "alone in its entry"),
        ({"solver": [{"choices": [{"choices": ["a"]}]}]}, "choices of its own"),
    ):
        bad.write_text(json.dumps(doc))
        with pytest.raises(ScriptError, match=problem):
            load_script(bad)


def test_the_arithmetic_example_shows_advantages_and_the_report_tells_finished_from_correct(
    private_nats: str, tmp_path: Path
) -> None:
    settings = Settings()  # a rollout's: it hosts a daemon
    settings.nats_url, settings.data_dir = private_nats, tmp_path
    settings.nats_creds = creds(private_nats, "daemon")
    config = RolloutConfig(
        agent_type="react",
        tools=("calculator",),
        llm="scripted:examples/scripted/arithmetic_react.yaml",
        max_concurrency=4,
    )
    trajectories = Rollout(config, settings).run(load_dataset(ARITHMETIC), n=4)
    assert {t.metadata["status"] for t in trajectories} == {"success"}
    for t in trajectories:
        used_tool = sample_index(t.request_id) % 2 == 0
        assert [c.tool_name for c in t.get_tool_calls()] == (["calculator"] if used_tool else [])
        assert t.get_total_reward() == t.final_reward
        assert t.steps[-1].is_correct is (t.final_reward == 1.0)
    rewards = [t.final_reward for t in trajectories]
    assert rewards == [1.0, 0.0, 1.0, 0.0] * 3 + [0.0] * 4  # 42 is right for 3 of 4 prompts

    out = tmp_path / "grpo.parquet"
    exported = run_cli("export", "grpo", "--out", str(out), *as_user("reader", private_nats))
    assert exported.returncode == 0, exported.stderr
    rows = pq.read_table(out).to_pylist()
    assert {r["reward_fn"] for r in rows} == {"exact_match@1"}  # recorded, by default
    by_group: dict[str, set[float]] = {}
    for r in rows:
        by_group.setdefault(r["task_name"], set()).add(round(r["advantage"], 3))
    assert by_group == {
        "mul": {0.866, -0.866},
        "add": {0.866, -0.866},
        "sqrt": {0.866, -0.866},
        "pow": {0.0},
    }

    report = run_cli("report", *as_user("reader", private_nats))
    assert report.returncode == 0, report.stderr
    lines = {line.split()[0]: line.split() for line in report.stdout.splitlines() if line.strip()}
    assert lines["all"][1:5] == ["16", "16", "100.0%", "37.5%"]  # finished, correct (6/16)
    as_json = run_cli("report", "--json", *as_user("reader", private_nats))
    overall = json.loads(as_json.stdout)["overall"]
    assert overall["finished_rate"] == 1.0 and overall["correct_rate"] == 0.375
