"""Checks of a single call that need nothing but the call: the ways to look attributes up
by name (``getattr``/``hasattr`` at all, three-argument ``type()``, ``str.format``
templates) and the ways to change precision without naming a low-precision dtype (dtypes
built from values, tf32 precision arguments; a kernel language adds its own:
``KernelLanguage.call_findings``). Each returns its findings as ``Finding``s (rule, node,
why, what to write instead).
"""

from __future__ import annotations

import ast
import string

from kernelflow.verification.backends.base import dotted_name
from kernelflow.verification.backends.language import Finding
from kernelflow.verification.gate.chains import reported_by_attribute_rules
from kernelflow.verification.gate.rules import DTYPE_CONSTRUCTORS, FULL_PRECISION_DOT

__all__ = ["lookup_findings", "precision_findings"]


def lookup_findings(node: ast.Call, builtin: str) -> list[Finding]:
    """``builtin``: the builtin ``node`` calls by name ("" for none)."""
    found: list[Finding] = []
    if builtin == "getattr" or (builtin == "hasattr" and not _plain_lookup(node)):
        # A literal name is as good as `obj.name`; any other hides what is reached.
        instead = 'write obj.attr (hasattr(obj, "attr") with a literal name is fine)'
        if builtin == "getattr" and _plain_lookup(node):
            direct = ast.Attribute(node.args[0], node.args[1].value, ast.Load())  # type: ignore[attr-defined]
            instead = f"replace `{ast.unparse(node)}` with `{ast.unparse(direct)}`"
        found.append(
            Finding(
                "introspection",
                node,
                f"{builtin}() looks attributes up out of the gate's sight",
                instead,
            )
        )
    if builtin == "type" and (len(node.args) != 1 or node.keywords):
        found.append(
            Finding(
                "introspection",
                node,
                "type() with three arguments builds a class out of the gate's sight",
                "write a class statement, or compare dtypes (x.dtype == torch.float32)",
            )
        )
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
        template = func.value
        text = template.value if isinstance(template, ast.Constant) else None
        if not isinstance(text, str) or _format_reaches_attributes(text):
            found.append(
                Finding(
                    "introspection",
                    node,
                    "str.format reads attributes of its arguments ({0.attr})",
                    "use a literal template with plain fields, or an f-string",
                )
            )
    return found


def _plain_lookup(node: ast.Call) -> bool:
    """``hasattr(obj, "name")`` with a literal name the attribute rules allow: no other
    spelling asks whether ``obj.name`` exists (try/except is refused), and it hands back
    only a bool (getattr hands back the object: write ``obj.name``)."""
    if len(node.args) != 2 or node.keywords:
        return False
    name = node.args[1]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return False
    return name.value.isidentifier() and not reported_by_attribute_rules(name.value)


def precision_findings(
    node: ast.Call, path: str | None, constructors: frozenset[str] = frozenset()
) -> list[Finding]:
    """``path``: the callee's resolved path when it is an attribute of an imported module;
    ``constructors``: the kernel languages' calls that make a dtype from a value."""
    found: list[Finding] = []
    given = [*node.args, *(k.value for k in node.keywords)]
    literal = all(isinstance(value, ast.Constant) for value in given)
    retyped = isinstance(node.func, ast.Attribute) and node.func.attr == "type" and given
    named = all(isinstance(v, ast.Constant) or dotted_name(v) for v in given)
    if (path in DTYPE_CONSTRUCTORS | constructors and not literal) or (retyped and not named):
        found.append(
            Finding(
                "precision_downgrade",
                node,
                "a dtype built at run time (`tl.dtype(name)`, `.type(name)`) hides its precision",
                "name dtypes literally (tl.float32, torch.float32)",
            )
        )
    for keyword in node.keywords:
        allowed = FULL_PRECISION_DOT.get(keyword.arg or "")
        value = keyword.value
        if allowed and not (isinstance(value, ast.Constant) and value.value in allowed):
            found.append(
                Finding(
                    "precision_downgrade",
                    value,
                    f"`{keyword.arg}`: tf32 rounds fp32 inputs to 10 mantissa bits",
                    f'replace `{keyword.arg}={ast.unparse(value)}` with `input_precision="ieee"`',
                )
            )
    return found


def _format_reaches_attributes(text: str) -> bool:
    """Whether a str.format template reads attributes or items of its arguments
    (``{0.__class__}``, ``{0[key]}``), nested format specs included."""
    try:
        fields = list(string.Formatter().parse(text))
    except ValueError:
        return True
    return any(
        "." in (field or "") or "[" in (field or "") or _format_reaches_attributes(spec or "")
        for _, field, spec, _ in fields
    )
