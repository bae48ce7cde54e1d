"""Prompts for the LLM agents and the conductor, built from a task's folded state.

Templates live in ``actors/prompt_templates/<agent>.txt`` (``string.Template`` syntax, so
code braces need no escaping); an agent without its own template uses the coder's.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template

from events.model import ChatMessage, OutputParsed, ParseFailed, VerificationCompleted
from projections.task_state import TaskState
from workflows.model import AgentSpec, Workflow

MAX_ATTEMPTS_SHOWN = 3  # previous verifications shown to the coder: recent ones matter most
MAX_ERROR_CHARS = 2000

_BACKEND_NAMES = {"triton": "Triton", "cuda": "CUDA C (compiled with CuPy RawModule)"}


@cache
def _template(name: str) -> Template:
    root = resources.files("actors") / "prompt_templates"
    path = root / f"{name}.txt"
    if not path.is_file():
        path = root / "coder.txt"
    return Template(path.read_text(encoding="utf-8"))


def agent_messages(state: TaskState, workflow: Workflow, agent: str) -> list[ChatMessage]:
    submitted = state.submitted
    assert submitted is not None
    backend = _BACKEND_NAMES.get(submitted.backend, submitted.backend)
    text = _template(agent).safe_substitute(
        backend_name=backend,
        task_source=submitted.task_source.strip(),
        design=_design_section(state),
        feedback=_feedback_section(state, agent),
        output_format=_format_section(workflow.agents[agent]),
        device_note=(
            "Kernels are checked on the GPU when one is present, otherwise with "
            "TRITON_INTERPRET=1 on the CPU: use only features the interpreter supports "
            "(no bf16) and launch on the inputs' device."
        ),
    )
    return [ChatMessage(role="user", content=text)]


def conductor_messages(
    state: TaskState, workflow: Workflow, options: tuple[str, ...], after_agent: str
) -> list[ChatMessage]:
    text = _template("conductor").safe_substitute(
        workflow_name=workflow.name,
        history=" → ".join(state.history) or "(none)",
        after_agent=after_agent,
        latest_result=_latest_result(state),
        options=", ".join(options),
    )
    return [ChatMessage(role="user", content=text)]


def _design_section(state: TaskState) -> str:
    design = state.latest_output("designer")
    if not design or not design.get("code"):
        return ""
    return f"\n## Design to implement\n```\n{design['code']}\n```\n"


def _feedback_section(state: TaskState, agent: str) -> str:
    parts: list[str] = []
    current = state.current
    if current is not None and current.event.suggestion:
        parts.append(f"## Conductor's analysis of the last attempt\n{current.event.suggestion}")
    previous = [d for d in state.dispatches[:-1] if d.agent == agent]
    if previous and isinstance(previous[-1].result, ParseFailed):
        parts.append(
            "## Your previous answer could not be parsed\n"
            f"{previous[-1].result.reason}. Follow the answer format exactly."
        )
    if agent != "designer":
        for check in state.verifications[-MAX_ATTEMPTS_SHOWN:]:
            parts.append(_attempt(check))
    return ("\n" + "\n\n".join(parts) + "\n") if parts else ""


def _attempt(check: VerificationCompleted) -> str:
    report = check.report
    errors = "\n".join(report.errors + report.mismatches)[:MAX_ERROR_CHARS]
    return (
        f"## Previous attempt (dispatch {check.dispatch_id}): {report.verdict}\n"
        f"{report.summary}\n"
        f"```python\n{check.code.strip()}\n```\n"
        + (f"Verifier feedback:\n```\n{errors}\n```" if errors else "")
    )


def _latest_result(state: TaskState) -> str:
    current = state.current
    if current is None or current.result is None:
        return "(nothing yet)"
    result = current.result
    if isinstance(result, VerificationCompleted):
        return _attempt(result)
    if isinstance(result, ParseFailed):
        return f"The {current.agent}'s answer could not be parsed: {result.reason}"
    if isinstance(result, OutputParsed):
        return f"The {current.agent} produced: {', '.join(result.fields)}"
    return f"The {current.agent} ended with {result.kind}"


def _format_section(spec: AgentSpec) -> str:
    lines = ["Reply with a JSON object with these fields:"]
    for f in spec.output_fields:
        need = "mandatory" if f.mandatory else "optional"
        lines.append(f"- `{f.name}` ({f.field_type}, {need}): {f.description}")
    if len(spec.output_fields) == 1 and spec.output_fields[0].field_type == "str":
        lines.append(
            f"Or give `{spec.output_fields[0].name}` as exactly one fenced code block "
            "(```python ... ```)."
        )
    return "\n".join(lines)
