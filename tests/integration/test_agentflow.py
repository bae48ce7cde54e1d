"""AgentFlow's in-the-flow agent on kernelflow (docs/workflows.md, "agentflow"): the
page's commands as printed (the policy server's port aside), ``kernelflow rollout
--workflow agentflow`` over a 4-question dataset, 4 samples each, against an
OpenAI-compatible policy server whose planner, executor, memory verifier, solution
generator and judge answer from what their prompts show (the memory included); then
``export grpo``: one sample per planner turn, each with its rollout's judged reward and the
advantage verl's GRPO gives it over its group."""

from __future__ import annotations

import json
import re
import shlex
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import EXAMPLES, REPO, as_user, keyed_nats, run_cli
from tests.fake_llm_servers import FakeOpenAI

DATASET = EXAMPLES / "datasets" / "arithmetic.jsonl"
# Each question: the calculator's expression, and what each sample of its group does: the
# turns it takes before its verifier says STOP (1 or 2) and whether its final answer is
# right. "6 times 7" mixes both; "19 plus 23" is always right (a group without signal).
QUESTIONS = {
    "6 times 7": ("6 * 7", [(1, True), (2, True), (1, False), (2, False)]),
    "19 plus 23": ("19 + 23", [(1, True)] * 4),
    "square root of 1764": ("sqrt(1764)", [(2, False), (1, True), (1, False), (1, False)]),
    "2 to the power of 10": ("2 ** 10", [(1, True), (2, True), (2, True), (1, False)]),
}
PLAN = re.compile(r"plan (\d+) (right|wrong)")


class Policy:
    """The server's answers, by the role the system prompt gives. The planner picks each
    sample's plan on its first turn and writes it into its context, so the agents after it
    read it back from the memory their prompts show."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        text = "\n".join(m["content"] or "" for m in body["messages"])
        if system.startswith("You judge"):
            reference = re.search(r"## Reference answer\n(.*)\n", text)
            answer = re.search(r"## Answer to judge\n(.*)\n", text)
            same = reference and answer and reference.group(1).strip() == answer.group(1).strip()
            return json.dumps({"analysis": "compared with the reference", "true_false": bool(same)})
        key = next(k for k in QUESTIONS if k in text)
        expression, plans = QUESTIONS[key]
        plan = PLAN.search(text)
        turns = text.count("planner (at")  # the planner's entries in the memory
        if system.startswith("You are the planner"):
            if plan is None:
                with self.lock:
                    n, right = plans[self.asked[key] % len(plans)]
                    self.asked[key] += 1
                plan_text = f"plan {n} {'right' if right else 'wrong'}"
            else:
                plan_text = plan.group(0)
            goal = "compute it" if turns == 0 else "check the result again"
            return json.dumps(
                {
                    "context": plan_text,
                    "sub_goal": f"{goal}: {expression}",
                    "tool_name": "calculator",
                }
            )
        assert plan is not None, "the memory shows no plan"
        if system.startswith("You are the executor"):
            return f"TOOL_CALL: calculator(expression='{expression}')"
        if system.startswith("You are the verifier"):
            stop = turns >= int(plan.group(1))
            return json.dumps(
                {
                    "analysis": "the calculator answered",
                    "conclusion": "STOP" if stop else "CONTINUE",
                }
            )
        assert system.startswith("You write the final answer"), system
        result = re.findall(r"-> ([\d.]+)", text)[-1]
        value = str(int(float(result)))
        return f"Final Answer: {value if plan.group(2) == 'right' else value + '1'}"


def page_commands() -> tuple[list[str], list[str]]:
    """The rollout and export commands of docs/workflows.md's agentflow section, without
    their leading ``kernelflow``."""
    page = (REPO / "docs" / "workflows.md").read_text()
    section = page.split("## `agentflow`", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    rollout, export_grpo = (
        shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()
    )
    assert rollout[:2] == ["kernelflow", "rollout"] and export_grpo[:3] == [
        "kernelflow", "export", "grpo",
    ]  # fmt: skip
    assert f"--dataset {DATASET.relative_to(REPO)} --n 4" in shlex.join(rollout)
    return rollout[1:], export_grpo[1:]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("agentflow")
    out: dict[str, Any] = {}
    with keyed_nats(tmp / "nats") as nats_url, FakeOpenAI(Policy(), model="my-policy") as server:
        rollout, export_grpo = page_commands()
        policy = f"openai:{server.url}/v1#my-policy"  # the page's, on this server's port
        rollout = [policy if a.startswith("openai:") else a for a in rollout]
        run = run_cli(
            *rollout, "--out", str(tmp / "trajectories.jsonl"), "--json",
            *as_user("daemon", nats_url),
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr[-3000:]
        out["summary"] = json.loads(run.stdout)
        out["requests"] = [c["messages"] for c in server.completions]
        for name, args in {"samples": [], "turns": ["--normalize", "turn"]}.items():
            path = tmp / f"{name}.parquet"
            out_at = export_grpo.index("--out") + 1
            command = [*export_grpo[:out_at], str(path), *export_grpo[out_at + 1 :]]
            export = run_cli(*command, *args, *as_user("reader", nats_url))
            assert export.returncode == 0, export.stderr
            out[name] = pq.read_table(path).to_pylist()
            out[f"{name}_meta"] = json.loads(Path(f"{path}.meta.json").read_text())
    out["trajectories"] = [
        json.loads(line) for line in (tmp / "trajectories.jsonl").read_text().splitlines()
    ]
    return out


def test_every_rollout_runs_the_flow_and_is_judged(exported: dict[str, Any]) -> None:
    assert exported["summary"]["statuses"] == {"success": 16}
    assert set(exported["summary"]["mean_reward"]) == {"judge"}  # the workflow's reward
    for t in exported["trajectories"]:
        agents = [  # the agents' own turns (a tool call is an action too)
            s["metadata"]["agent"]
            for s in t["steps"]
            if s["step_type"] == "action" and s["tool_name"] is None
        ]
        turns = agents.count("planner")
        assert agents == ["planner", "executor", "memory_verifier"] * turns + ["solution_generator"]
        calls = [s for s in t["steps"] if s["step_type"] == "action" and s["tool_name"]]
        assert [c["tool_name"] for c in calls] == ["calculator"] * turns


def test_the_planner_sees_the_memory_of_earlier_turns(exported: dict[str, Any]) -> None:
    planners = [
        m for m in exported["requests"] if m[0]["content"].startswith("You are the planner")
    ]
    later = [m[-1]["content"] for m in planners if "Turn 1:" in m[-1]["content"]]
    assert later, "no planner turn after a first one"
    for prompt in later:
        # The structured record of turn 1: the action, the tool call and its result, and
        # the verifier's verdict.
        assert "sub_goal: compute it" in prompt
        assert re.search(r"tool call calculator\(expression='[^']+'\) -> \d", prompt)
        assert "conclusion: CONTINUE" in prompt
        assert "- calculator(expression: string)" in prompt  # the toolset K


def test_samples_are_the_planner_turns_with_the_judged_reward_and_verls_advantage(
    exported: dict[str, Any],
) -> None:
    pytest.importorskip("verl")
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    trajectories = {t["request_id"]: t for t in exported["trajectories"]}
    for mode in ("samples", "turns"):
        rows = exported[mode]
        # One row per planner turn of every rollout, and nothing else.
        assert {r["agent"] for r in rows} == {"planner"}
        per_rollout = Counter(r["rollout_id"] for r in rows)
        assert len(per_rollout) == 16
        for task_id, n in per_rollout.items():
            steps = trajectories[task_id]["steps"]
            assert n == sum(s["metadata"].get("agent") == "planner" for s in steps)
            assert [r["turn_index"] for r in rows if r["rollout_id"] == task_id] == list(range(n))
        # The reward is the judge's verdict on the final answer, the same for every turn.
        assert {(r["reward_fn"], r["reward_source"]) for r in rows} == {("judge@1", "recorded")}
        for r in rows:
            assert r["reward"] == trajectories[r["rollout_id"]]["final_reward"]
        assert {r["reward"] for r in rows} == {0.0, 1.0}
        # verl's estimator, over one value per rollout (the default) or per turn.
        chosen = list({r["rollout_id"]: r for r in rows}.values()) if mode == "samples" else rows
        scores = torch.tensor([[r["reward"]] for r in chosen])
        uids = np.array([r["uid"] for r in chosen], dtype=object)
        advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), uids)
        ids = [r["rollout_id"] for r in chosen]
        expected = dict(zip(ids, advantages[:, 0].tolist(), strict=True))
        if mode == "turns":
            assert [r["advantage"] for r in rows] == pytest.approx(
                advantages[:, 0].tolist(), abs=1e-5
            )
        for r in rows:
            assert r["advantage"] == pytest.approx(expected[r["rollout_id"]], abs=1e-5)
        assert sum(1 for r in rows if abs(r["advantage"]) > 0.1) >= 8
    meta = exported["samples_meta"]
    assert meta["trainable_agents"] == {"agentflow": ["planner"]}
    assert meta["llm_calls_by_agent"]["memory_verifier"] > 0  # called, but not trained
