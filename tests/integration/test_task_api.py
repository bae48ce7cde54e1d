"""Named workflows and the Task API (docs/workflows.md, "Named workflows" and "The Task
API"): the workflow spec's custom workflow (examples/workflows/), copied verbatim into
the workflows directory, is found by its name; ``Task(op_name, task_desc,
workflow="custom_workflow")`` runs it in-process on the embedded NATS to success,
blocking (``run_sync``) and awaited (the page's example, run as printed); ``kernelflow
run --workflow NAME`` finds one in the current directory; ``kernelflow workflow list``
says what is found where."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, KERNELFLOW, REPO, as_user, cli_env

SEED_CUSTOM = (EXAMPLES / "workflows" / "custom_workflow.yaml").read_text()
SCRIPT = EXAMPLES / "scripted" / "relu_custom_workflow.yaml"
RELU = EXAMPLES / "tasks" / "relu.py"
NOWHERE = "nats://127.0.0.1:9"  # nothing listens there


def scripted_kernel() -> str:
    text = yaml.safe_load(SCRIPT.read_text())["custom_optimizer"][0]["text"]
    return re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)  # type: ignore[union-attr]


def in_dir(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KERNELFLOW, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=240
    )


def test_task_runs_a_named_workflow_from_the_workflows_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "workflows").mkdir(parents=True)
    (data / "workflows" / "custom_workflow.yaml").write_text(SEED_CUSTOM)
    (tmp_path / "relu.py").write_text(RELU.read_text())
    program = (
        "import json\n"
        "from kernelflow import Task\n"
        'task = Task(op_name="relu", task_desc=open("relu.py").read(), '
        'workflow="custom_workflow")\n'
        "op_name, success, state = task.run_sync()  # blocking\n"
        "agents = [s.metadata.get('agent') for s in state.trajectory.steps "
        "if s.step_type.value == 'action']\n"
        "print(json.dumps({'op_name': op_name, 'success': success, 'status': state.status, "
        "'verdict': state.verdict, 'code': state.kernel_code, 'task_id': state.task_id, "
        "'agents': agents, 'workflow': state.trajectory.metadata['workflow']}))\n"
    )
    env = cli_env(KF_DATA_DIR=str(data), KF_LLM=f"scripted:{SCRIPT}")
    run = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, env=env,
        timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert (result["op_name"], result["success"], result["status"]) == ("relu", True, "success")
    assert result["verdict"] == "pass" and result["task_id"].startswith("t-")
    # The built-in verifier checked the optimizer's optimized_code: the task ends with it.
    assert result["code"] == scripted_kernel()
    assert result["agents"] == ["custom_optimizer"]
    assert result["workflow"] == "custom_workflow"


def test_the_pages_task_api_example_runs_as_printed(tmp_path: Path) -> None:
    """docs/workflows.md, "The Task API": its shell lines, then its program (``await
    task.run()``), from the repository's root, on an embedded NATS in a data dir of its own."""
    page = (REPO / "docs" / "workflows.md").read_text()
    section = page.split("## The Task API", 1)[1].split("\n## ", 1)[0]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    bin_dir = str(Path(sys.executable).parent)  # where `python` is
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"), EXAMPLE=example)
    env["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    run = subprocess.run(
        ["bash", "-ec", shell + 'python -c "$EXAMPLE"'], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    first, *rest = run.stdout.splitlines()
    op_name, success, status, verdict, _speedup, task_id = first.split()
    assert (op_name, success, status, verdict) == ("relu", "True", "success", "pass")
    assert task_id.startswith("t-")
    assert scripted_kernel().strip() in "\n".join(rest)  # the kernel the verifier passed
    # The optimizer's answer, the conductor's decision, the verification at least.
    steps = re.fullmatch(r"(\d+) trajectory steps", rest[-1])
    assert steps is not None and int(steps.group(1)) >= 3, rest[-1]


def test_run_finds_a_named_workflow_in_the_current_directory(nats_url: str, tmp_path: Path) -> None:
    (tmp_path / "custom_workflow.yaml").write_text(SEED_CUSTOM)
    env = cli_env(KF_WORKFLOWS_DIR=str(tmp_path / "none"))
    run = in_dir(
        tmp_path, "run", str(RELU), "--workflow", "custom_workflow", "--llm", f"scripted:{SCRIPT}",
        "--json", "--out", str(tmp_path / "out"), *as_user("daemon", nats_url), env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert (result["status"], result["verifications"]) == ("success", ["pass"])
    assert result["final_code"] == scripted_kernel()
    unknown = in_dir(tmp_path, "run", str(RELU), "--workflow", "custom_workflw", env=env)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.strip().startswith(
        "kernelflow: unknown workflow 'custom_workflw'; available: agentflow, agentic, coder_only, "
        "conductor_connect_all, custom_workflow, default, verifier_only (or give the path of "
        f"a .yaml file; named workflows are looked for in: {tmp_path}, {tmp_path / 'none'})"
    )


def test_submit_and_bench_find_a_named_workflow_as_run_does(tmp_path: Path) -> None:
    """The name is resolved before anything connects: a name nothing has is refused saying
    where it was looked for; one the current directory has gets as far as the server."""
    (tmp_path / "custom_workflow.yaml").write_text(SEED_CUSTOM)
    env = cli_env(KF_WORKFLOWS_DIR=str(tmp_path / "none"))
    looked = f"named workflows are looked for in: {tmp_path}, {tmp_path / 'none'})"
    for command in (["submit", str(RELU)], ["bench", str(RELU)]):
        unknown = in_dir(
            tmp_path, *command, "--workflow", "custom_workflw", "--nats-url", NOWHERE, env=env
        )
        assert unknown.returncode == 2 and looked in unknown.stderr, unknown.stderr
        found = in_dir(
            tmp_path, *command, "--workflow", "custom_workflow", "--nats-url", NOWHERE, env=env
        )
        assert found.returncode == 1, found.stderr
        assert found.stderr.strip().endswith(f"nothing listens at {NOWHERE} (connection refused)")


def test_workflow_list_says_where_each_workflow_comes_from(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "team.yaml").write_text("base: default\nmandatory_llm_analysis: []\n")
    (shared / "default.yaml").write_text(SEED_CUSTOM)  # a predefined name: not used
    (shared / "compose.yaml").write_text("services: {nats: {image: nats}}\n")  # no workflow
    (shared / "broken.yaml").write_text("agent_info: {coder: {possible_next_agent: [finish]}}\n")
    (shared / "default_workflow.yaml").write_text(SEED_CUSTOM)  # seed 001's name: an alias
    (tmp_path / "custom_workflow.yml").write_text(SEED_CUSTOM)
    listed = in_dir(
        tmp_path, "workflow", "list", "--json", env=cli_env(KF_WORKFLOWS_DIR=str(shared))
    )
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["searched"] == [str(tmp_path), str(shared)]
    assert [(w["name"], w["source"], w["shadowed_by"]) for w in found["workflows"]] == [
        ("agentflow", "predefined", None),
        ("agentic", "predefined", None),
        ("coder_only", "predefined", None),
        ("conductor_connect_all", "predefined", None),
        ("default", "predefined", None),
        ("verifier_only", "predefined", None),
        ("custom_workflow", str(tmp_path / "custom_workflow.yml"), None),
        ("broken", str(shared / "broken.yaml"), None),
        ("default", str(shared / "default.yaml"), "predefined"),
        ("default_workflow", str(shared / "default_workflow.yaml"), "predefined"),
        ("team", str(shared / "team.yaml"), None),
    ]
    default = found["workflows"][4]
    assert default["aliases"] == ["default_workflow"] and default["invalid"] is None
    invalid = {w["name"]: w["invalid"] for w in found["workflows"] if w["invalid"]}
    assert invalid == {
        "broken": "limitation_info: missing required key (or extend a workflow that has one: "
        "base: default) (and 1 more)"
    }
    text = in_dir(tmp_path, "workflow", "list", env=cli_env(KF_WORKFLOWS_DIR=str(shared)))
    assert "default                predefined  (also: default_workflow)\n" in text.stdout
    assert f"broken                 {shared / 'broken.yaml'}  (invalid: limitation_info:" in (
        text.stdout
    )


def test_the_workflow_specifications_names_are_the_predefined_workflows(tmp_path: Path) -> None:
    """Seed 001 names the predefined workflows by their files: default_workflow and the
    others are aliases, whatever a directory holds; a near miss suggests one of them."""
    (tmp_path / "custom_workflow.yaml").write_text(SEED_CUSTOM)
    env = cli_env(KF_WORKFLOWS_DIR=str(tmp_path / "none"))
    shown = in_dir(tmp_path, "workflow", "show", "default_workflow", env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == in_dir(tmp_path, "workflow", "show", "default", env=env).stdout
    assert "designer" in shown.stdout and "max_step 20" in shown.stdout
    for alias in (
        "coder_only_workflow",
        "conductor_connect_all_workflow",
        "verifier_only_workflow",
    ):
        assert in_dir(tmp_path, "workflow", "validate", alias, env=env).returncode == 0
    missed = in_dir(tmp_path, "workflow", "show", "coder_only_workflw", env=env)
    assert missed.returncode == 2
    assert missed.stderr.strip().endswith("did you mean 'coder_only_workflow'?")


def test_the_errors_a_users_code_may_catch_are_importable_from_kernelflow() -> None:
    import kernelflow
    from kernelflow import WorkflowError
    from kernelflow.workflows.loader import WorkflowError as Defined

    assert WorkflowError is Defined
    for name in kernelflow.__all__:
        value = getattr(kernelflow, name)
        assert isinstance(value, type), name
    errors = [n for n in kernelflow.__all__ if issubclass(getattr(kernelflow, n), Exception)]
    assert {"WorkflowError", "TaskFileError", "UnknownBackend", "RewardUnjudged"} <= set(errors)
    with pytest.raises(AttributeError):
        kernelflow.NotAThing  # noqa: B018
