"""Entry-point plugins, as every registry of kernelflow loads them (agent kinds, kernel
backends, search strategies): once, the first time a name is asked for that is not
registered already; a broken plugin is reported, never fatal."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def load_plugins(
    group: str,
    problem: Callable[[str, object], str | None],
    register: Callable[[str, object], object],
) -> tuple[str, ...]:
    """Load the entry points of ``group``: ``problem(name, obj)`` says why an object is not
    one of the group's plugins (None: it is), ``register(name, obj)`` registers it. The
    problems, one line each."""
    # Imported here: a process that only resolves built-ins never scans the distributions.
    from importlib.metadata import entry_points

    errors = []
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
        except Exception as exc:  # any error of a third-party import is the plugin's
            errors.append(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}")
            continue
        why = problem(ep.name, obj)
        if why is not None:
            errors.append(f"plugin {ep.name!r} ({ep.value}) {why}")
            continue
        register(ep.name, obj)
    return tuple(errors)


def unknown_name(what: str, name: str, known: Iterable[str], problems: Iterable[str]) -> str:
    """The message for a name no registered object (or plugin) has."""
    broken = "; ".join(problems)
    return f"unknown {what} {name!r}; known: {', '.join(sorted(known))}" + (
        f" (plugin problems: {broken})" if broken else ""
    )
