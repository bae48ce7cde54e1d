"""Entry-point plugins, as every registry of kernelflow loads them (agent kinds, kernel
backends, search strategies, tools): once, the first time a name is asked for that is not
registered already; a broken plugin is reported, never fatal."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kernelflow.common.suggest import did_you_mean


def load_plugins(
    group: str,
    problem: Callable[[str, object], str | None],
    register: Callable[[str, object], object],
    *,
    label: str = "plugin",
    on_problem: Callable[[str, str], object] | None = None,
) -> tuple[str, ...]:
    """Load the entry points of ``group``: ``problem(name, obj)`` says why an object is not
    one of the group's plugins (None: it is; an exception it raises counts as the plugin
    failing to load), ``register(name, obj)`` registers it. The problems, one line each
    (``"<label> 'name' (module:object) why"``); ``on_problem(name, line)`` also hears of
    each, by the entry point's name."""
    # Imported here: a process that only resolves built-ins never scans the distributions.
    from importlib.metadata import entry_points

    errors = []
    for ep in entry_points(group=group):
        try:
            obj = ep.load()
            why = problem(ep.name, obj)
        except Exception as exc:  # any error of a third-party import is the plugin's
            why = f"failed to load: {type(exc).__name__}: {exc}"
        if why is None:
            register(ep.name, obj)
            continue
        errors.append(f"{label} {ep.name!r} ({ep.value}) {why}")
        if on_problem is not None:
            on_problem(ep.name, errors[-1])
    return tuple(errors)


def unknown_name(what: str, name: str, known: Iterable[str], problems: Iterable[str]) -> str:
    """The message for a name no registered object (or plugin) has, with the known name
    it is closest to, if one is close."""
    broken = "; ".join(problems)
    names = sorted(known)
    return f"unknown {what} {name!r}; known: {', '.join(names)}{did_you_mean(name, names)}" + (
        f" (plugin problems: {broken})" if broken else ""
    )
