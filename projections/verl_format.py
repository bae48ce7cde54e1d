"""What a task is in verl's dataset vocabulary: ``data_source``, ``prompt`` (chat messages),
``ability``, ``reward_model {style, ground_truth}`` and ``extra_info``.

A prompt task that came from a verl-format dataset (``kernelflow rollout --dataset
x.parquet``) records the row it came from with its submission, in
``SubmitTask.metadata["dataset_row"]`` (JSON: its chat prompt with the system message, its
``data_source``, ``ability``, ``reward_model`` and ``extra_info``), so that every export
gives that row back as it was. Other tasks get kernelflow's own values:

- kernel tasks: ``data_source = "kernelflow/<backend>"``, ``ability = "kernel_generation"``,
  ground truth = the task's reference PyTorch source;
- prompt tasks without a recorded row: ``data_source = "kernelflow/prompt"``,
  ``ability = "question_answering"``, ground truth = the reference answer.

Whatever the source, ``extra_info["kernelflow"]`` says what a reward function needs to
score the task again (``kernelflow.integrations.verl.compute_score``): its kind, backend,
the reward function the export used and the ones the task recorded, and where it came from.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from kernelflow.events.model import TaskSubmitted
from kernelflow.workflows.loader import WorkflowError, parse_recorded_workflow
from kernelflow.workflows.model import VERIFIER

DATASET_ROW = "dataset_row"  # the SubmitTask.metadata key of the recorded dataset row
KERNEL_SOURCE_PREFIX = "kernelflow/"
KERNEL_ABILITY = "kernel_generation"
PROMPT_SOURCE = "kernelflow/prompt"
PROMPT_ABILITY = "question_answering"


class DatasetRow(msgspec.Struct, frozen=True, kw_only=True):
    """A verl-format dataset row, as a rollout recorded it (values exactly as read)."""

    prompt: list[dict[str, Any]]  # chat messages, the system message included
    data_source: str | None = None
    ability: str | None = None
    reward_model: dict[str, Any] | None = None
    extra_info: dict[str, Any] | None = None


def encode_dataset_row(row: DatasetRow) -> str:
    return msgspec.json.encode(row).decode()


def dataset_row(submitted: TaskSubmitted) -> DatasetRow | None:
    """The dataset row recorded with a task, or None (none recorded, or not readable)."""
    raw = submitted.metadata.get(DATASET_ROW)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=DatasetRow)
    except msgspec.DecodeError:
        return None


def is_prompt_task(submitted: TaskSubmitted) -> bool:
    return submitted.prompt is not None


def data_source(submitted: TaskSubmitted, row: DatasetRow | None) -> str:
    if row is not None and row.data_source:
        return row.data_source
    if is_prompt_task(submitted):
        return PROMPT_SOURCE
    return f"{KERNEL_SOURCE_PREFIX}{submitted.backend}"


def ability(submitted: TaskSubmitted, row: DatasetRow | None) -> str:
    if row is not None and row.ability:
        return row.ability
    return PROMPT_ABILITY if is_prompt_task(submitted) else KERNEL_ABILITY


def reward_model(submitted: TaskSubmitted, row: DatasetRow | None) -> dict[str, Any]:
    """``{style, ground_truth}``: the row's own when recorded (its ground truth may be any
    JSON value), else the task's reference (answer, or PyTorch source)."""
    if row is not None and row.reward_model is not None and "ground_truth" in row.reward_model:
        return {"style": "rule", **row.reward_model}
    if is_prompt_task(submitted):
        return {"style": "rule", "ground_truth": submitted.reference_answer or ""}
    return {"style": "rule", "ground_truth": submitted.task_source}


def ground_truth_text(value: Any) -> str:
    """A ground truth as text, for columns that hold a string (JSON when it is not one)."""
    return value if isinstance(value, str) else json.dumps(value)


def kernelflow_info(submitted: TaskSubmitted, reward_fn: str, rewards: list[str]) -> dict[str, Any]:
    """``extra_info["kernelflow"]``: what re-scoring the task needs, and where it came from.
    Same keys in the same order for every task (parquet stores it as one struct)."""
    return {
        "kind": "prompt" if is_prompt_task(submitted) else "kernel",
        "backend": submitted.backend,
        "reward_fn": reward_fn,
        "rewards": list(rewards),
        "task_id": submitted.task_id,
        "task_name": submitted.task_name,
        "group_id": submitted.group_id,
        "workflow": submitted.workflow_name,
    }


def chat_prompt(submitted: TaskSubmitted, row: DatasetRow | None) -> list[dict[str, Any]] | None:
    """A prompt task's prompt as chat messages: the recorded row's (system message and all
    turns), else its text as one user message. None for a kernel task (its prompt is an
    agent's: see ``kernel_writers``)."""
    if row is not None and row.prompt:
        return [dict(m) for m in row.prompt]
    if submitted.prompt is not None:
        return [{"role": "user", "content": submitted.prompt}]
    return None


def kernel_writers(submitted: TaskSubmitted) -> frozenset[str]:
    """The agents of a kernel task's workflow that write the kernel: those that hand their
    code field to the verifier, else any that has one (a coder that checks its own kernel
    with tools). Empty when the recorded workflow cannot be read."""
    try:
        workflow = parse_recorded_workflow(submitted.workflow_yaml, submitted.workflow_name)
    except WorkflowError:
        return frozenset()
    coders = {name: spec for name, spec in workflow.agents.items() if spec.code_field}
    to_verifier = {name for name, spec in coders.items() if VERIFIER in spec.possible_next}
    return frozenset(to_verifier or coders)
