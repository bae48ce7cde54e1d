"""What the math example (``seed/basic_usage.py``) leaves to its reader: a model and an
optional advanced math tool (docs/agents.md, "AgenticRollout").

``YourLLMFunction`` stands in for your model so that the example runs offline: it answers
in the ReAct format from a list of replies, one per turn of the conversation, and puts the
last tool result where a reply says ``{observation}``. Replace it with a function that
asks your model: ``async def my_llm(messages, **kwargs) -> str`` (or a dict with ``text``,
``token_ids`` and ``logprobs``).

``WolframAlphaTool`` is a small offline stand-in for an advanced math service: expressions
in one variable, evaluated by kernelflow's calculator (never ``eval``), and their definite
integrals by Simpson's rule.
"""

from __future__ import annotations

import re
from typing import Any

from kernelflow.agentic_rollout import BaseTool, ToolExecutionError
from kernelflow.tools.base import ToolError
from kernelflow.tools.calculator import evaluate

MATH_REPLIES = (
    "Thought: The integral of x^2 is x^3/3, so from 0 to 5 it is 5^3/3.\n"
    "Action: calculator(expression='5**3 / 3')",
    "Thought: The calculator gave the value of the integral.\nFinal Answer: {observation}",
)
_OBSERVATION = re.compile(r"Observation \([^)]*\): (.*)")


class YourLLMFunction:
    def __init__(self, replies: tuple[str, ...] = MATH_REPLIES) -> None:
        self.replies = replies

    async def __call__(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        reply = self.replies[min(turn, len(self.replies) - 1)]
        seen = [m for msg in messages for m in _OBSERVATION.findall(msg["content"])]
        return reply.replace("{observation}", seen[-1] if seen else "")


class WolframAlphaTool(BaseTool):
    description = (
        "Evaluate an expression in one variable, or integrate it: "
        "expression='x**2', variable='x', lower=0, upper=5"
    )
    parameters_schema = {
        "type": "object",
        "properties": {
            "expression": {"type": "string"},
            "variable": {"type": "string"},
            "lower": {"type": "number"},
            "upper": {"type": "number"},
        },
        "required": ["expression"],
    }
    intervals = 1000  # Simpson's rule: exact for polynomials up to degree 3

    async def execute(
        self,
        expression: str,
        variable: str = "x",
        lower: float | None = None,
        upper: float | None = None,
        **kwargs: Any,
    ) -> float:
        if lower is None or upper is None:
            return self._at(expression, variable, 0.0)
        h = (upper - lower) / self.intervals
        weights = [
            1 if i in (0, self.intervals) else 4 if i % 2 else 2 for i in range(self.intervals + 1)
        ]
        total = sum(
            w * self._at(expression, variable, lower + i * h) for i, w in enumerate(weights)
        )
        return total * h / 3

    @staticmethod
    def _at(expression: str, variable: str, value: float) -> float:
        if not re.fullmatch(r"[A-Za-z_]\w*", variable):
            raise ToolExecutionError(f"variable must be a name, got {variable!r}")
        try:
            return float(evaluate(re.sub(rf"\b{variable}\b", f"({value!r})", expression)))
        except ToolError as exc:
            raise ToolExecutionError(str(exc)) from None
