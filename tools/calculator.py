"""The ``calculator`` tool: arithmetic evaluated over Python's ``ast``, never ``eval``.

Only numbers, the arithmetic operators, comparisons, the listed functions and constants
are understood; anything else (names, attributes, subscripts, strings...) is refused.
Results are bounded so an expression cannot exhaust the daemon: integers have at most
:data:`MAX_INT_DIGITS` digits (exponents and factorials are checked before they are
computed), floats must stay finite, and the expression itself is short.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from kernelflow.common.syntax import parse_expression
from kernelflow.tools.base import Tool, ToolContext, ToolError, arguments
from kernelflow.tools.registry import register_tool

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_INT_DIGITS", "Calculator", "evaluate", "format_number"]

MAX_EXPRESSION_CHARS = 1000
MAX_INT_DIGITS = 1000
_INT_LIMIT = 10**MAX_INT_DIGITS
MAX_FACTORIAL = 449  # the largest n whose factorial has at most MAX_INT_DIGITS digits

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e}


def _factorial(n: Number) -> int:
    if not isinstance(n, int) or n < 0:
        raise ToolError(f"factorial needs a non-negative integer, got {format_number(n)}")
    if n > MAX_FACTORIAL:
        raise ToolError(
            f"factorial({n}) has more than {MAX_INT_DIGITS} digits; n must be at most "
            f"{MAX_FACTORIAL}"
        )
    return math.factorial(n)


# name -> (function, allowed argument counts)
_FUNCTIONS: dict[str, tuple[Callable[..., Number], range]] = {
    "sqrt": (math.sqrt, range(1, 2)),
    "exp": (math.exp, range(1, 2)),
    "log": (math.log, range(1, 3)),
    "log10": (math.log10, range(1, 2)),
    "sin": (math.sin, range(1, 2)),
    "cos": (math.cos, range(1, 2)),
    "tan": (math.tan, range(1, 2)),
    "asin": (math.asin, range(1, 2)),
    "acos": (math.acos, range(1, 2)),
    "atan": (math.atan, range(1, 2)),
    "abs": (abs, range(1, 2)),
    "round": (round, range(1, 3)),
    "floor": (math.floor, range(1, 2)),
    "ceil": (math.ceil, range(1, 2)),
    "factorial": (_factorial, range(1, 2)),
    "min": (lambda *xs: min(xs), range(1, 65)),
    "max": (lambda *xs: max(xs), range(1, 65)),
}
_KNOWN_NAMES = f"functions {', '.join(_FUNCTIONS)}; constants {', '.join(_CONSTANTS)}"


def format_number(value: Number | bool) -> str:
    """Integers as integers, integral floats without ``.0``, other floats in full."""
    if isinstance(value, bool | int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _checked(value: Any) -> Number:
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result overflows (it is not a finite number)")
    if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
        raise ToolError(f"an integer result has more than {MAX_INT_DIGITS} digits")
    return value


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse an integer power whose result would be too large, before computing it."""
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log10(abs(base)) >= MAX_INT_DIGITS
    ):
        raise ToolError(
            f"{format_number(base)} ** {exponent} has more than {MAX_INT_DIGITS} digits"
        )


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"only numbers are allowed, not {node.value!r}")
        return _checked(node.value)
    if isinstance(node, ast.Name):
        if node.id not in _CONSTANTS:
            raise ToolError(f"unknown name {node.id!r}; known: {_KNOWN_NAMES}")
        return _CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _checked(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise ToolError(f"division by zero ({exc})") from exc
        except OverflowError as exc:
            raise ToolError(f"the result overflows ({exc})") from exc
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _eval(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _call(node)
    raise ToolError(f"unsupported syntax: {ast.unparse(node)!r}")


def _call(node: ast.Call) -> Number:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in _FUNCTIONS:
        raise ToolError(f"unknown function {ast.unparse(node.func)!r}; known: {_KNOWN_NAMES}")
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise ToolError(f"{name}() takes plain positional arguments only")
    function, counts = _FUNCTIONS[name]
    if len(node.args) not in counts:
        expected = str(counts.start) if len(counts) == 1 else f"{counts.start}-{counts.stop - 1}"
        raise ToolError(f"{name}() takes {expected} argument(s), got {len(node.args)}")
    args = [_eval(a) for a in node.args]
    try:
        return _checked(function(*args))
    except (ValueError, TypeError, OverflowError, ZeroDivisionError) as exc:
        shown = ", ".join(format_number(a) for a in args)
        raise ToolError(f"{name}({shown}): {exc}") from exc


def evaluate(expression: str) -> Number:
    """The value of ``expression``; ToolError says what is wrong with it."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(
            f"the expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}"
        )
    try:
        tree = parse_expression(expression.strip())
    except SyntaxError as exc:
        raise ToolError(f"not a valid expression: {exc.msg}") from exc
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ToolError(f"not a valid expression: {exc}") from exc
    try:
        return _eval(tree)
    except RecursionError as exc:
        raise ToolError("the expression is nested too deeply") from exc


@register_tool
class Calculator(Tool):
    name = "calculator"
    description = (
        "Evaluate an arithmetic expression exactly as Python would: numbers, + - * / // % **, "
        "parentheses, comparisons, functions sqrt, exp, log(x[, base]), log10, sin, cos, "
        "tan, asin, acos, atan, abs, round, floor, ceil, factorial, min, max; constants pi, e."
    )
    parameters = arguments(
        {"expression": {"type": "string", "description": "e.g. 'sqrt(2) * (3 + 4) ** 2'"}}
    )

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        return format_number(evaluate(args["expression"]))
