"""The shape of the code, checked on its source: one namespace, layers that depend one way,
no import cycles (imports inside functions count), no module too long to read."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Each installed package and the repository folder it comes from (pyproject's package-dir).
LAYERS = {
    "kernelflow.common": "common",
    "kernelflow.events": "events",
    "kernelflow.sandbox": "sandbox",
    "kernelflow.verification": "verification",
    "kernelflow.llm": "llm",
    "kernelflow.tools": "tools",
    "kernelflow.projections": "projections",
    "kernelflow.workflows": "workflows",
    "kernelflow.actors": "actors",
    "kernelflow.telemetry": "telemetry",
    "kernelflow": "kernelflow",
}
# What each layer may import of kernelflow (docs/architecture.md, "Layers"): the CLI on
# top; telemetry watches the actors; the actors use the LLM providers, the tools and the
# verification engine, which runs candidates in the sandbox; the sandbox imports nothing of
# kernelflow, so that what runs candidate code is small enough to read; common holds what
# every layer may use (the plugin loader, secret scrubbing, parsing source).
_BASE = {"kernelflow.common"}
MAY_IMPORT = {
    "kernelflow.common": _BASE,
    "kernelflow.events": _BASE | {"kernelflow.events"},
    "kernelflow.sandbox": {"kernelflow.sandbox"},
    "kernelflow.workflows": _BASE | {"kernelflow.workflows", "kernelflow.events"},
    "kernelflow.projections": _BASE
    | {"kernelflow.projections", "kernelflow.workflows", "kernelflow.events"},
    "kernelflow.verification": _BASE
    | {"kernelflow.verification", "kernelflow.sandbox", "kernelflow.events"},
    "kernelflow.llm": _BASE | {"kernelflow.llm", "kernelflow.projections", "kernelflow.events"},
    "kernelflow.tools": _BASE
    | {
        "kernelflow.tools",
        "kernelflow.verification",
        "kernelflow.sandbox",
        "kernelflow.projections",
        "kernelflow.events",
    },
    "kernelflow.actors": set(LAYERS) - {"kernelflow", "kernelflow.telemetry"},
    "kernelflow.telemetry": set(LAYERS) - {"kernelflow"},
    "kernelflow": set(LAYERS),
}
# The candidate's side of a check (the process that imports candidate code, and the judge
# forked beside it) imports nothing of kernelflow but the sandbox and these.
CANDIDATE_SIDE = "kernelflow.verification.child"
CANDIDATE_SIDE_MAY_IMPORT = (
    "kernelflow.verification.child",
    "kernelflow.verification.backends",
    "kernelflow.sandbox",
)
MAX_LINES = 700


def modules() -> dict[str, Path]:
    """Every module of the installed package, by its dotted name."""
    found: dict[str, Path] = {}
    for package, folder in LAYERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """What a module imports, anywhere in it (``from a import b`` names ``a`` and ``a.b``)."""
    names: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def layer_of(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {
        name: {n for n in imported_names(name, path) if n in found and n != name}
        for name, path in found.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other_in_a_circle() -> None:
    assert cycles(import_graph()) == []


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        for target in targets
        if layer_of(target) not in MAY_IMPORT[layer_of(module)]
    ]
    assert wrong == []


def test_the_candidate_s_side_imports_only_the_sandbox_and_the_backends() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.startswith(CANDIDATE_SIDE)
        for target in targets
        if not target.startswith(CANDIDATE_SIDE_MAY_IMPORT)
    ]
    assert wrong == []


# The rooms of the ``kernelflow`` package (docs/architecture.md, "Rooms of the kernelflow
# package"), lowest first: the host (settings, the embedded server, the client runtime),
# the library APIs a user's program imports (Task, Rollout, agentic_rollout, search,
# rewards, integrations, the offline tools), and the CLI with its dashboard on top.
ROOMS = ("kernelflow.host", "kernelflow", "kernelflow.cli")


def room_of(module: str) -> int:
    if module == "kernelflow.__main__":  # python -m kernelflow: the CLI's second door
        return ROOMS.index("kernelflow.cli")
    return max(
        (i for i, room in enumerate(ROOMS) if module == room or module.startswith(room + ".")),
        key=lambda i: len(ROOMS[i]),
    )


def test_the_rooms_of_the_kernelflow_package_depend_one_way() -> None:
    """The CLI may use the library and the host; the library the host; the host neither:
    what a library module, the dashboard or a command share lives in the lower room."""
    wrong = [
        f"{module} ({ROOMS[room_of(module)]}) imports {target} ({ROOMS[room_of(target)]})"
        for module, targets in import_graph().items()
        if layer_of(module) == "kernelflow"
        for target in targets
        if layer_of(target) == "kernelflow" and room_of(target) > room_of(module)
    ]
    assert wrong == []


@pytest.mark.parametrize("folder", sorted(LAYERS.values()))
def test_nothing_imports_a_layer_by_its_folder_name(folder: str) -> None:
    """The folders install as ``kernelflow.<folder>``; a bare ``import events`` only works
    from a checkout's root and breaks in an installed wheel."""
    bare = set(LAYERS.values()) - {"kernelflow"}
    sources = [p for d in (*LAYERS.values(), "tests", "bench") for p in (REPO / d).rglob("*.py")]
    wrong = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sources
        if path.parts[len(REPO.parts)] == folder
        for name in imported_names("x.y", path)
        if name.split(".")[0] in bare
    ]
    assert wrong == []


def test_no_source_module_is_over_700_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


# The backends' modules that belong to no DSL: the seam itself (docs/extending.md,
# "A new verifier backend (a kernel DSL)"). Any other module of the package belongs to the
# backend its name starts with; the load_inline extension modules are the cpp backend's.
BACKENDS = "kernelflow.verification.backends"
NEUTRAL_BACKEND_MODULES = {BACKENDS, *(f"{BACKENDS}.{m}" for m in ("base", "language", "registry"))}


def dsl_of(module: str) -> str | None:
    """The backend whose DSL a module of the backends package belongs to (None: neutral)."""
    if module in NEUTRAL_BACKEND_MODULES or not module.startswith(BACKENDS + "."):
        return None
    stem = module.removeprefix(BACKENDS + ".")
    return "cpp" if stem.startswith("extension") else stem.split("_")[0]


def test_the_gate_imports_no_backend_s_dsl() -> None:
    """The gate's walker knows no DSL: it asks the backend (and the kernel languages it
    hands over) through the neutral seam only."""
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.startswith("kernelflow.verification.gate")
        for target in targets
        if dsl_of(target) is not None
    ]
    assert wrong == []


def test_a_backend_imports_another_s_dsl_only_where_it_borrows_it() -> None:
    from kernelflow.verification.backends import backend

    wrong = [
        f"{module} imports {target} ({dsl_of(module)!r} does not borrow {dsl_of(target)!r})"
        for module, targets in import_graph().items()
        if (owner := dsl_of(module)) is not None
        for target in targets
        if (other := dsl_of(target)) not in (None, owner) and other not in backend(owner).borrows
    ]
    assert wrong == []


def test_every_backend_module_belongs_to_a_registered_backend_or_to_none() -> None:
    from kernelflow.verification.backends import backend_names

    owners = {dsl_of(module) for module in modules()} - {None}
    assert owners <= set(backend_names())


# ---------------------------------------------------------------------- one door to NATS
# (issue 48, item 1; docs/architecture.md, "The event log and its ports")

# The module that names every subject, stream and bucket of kernelflow's NATS.
SUBJECTS = "kernelflow.events.subjects"
# Streams and buckets, by the names JetStream knows them by.
_STREAMS_AND_BUCKETS = ("KF_EVENTS", "KF_CMD", "KF_EXTENSIONS", "KF_READMODEL")


def spelled_names(path: Path) -> list[str]:
    """The string literals of a module (docstrings left out) that spell a subject of
    kernelflow's (``kf.``), an object store's (``$O.``, ``OBJ_``) or a stream or bucket
    name, with their lines."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and (
            node.value.startswith(("kf.", "$O.", "OBJ_"))
            or node.value.split(".")[0] in _STREAMS_AND_BUCKETS
        )
    ]


def test_the_spelling_rule_finds_names_but_not_docstrings(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        '"""kf.ev.x is here"""\nA = "kf.query.x"\nB = f"$O.{A}"\nC = "KF_CMD"\nD = "KF_LLM"\n'
    )
    assert sorted(spelled_names(source)) == [
        "m.py:2: 'kf.query.x'",
        "m.py:3: '$O.'",
        "m.py:4: 'KF_CMD'",
    ]


def test_every_subject_stream_and_bucket_is_named_in_events_subjects() -> None:
    """Only ``events/subjects.py`` spells kernelflow's subjects, streams and buckets:
    what names one (a role's permissions, a consumer's filter, a test) takes it from
    there."""
    wrong = [
        f"{path.parent.name}/{line}"
        for name, path in modules().items()
        if name != SUBJECTS
        for line in spelled_names(path)
    ]
    assert wrong == []


# Who may import the NATS client, and why: the adapters of the ports (``events/``), the
# bridge that owns the connection, and the embedded server's host code (it runs
# nats-server and writes its configuration).
MAY_IMPORT_NATS = {
    "kernelflow.actors.bridge",
    "kernelflow.host.nats_server",
    "kernelflow.host.nats_auth",
}
# Who may ask JetStream itself (``.jetstream``): the adapters and the bridge (which makes
# them on its connection).
MAY_ASK_JETSTREAM = {"kernelflow.actors.bridge"}


def _outside_the_adapters() -> dict[str, Path]:
    return {
        name: path
        for name, path in modules().items()
        if not (name == "kernelflow.events" or name.startswith("kernelflow.events."))
    }


def nats_importers(found: dict[str, Path]) -> set[str]:
    """The modules of ``found`` that import the NATS client (anywhere in them)."""
    return {
        name
        for name, path in found.items()
        if any(n == "nats" or n.startswith("nats.") for n in imported_names(name, path))
    }


def jetstream_askers(found: dict[str, Path]) -> set[str]:
    """The modules of ``found`` that ask anything for ``.jetstream``."""
    return {
        name
        for name, path in found.items()
        if any(
            isinstance(node, ast.Attribute) and node.attr == "jetstream"
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
        )
    }


def test_the_nats_rules_find_side_doors_but_not_words(tmp_path: Path) -> None:
    door = tmp_path / "door.py"
    door.write_text("from nats.js import api\n\nasync def f(nc):\n    return nc.jetstream()\n")
    words = tmp_path / "words.py"
    words.write_text('"""Not through nats.jetstream: the port."""\nJETSTREAM = "jetstream"\n')
    found = {"kernelflow.actors.door": door, "kernelflow.actors.words": words}
    assert nats_importers(found) == {"kernelflow.actors.door"}
    assert jetstream_askers(found) == {"kernelflow.actors.door"}


def test_only_the_adapters_the_bridge_and_the_server_s_host_code_import_nats() -> None:
    assert nats_importers(_outside_the_adapters()) <= MAY_IMPORT_NATS


def test_only_the_adapters_and_the_bridge_ask_jetstream_itself() -> None:
    assert jetstream_askers(_outside_the_adapters()) <= MAY_ASK_JETSTREAM


def test_the_bridge_s_log_is_the_port() -> None:
    from kernelflow.actors.bridge import Bridge
    from kernelflow.events.port import EventLogPort

    assert typing.get_type_hints(Bridge.log.fget)["return"] is EventLogPort


def test_the_memory_bridge_fakes_no_nats() -> None:
    """``MemoryBridge`` runs actors on the ports' memory adapters: no stand-in for a NATS
    connection, and nothing that silences the type checker about one."""
    path = modules()["kernelflow.actors.memory_bridge"]
    assert "type: ignore" not in path.read_text()
    assert not any(n.startswith("nats") for n in imported_names("x.y", path))


# The vocabulary of how things are set up (docs/architecture.md, "Names"): ``Settings`` is
# the process's environment, one class; a component is built from a ``...Config``; what one
# call or request asks for is an ``...Options``.
VOCABULARY_SUFFIXES = ("Settings", "Config", "Options")
OPTIONS = {"kernelflow.llm.config.OpenAIOptions", "kernelflow.projections.flow_grpo.GrpoOptions"}


def classes_named(suffixes: tuple[str, ...]) -> set[str]:
    found = set()
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(suffixes):
                found.add(f"{name}.{node.name}")
    return found


def test_settings_config_and_options_each_keep_one_meaning() -> None:
    named = classes_named(VOCABULARY_SUFFIXES)
    assert {n for n in named if n.endswith("Settings")} == {"kernelflow.host.settings.Settings"}
    assert {n for n in named if n.endswith("Options")} == OPTIONS
    assert len({n for n in named if n.endswith("Config")}) >= 10  # the rule reads them all
