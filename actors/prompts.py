"""Prompts for the LLM agents and the conductor, built from a task's folded state.

Each prompt is a system message — the static part: role, the verifier's rules, DSL
guidance; the same for every task of a backend, so providers cache it — and a user
message with the task, previous attempts, feedback and the answer format.

Templates live in ``actors/prompt_templates``: ``<agent>.system.txt`` and ``<agent>.txt``
(``string.Template`` syntax, so code braces need no escaping). The DSL guidance is the
backend's own (``kernelflow.verification.backends``), or ``dsl_<backend>.txt`` where one is
given. An agent without its own templates uses the coder's. A file of the
same name in ``KF_PROMPTS_DIR`` (or the LLM config's ``prompts_dir``) replaces the built-in,
and a workflow may give an agent its own templates inline (``agent_info.<agent>.prompt:
{system, user}``, recorded with the task so a replay uses them too), which win over both.
Prompt tasks (rollouts) use ``task.system.txt`` / ``task.txt``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path
from string import Template

from kernelflow.actors.kinds.formats import format_call, tool_catalogue
from kernelflow.events.model import (
    ChatMessage,
    OutputParsed,
    ParseFailed,
    PriorKernel,
    TaskSubmitted,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.agent_memory import memory, render_memory
from kernelflow.projections.counters import state_counters
from kernelflow.projections.task_state import TaskState
from kernelflow.projections.verl_format import dataset_row
from kernelflow.tools import make_tool
from kernelflow.verification.backends import UnknownBackend, backend
from kernelflow.verification.results import cut_at_line
from kernelflow.workflows.model import (
    ANSWER_FIELD,
    CODE_FIELD,
    TOOL_FIELD_TYPE,
    AgentSpec,
    OutputField,
    Workflow,
)

MAX_ATTEMPTS_SHOWN = 3  # previous verifications shown to the coder: recent ones matter most
MAX_ERROR_CHARS = 2000
# What the conductor's LLM reads of the work (docs/workflows.md, "Routing"):
# each field of the answer of the agent that just finished, and the task, up to these.
CONDUCTOR_FIELD_CHARS = 6000
CONDUCTOR_TASK_CHARS = 8000


def prompts_dir() -> Path | None:
    """The override directory (``KF_PROMPTS_DIR``, else the LLM config's ``prompts_dir``)."""
    raw = os.environ.get("KF_PROMPTS_DIR")
    if raw:
        return Path(raw)
    return _configured_prompts_dir(os.environ.get("KF_LLM_CONFIG"))


@cache
def _configured_prompts_dir(config_path: str | None) -> Path | None:
    """The LLM config file's ``prompts_dir``, read once per file (every prompt asks)."""
    from kernelflow.llm.config import load_config

    return load_config({"KF_LLM_CONFIG": config_path} if config_path else {}).prompts_dir


def _find(name: str, fallback: str | None, override: Path | None) -> Traversable | None:
    builtin = resources.files("kernelflow.actors") / "prompt_templates"
    roots: list[Traversable] = [override, builtin] if override is not None else [builtin]
    for candidate in (name, fallback):
        if candidate is None:
            continue
        for root in roots:
            path = root / candidate
            if path.is_file():
                return path
    return None


@cache
def _load(name: str, fallback: str | None, override: Path | None) -> Template:
    path = _find(name, fallback, override)
    return Template(path.read_text(encoding="utf-8") if path is not None else "")


def _template(name: str, fallback: str | None = None) -> Template:
    return _load(name, fallback, prompts_dir())


def agent_messages(state: TaskState, workflow: Workflow, agent: str) -> list[ChatMessage]:
    submitted = state.submitted
    assert submitted is not None
    spec = workflow.agents[agent]
    if submitted.prompt is not None:  # a prompt task (rollouts): no kernel, no DSL
        earlier, prompt = _dataset_turns(submitted)
        system = _agent_template(spec, "system", "task.system.txt").safe_substitute()
        template = _agent_template(spec, "user", "task.txt")
        user = template.safe_substitute(
            prompt=prompt.strip(),
            feedback=_feedback_section(state, agent),
            output_format=_format_section(spec, workflow.toolset),
            **_flow_sections(template, state, workflow),
        )
        return _messages(system, user, earlier)
    static = _backend_notes(submitted.backend)
    system = _agent_template(spec, "system", "coder.system.txt").safe_substitute(static)
    template = _agent_template(spec, "user", "coder.txt")
    prior = _prior_kernels_section(submitted.prior_kernels)
    design = _design_section(state)
    if "prior_kernels" not in template.template:  # a template of one's own from before it
        design, prior = design + prior, ""
    user = template.safe_substitute(
        static,
        task_source=submitted.task_source.strip(),
        design=design,
        prior_kernels=prior,
        feedback=_feedback_section(state, agent) + _improve_section(state, workflow, agent),
        output_format=_format_section(spec, workflow.toolset),
        **_flow_sections(template, state, workflow),
    )
    return _messages(system, user)


def _flow_sections(template: Template, state: TaskState, workflow: Workflow) -> dict[str, str]:
    """``$memory`` (what the task's agents did so far: ``projections/agent_memory.py``) and
    ``$toolset`` (the tools of the workflow's agents), for the templates that use them
    (docs/workflows.md, "agentflow")."""
    sections = {}
    if _uses(template, "memory"):
        sections["memory"] = render_memory(memory(state))
    if _uses(template, "toolset"):
        sections["toolset"] = tool_catalogue([make_tool(n).spec() for n in workflow.toolset])
    return sections


def _uses(template: Template, name: str) -> bool:
    return f"${name}" in template.template or f"${{{name}}}" in template.template


def _backend_notes(name: str) -> dict[str, str]:
    """What the prompt says of the task's backend: its name, where kernels are checked,
    the imports it adds, its DSL guidance (``dsl_<name>.txt`` in the override directory
    replaces the backend's own)."""
    title, device_note, imports, notes = name, "", "", ""
    try:
        dsl = backend(name)
    except UnknownBackend:  # recorded by a daemon that had a plugin this one lacks
        pass
    else:
        title, device_note, notes = dsl.title, dsl.device_note, dsl.dsl_notes
        imports = "".join(f", {module}" for module in dsl.extra_imports)
    custom = _find(f"dsl_{name}.txt", None, prompts_dir())
    if custom is not None:
        notes = Template(custom.read_text(encoding="utf-8")).safe_substitute()
    return {
        "backend_name": title,
        "device_note": device_note,
        "extra_imports": imports,
        "dsl_guidance": notes.strip(),
    }


def _agent_template(spec: AgentSpec, part: str, fallback: str) -> Template:
    """The workflow's own template for this agent, else ``<agent>[.system].txt`` (override
    directory first), else ``fallback``."""
    if part in spec.prompt_templates:
        return Template(spec.prompt_templates[part])
    name = f"{spec.name}.system.txt" if part == "system" else f"{spec.name}.txt"
    return _template(name, fallback)


def kind_instructions(template: str, *, tools: str, tool_format: str, max_steps: int) -> str:
    """How a tool-using agent kind must reply (its template in text format; the native
    tool-use note otherwise)."""
    name = template if tool_format == "text" else "kind_native.txt"
    return _template(name).safe_substitute(tools=tools, max_steps=max_steps).strip()


def conductor_messages(
    state: TaskState, workflow: Workflow, options: tuple[str, ...], after_agent: str
) -> list[ChatMessage]:
    """The conductor LLM's prompt (docs/workflows.md, "Routing"): the task,
    what the agent that just finished gave (each field up to ``CONDUCTOR_FIELD_CHARS``),
    the last verification, the limits' counters and the options; its system part speaks
    of the task's kind (a kernel, or a prompt task's answer)."""
    submitted = state.submitted
    assert submitted is not None
    prompt_task = submitted.prompt is not None
    system_file = "conductor_prompt.system.txt" if prompt_task else "conductor.system.txt"
    system = _template(system_file).safe_substitute()
    user = _template("conductor.txt").safe_substitute(
        workflow_name=workflow.name,
        history=" → ".join(state.history) or "(none)",
        counters=_counters_line(state, workflow),
        task=_conductor_task(submitted),
        after_agent=after_agent,
        latest_result=_latest_result(state),
        last_verification=_last_verification(state, prompt_task),
        options=", ".join(options),
    )
    return _messages(system, user)


def clipped(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, and a line saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[… {len(text) - limit} more characters not shown]"


def _conductor_task(submitted: TaskSubmitted) -> str:
    if submitted.prompt is not None:
        return "A query, whose final answer is graded against a reference answer:\n" + clipped(
            submitted.prompt.strip(), CONDUCTOR_TASK_CHARS
        )
    title = _backend_notes(submitted.backend)["backend_name"]
    source = clipped(submitted.task_source.strip(), CONDUCTOR_TASK_CHARS)
    return f"A {title} kernel for this PyTorch reference:\n```python\n{source}\n```"


def _counters_line(state: TaskState, workflow: Workflow) -> str:
    """Where the task stands against its limits (docs/workflows.md, "Limits")."""
    counters = state_counters(state, workflow.sequence_patterns)
    parts = [f"step {counters.step} of max_step {workflow.max_step}"]
    last = counters.last_agent
    if last is not None:
        runs, limit = counters.consecutive(last), workflow.single_agent_limit(last)
        parts.append(f"{last} ran {runs} time(s) in a row (single_agent limit {limit})")
    parts += [
        f"sequence {seq.name} repeated {counters.sequence_repeats(seq.name)} time(s) "
        f"(max_repeats {seq.max_repeats})"
        for seq in workflow.sequences
    ]
    return "; ".join(parts)


def _last_verification(state: TaskState, prompt_task: bool) -> str:
    if prompt_task:
        return "(none: a prompt task is not verified; its final answer is judged)"
    checks = state.verifications
    if not checks:
        return "(none yet)"
    current = state.current
    if current is not None and current.result is checks[-1]:
        return "(the latest result above)"
    report = checks[-1].report
    feedback = _verifier_feedback(report)
    return f"{report.verdict}: {report.summary}" + (
        f"\nVerifier feedback:\n```\n{feedback}\n```" if feedback else ""
    )


def judge_messages(state: TaskState) -> list[ChatMessage]:
    """The judge's prompt (AgentFlow's answer judge): question, reference, answer; it
    replies with ``{"analysis": ..., "true_false": ...}``."""
    submitted, finished = state.submitted, state.finished
    assert submitted is not None and finished is not None
    system = _template("judge.system.txt").safe_substitute()
    user = _template("judge.txt").safe_substitute(
        question=(submitted.prompt or "").strip(),
        reference=(submitted.reference_answer or "(none given)").strip(),
        answer=(finished.final_answer or "(no answer)").strip(),
    )
    return _messages(system, user)


def _messages(system: str, user: str, earlier: Sequence[ChatMessage] = ()) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", content=system.strip())] if system.strip() else []
    return [*messages, *earlier, ChatMessage(role="user", content=user.strip() + "\n")]


def _dataset_turns(submitted: TaskSubmitted) -> tuple[list[ChatMessage], str]:
    """A prompt task's conversation so far and its last turn: a multi-turn chat prompt from
    a verl-format dataset stays turns, as its rows give them (the system message is the
    solver's system prompt already); any other prompt is one turn."""
    assert submitted.prompt is not None
    row = dataset_row(submitted)
    turns = [m for m in row.prompt if m.get("role") != "system"] if row is not None else []
    if len(turns) < 2 or any(
        m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str)
        for m in turns
    ):
        return [], submitted.prompt
    earlier = [ChatMessage(role=m["role"], content=m["content"]) for m in turns[:-1]]
    return earlier, turns[-1]["content"]


def _design_section(state: TaskState) -> str:
    design = state.latest_output("designer") or {}
    # A designer without an output format answers in free text: all of it (``answer``,
    # its code block included) is the design.
    text = design.get(ANSWER_FIELD) or design.get(CODE_FIELD)
    if not text:
        return ""
    return f"\n## Design to implement\n```\n{text}\n```\n"


def _prior_kernels_section(kernels: Sequence[PriorKernel]) -> str:
    """A search's parent (the kernel to improve) and inspirations (others to learn from),
    each with what the verifier said of it."""
    parts = []
    for k in kernels:
        title = "Kernel to improve" if k.role == "parent" else "Another kernel to learn from"
        measured = f", {k.speedup:.2f}x the baseline" if k.speedup is not None else ""
        if k.speedup is not None and k.speedup_conclusive is False:
            measured = ", its speed could not be told from the baseline's (timing inconclusive)"
        elif k.candidate_ms is not None:
            measured += f", {k.candidate_ms:.4g} ms"
        feedback = cut_at_line(k.feedback.strip(), MAX_ERROR_CHARS)
        parts.append(
            f"## {title} ({k.verdict}{measured})\n```python\n{k.code.strip()}\n```\n"
            + (f"Verifier feedback:\n```\n{feedback}\n```\n" if feedback else "")
        )
    if not parts:
        return ""
    intro = (
        "\nEarlier attempts of this search, with the verifier's verdicts: write a correct "
        "kernel that is faster than them.\n"
    )
    return intro + "\n".join(parts)


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


def _improve_section(state: TaskState, workflow: Workflow, agent: str) -> str:
    """Why a kernel that passed is back with its author (docs/workflows.md, "Improving
    after a pass"): how close it came to speed-of-light, and the target."""
    checks = state.verifications
    current = state.current
    improve = workflow.improve
    if improve is None or not checks or current is None or current.agent != agent:
        return ""
    report = checks[-1].report
    if not report.passed or report.sol_fraction is None:
        return ""
    return (
        f"\n## Your kernel passed: now make it faster\n"
        f"It reaches {report.sol_fraction:.0%} of this machine's speed-of-light; the target "
        f"is {improve.target_sol_fraction:.0%}. Hand over a faster kernel: the task keeps "
        "the best kernel that passed, whatever happens to the next ones.\n"
    )


def _verifier_feedback(report: VerificationReport) -> str:
    """What the verifier said of a check: its feedback for the coder, as written (bounded
    by the verifier, each rule broken whole: docs/verifier.md, "Feedback that teaches");
    older reports have only errors."""
    return report.feedback or cut_at_line(
        "\n".join(report.errors + report.mismatches), MAX_ERROR_CHARS
    )


def _attempt(check: VerificationCompleted) -> str:
    report = check.report
    errors = _verifier_feedback(report)
    return (
        f"## Previous attempt: {report.verdict}\n"
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
        if result.report.passed:  # the conductor is asked only where it may hand the kernel on
            return (
                f"{_attempt(result)}\nThe kernel passed: `finish` ends the task with it; "
                "another option hands it on to be improved (say what to improve)."
            )
        return _attempt(result)
    if isinstance(result, ParseFailed):
        said = current.llm_calls[-1].response_text if current.llm_calls else ""
        answer = f"\nIts answer:\n```\n{clipped(said, CONDUCTOR_FIELD_CHARS)}\n```" if said else ""
        return f"The {current.agent}'s answer could not be parsed: {result.reason}{answer}"
    if isinstance(result, OutputParsed):
        parts = [f"The {current.agent} answered:"]
        for name, value in result.fields.items():
            text = value if isinstance(value, str) else json.dumps(value)
            parts.append(f"### {name}\n```\n{clipped(text, CONDUCTOR_FIELD_CHARS)}\n```")
        for call in current.tool_calls:
            shown = format_call(call.tool, call.args)
            outcome = call.output if call.ok else f"error: {call.error or call.output}"
            parts.append(f"- tool call {shown} -> {clipped(outcome, MAX_ERROR_CHARS)}")
        return "\n".join(parts)
    return f"The {current.agent} ended with {result.kind}"


def _format_section(spec: AgentSpec, toolset: Sequence[str]) -> str:
    if not spec.output_fields:  # no output_format: a free-text answer
        return (
            "Answer in plain text. Give code as a fenced block (```python ... ```): the last "
            "one in your answer is taken as your code."
        )
    if spec.kind != "llm" or _single_answer(spec):
        return _final_answer_format(spec, toolset)
    lines = ["Reply with a JSON object with these fields:"]
    lines += [_field_line(spec, f, toolset) for f in spec.output_fields]
    if len(spec.output_fields) == 1 and spec.output_fields[0].field_type == "str":
        lines.append(
            f"Or give `{spec.output_fields[0].name}` as exactly one fenced code block "
            "(```python ... ```)."
        )
    return "\n".join(lines)


def _single_answer(spec: AgentSpec) -> bool:
    """An agent whose one output is a plain answer (not code): ``Final Answer:`` suits it."""
    return len(spec.output_fields) == 1 and spec.output_fields[0].name != spec.code_field


def _field_line(spec: AgentSpec, f: OutputField, toolset: Sequence[str]) -> str:
    """One field of the answer format: its name, type, need and description; for a
    ``tool`` field, the tools it may name; for a ``route_by`` field, its answers."""
    need = "mandatory" if f.mandatory else "optional"
    line = f"- `{f.name}` ({f.field_type}, {need}): {f.description}"
    if f.field_type == TOOL_FIELD_TYPE:
        line += f" (one of: {', '.join(toolset)})"
    if spec.route_by is not None and spec.route_by.field == f.name:
        line += f" (one of: {', '.join(answer for answer, _ in spec.route_by.values)})"
    return line


def _final_answer_format(spec: AgentSpec, toolset: Sequence[str]) -> str:
    if len(spec.output_fields) == 1 and spec.output_fields[0].field_type == "str":
        f = spec.output_fields[0]
        if f.name == spec.code_field:
            return (
                "Give `Final Answer:` followed by the complete module as exactly one fenced "
                f"code block (```python ... ```): {f.description}"
            )
        return f"End with `Final Answer:` followed by {f.description or 'your answer'}."
    lines = ["Give `Final Answer:` followed by a JSON object with these fields:"]
    lines += [_field_line(spec, f, toolset) for f in spec.output_fields]
    return "\n".join(lines)
