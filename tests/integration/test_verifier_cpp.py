"""The ``cpp`` backend: C++ kernels built with ``torch.utils.cpp_extension.load_inline``,
checked and timed on the CPU, through the real verifier (real compiler, real sandbox).

The compiled tests use the run's extension cache (each run of the suite compiles afresh:
a fused fast GELU, a deliberately slow one, a broken one, once for every test that
checks them); the gate's rules run without compiling.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import threading
from pathlib import Path

import pytest

from kernelflow.projections.speedups import interval_conclusive
from kernelflow.verification import engine
from kernelflow.verification.backends.extension import (
    LOAD_INLINE,
    ExtensionSpec,
    wanted_extensions,
)
from kernelflow.verification.child.build import compiler_errors
from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.extensions import (
    build_locks,
    install,
    planned_extensions,
    store,
    toolchain,
    unbuilt,
)
from kernelflow.verification.gate import check_candidate
from tests.conftest import cli_env, run_cli

ROOT = Path(__file__).resolve().parents[2]
TASK = (ROOT / "examples/kernelbench/level1/12_tanh_gelu.py").read_text()
FUSED = (ROOT / "examples/candidates/cpp/tanh_gelu_fused.py").read_text()
SLOW = (ROOT / "examples/candidates/cpp/tanh_gelu_slow.py").read_text()
ATEN = (ROOT / "examples/candidates/cpp/aten_gelu.py").read_text()


def rules(source: str) -> set[str]:
    return {v.rule for v in check_candidate(source, backend="cpp", task_source=TASK)}


# --------------------------------------------------------------------------- gate


@pytest.mark.parametrize("source", [FUSED, SLOW], ids=["fused", "slow"])
def test_gate_passes_correct_cpp_kernels(source: str) -> None:
    assert rules(source) == set()


def test_gate_refuses_aten_doing_the_work() -> None:
    assert rules(ATEN) == {"torch_compute"}
    tensor_method = FUSED.replace(
        "torch::Tensor output = torch::empty_like(input);",
        "torch::Tensor output = input.tanh();",
    )
    assert rules(tensor_method) == {"torch_compute"}


def test_gate_refuses_the_cpp_kernels_under_the_triton_backend() -> None:
    found = {v.rule for v in check_candidate(FUSED, backend="triton", task_source=TASK)}
    assert "no_kernel" in found


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        # State that outlives a call: a result cache in C++.
        (("const float k = 0.79", "static float k = 0.79"), "caching"),
        (("#include <cmath>", "#include <cmath>\nfloat last_sum = 0;"), "caching"),
        (("#include <cmath>", "#include <fstream>"), "forbidden_import"),
        (("#include <cmath>", "#include <thread>\n#include <cmath>"), "forbidden_import"),
        (
            ("const int64_t block", "std::thread t([]{}); t.join();\n    const int64_t block"),
            "module_escape",
        ),
        (("const int64_t block", 'getenv("HOME");\n    const int64_t block'), "file_io"),
        (
            ("const float v = in[i];", "const float v = (float)(at::Half)in[i];"),
            "precision_downgrade",
        ),
        # What the verifier cannot read it cannot build.
        (('name="tanh_gelu_fused"', 'name="tanh_gelu_" + str(id(0))'), "no_kernel"),
        (
            ('extra_ldflags=["-fopenmp"]', 'extra_ldflags=["-fopenmp"], build_directory="/tmp"'),
            "no_kernel",
        ),
        (('"-ffast-math"', '"-I/etc"'), "no_kernel"),
        (('"-ffast-math"', '"-fplugin=/tmp/p.so"'), "no_kernel"),
    ],
    ids=[
        "static",
        "global",
        "fstream",
        "thread_header",
        "std_thread",
        "getenv",
        "half",
        "computed_name",
        "build_directory",
        "include_path",
        "plugin",
    ],
)
def test_gate_rules_for_cpp_sources(edit: tuple[str, str], rule: str) -> None:
    assert edit[0] in FUSED
    assert rule in rules(FUSED.replace(*edit))


def test_gate_refuses_building_in_forward() -> None:
    lazy = FUSED.replace(
        "        return gelu.tanh_gelu(x)",
        '        ext = load_inline(name="late", cpp_sources=SOURCE, functions=["tanh_gelu"])\n'
        "        return ext.tanh_gelu(x)",
    )
    assert "file_io" in rules(lazy)


def test_extensions_are_read_from_module_strings_and_joins() -> None:
    source = FUSED.replace("cpp_sources=SOURCE,", "cpp_sources=HEADER + SOURCE,").replace(
        'SOURCE = r"""', 'HEADER = "// generated\\n"\nSOURCE = r"""'
    )
    (spec,) = wanted_extensions(source)
    assert spec.cpp_sources[0].startswith("// generated\n")
    assert spec.functions == ("tanh_gelu",)
    assert spec.extra_cflags == ("-O3", "-march=native", "-ffast-math", "-fopenmp")
    # Bound twice: not a constant the verifier can trust to be what runs.
    rebound = source + '\nHEADER = "#define float double\\n"\n'
    assert wanted_extensions(rebound) == []
    assert "no_kernel" in rules(rebound)
    assert LOAD_INLINE == "torch.utils.cpp_extension.load_inline"


def test_compiler_errors_are_the_first_errors_with_their_lines() -> None:
    noise = "\n".join(
        f"/usr/include/c++/12/bits/stl.h:{i}: note: candidate {i}" for i in range(400)
    )
    output = (
        "Error building extension 'kf_ext_1':\n[1/2] c++ -MMD ... -c main.cpp -o main.o\n"
        "FAILED: main.o\n"
        "/tmp/x/extensions/kf_ext_1/main.cpp: In function 'at::Tensor f(at::Tensor)':\n"
        "/tmp/x/extensions/kf_ext_1/main.cpp:12:20: error: 'undeclared' was not declared in "
        "this scope\n"
        "   12 |     float v = undeclared;\n"
        "      |               ^~~~~~~~~~\n"
        + noise
        + "\nninja: build stopped: subcommand failed.\n"
    )
    errors = compiler_errors(output, "my_ext")
    assert errors[0] == "building the extension 'my_ext' failed:"
    assert errors[1].startswith("main.cpp:12:20: error: 'undeclared' was not declared")
    assert "float v = undeclared;" in errors[1]
    assert "/tmp/x" not in "\n".join(errors)
    assert sum(len(e) for e in errors) < 1000


# --------------------------------------------------------------------------- the cache


def _spec(name: str) -> ExtensionSpec:
    return ExtensionSpec(name=name, cpp_sources=(f"// {name}",), functions=("f",))


def test_the_cache_stores_whole_entries_and_installs_them(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (ext,) = planned_extensions([_spec("a")], cache, "gcc 12")
    assert planned_extensions([_spec("a")], cache, "gcc 13")[0].entry != ext.entry
    assert unbuilt([ext]) == [ext]
    built = tmp_path / "built"
    (built / ext.module).mkdir(parents=True)
    (built / ext.module / f"{ext.module}.so").write_bytes(b"\x7fELF built")
    with build_locks([ext]):
        store([ext], built)
        store([ext], built)  # a second store (another verifier's) keeps the first
    assert unbuilt([ext]) == []
    assert sorted(p.name for p in cache.iterdir()) == [ext.entry.name, f"{ext.entry.name}.lock"]
    candidate = tmp_path / "candidate"
    install([ext], candidate)
    manifest = json.loads((candidate / "extensions/manifest.json").read_text())
    assert [ExtensionSpec.from_json(entry["spec"]) for entry in manifest] == [ext.spec]
    assert manifest[0]["library"] == f"{ext.module}/{ext.module}.so"
    assert (candidate / "extensions" / manifest[0]["library"]).read_bytes() == b"\x7fELF built"


def test_a_build_lock_makes_the_second_verifier_wait(tmp_path: Path) -> None:
    (ext,) = planned_extensions([_spec("b")], tmp_path, "gcc 12")
    order: list[str] = []
    inside = threading.Event()

    def second() -> None:
        inside.wait(10)
        with build_locks([ext]):
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with build_locks([ext]):
        inside.set()
        thread.join(0.3)  # the second verifier cannot get the lock meanwhile
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]


# --------------------------------------------------------------------------- compiled


@pytest.fixture(scope="module")
def config(extension_cache: Path) -> VerifierConfig:
    cache = extension_cache
    # One thread: the suite's other worker shares this machine's cores, and OpenMP's
    # barriers turn a core taken away into a timeslice's wait; one thread shares fairly.
    return VerifierConfig(extension_cache=str(cache), trials=2, timeout_s=240.0, threads=1)


@pytest.fixture(scope="module")
def fused(config: VerifierConfig):  # type: ignore[no-untyped-def]
    return verify(TASK, FUSED, backend="cpp", config=config)


def test_a_fused_cpp_kernel_passes_faster_than_eager(fused) -> None:  # type: ignore[no-untyped-def]
    assert fused.verdict == "pass", fused.feedback
    assert fused.device == "cpu" and fused.backend == "cpp"
    assert fused.speedup is not None and fused.speedup > 1.0, fused.timing
    timing = fused.timing
    assert timing is not None
    low, high = timing.candidate_ci_ms
    assert low <= timing.candidate_ms["median"] <= high
    assert timing.speedup_ci95[0] <= fused.speedup <= timing.speedup_ci95[1]
    # Whether the figure says anything is the rule on that interval, decided by the judge
    # after its rounds (6, and more while it was inconclusive).
    assert fused.speedup_conclusive == interval_conclusive(timing.speedup_ci95)
    assert timing.rounds >= 6 and timing.speedups["eager"] == fused.speedup
    assert timing.threads == 1
    assert timing.input_copies > 1  # its inputs are smaller than twice the cache
    assert "1 thread)" in fused.environment["device_name"]


def test_a_second_check_of_the_same_source_compiles_nothing(
    config: VerifierConfig, fused, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    assert fused.passed
    (entry,) = planned_extensions(
        wanted_extensions(FUSED), Path(str(config.extension_cache)), toolchain(config.python)
    )
    built = (entry.library.stat().st_mtime_ns, entry.library.read_bytes())
    jobs: list[object] = []
    real_run_job = engine._run_job

    def counted(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        jobs.append(job)
        return real_run_job(job, *args, **kwargs)

    monkeypatch.setattr(engine, "_run_job", counted)
    again = verify(TASK, FUSED, backend="cpp", config=config)
    assert again.verdict == "pass"
    assert [bool(job.get("build")) for job in jobs] == [False]  # one job: the check itself
    assert (entry.library.stat().st_mtime_ns, entry.library.read_bytes()) == built


def test_a_slow_correct_kernel_passes_with_a_lower_speedup(config: VerifierConfig, fused) -> None:  # type: ignore[no-untyped-def]
    # Written in the world's form: its own PYBIND11_MODULE binding, no functions=, the
    # template's empty flags, the extension kept on self.
    (spec,) = wanted_extensions(SLOW)
    assert spec.functions == () and spec.exposed() == ("tanh_gelu",)
    slow = verify(TASK, SLOW, backend="cpp", config=config)
    assert slow.verdict == "pass", slow.feedback
    assert slow.speedup is not None and fused.speedup is not None
    assert slow.speedup < fused.speedup


def test_aten_gelu_is_refused_before_anything_compiles(config: VerifierConfig) -> None:
    report = verify(TASK, ATEN, backend="cpp", config=config)
    assert report.verdict == "rejected_static"
    assert "at::gelu" in report.feedback


def test_a_compile_error_is_short_feedback_with_the_line_and_not_compiled_again(
    config: VerifierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = FUSED.replace("const float v = in[i];", "const float v = in[i] + undeclared;")
    report = verify(TASK, broken, backend="cpp", config=config)
    assert report.verdict == "compile_error", report.feedback
    assert "undeclared" in report.feedback and "error" in report.feedback
    assert len(report.feedback) < 2000
    assert "kernelflow-verify" not in report.feedback  # no sandbox paths
    jobs: list[object] = []
    real_run_job = engine._run_job

    def counted(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        jobs.append(job)
        return real_run_job(job, *args, **kwargs)

    monkeypatch.setattr(engine, "_run_job", counted)
    again = verify(TASK, broken, backend="cpp", config=config)
    # The compiler said why, with the line: the same source fails the same way, unbuilt.
    assert (again.verdict, again.feedback) == (report.verdict, report.feedback)
    assert jobs == []


def test_an_extension_other_than_the_one_built_is_refused_at_runtime(
    config: VerifierConfig,
) -> None:
    # With the gate off, a name computed at runtime: the verifier builds nothing it
    # cannot read, and the sandbox's load_inline loads only what the verifier built.
    computed = FUSED.replace('name="tanh_gelu_fused"', 'name="tanh_gelu_" + str(len("ab"))')
    report = verify(
        TASK,
        computed,
        backend="cpp",
        config=VerifierConfig(extension_cache=config.extension_cache, static_gate=False, trials=1),
    )
    assert report.verdict == "rejected_runtime", report.feedback
    assert "other than the one the verifier built" in report.feedback


def test_the_readmes_cpp_example_runs_as_printed(
    config: VerifierConfig, fused, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    assert fused.passed
    (line,) = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("kernelflow verify ") and "--backend cpp" in line
    ]
    # The data dir's extension cache holds what the module's checks built: the CLI finds
    # the kernel built (the cache is keyed by content, not by who built it).
    data = tmp_path / "data"
    shutil.copytree(str(config.extension_cache), data / "extensions")
    env = cli_env(KF_DATA_DIR=str(data), KF_VERIFY_THREADS="1")
    done = run_cli(*shlex.split(line)[1:], env=env)
    assert done.returncode == 0, done.stderr
    first, timing = done.stdout.splitlines()[:2]
    # The policy on the verdict's line; the speedup a figure, or in words where the
    # machine's load left it inconclusive.
    assert first.startswith("PASS on cpu (cpp) in ") and " under policy strict: " in first
    assert re.search(r"; speedup (\d+\.\d\dx|inconclusive \(between \S+x and \S+x\): )", first)
    assert timing.startswith("  timing: candidate ") and "95 % intervals" in timing
    assert " rounds of " in timing
    # How far from the machine's limit, under the timing (docs/verifier.md).
    assert re.search(r"\n  speed-of-light: \d+% \(memory-bound: \S+ ms attainable ", done.stdout)


def test_a_timed_kernel_says_its_fraction_of_speed_of_light(fused) -> None:  # type: ignore[no-untyped-def]
    """An elementwise op (tanh-GELU) is memory-bound: torch's FLOP counter counts no
    matmul work in it, and its least traffic is its input and output, once each."""
    limit = fused.roofline
    assert limit is not None and limit.bound == "memory", fused.timing
    # Timed on the first shape set checked: the task's input, float32 (12_tanh_gelu.py:
    # batch_size x dim, 4096 x 4096 unless the set scales them down).
    sizes = {"batch_size": 4096, "dim": 4096, **fused.shapes[0]}
    x = 4 * sizes["batch_size"] * sizes["dim"]
    assert limit.bytes == 2 * x and limit.flops == 0
    assert limit.attainable_ms == pytest.approx(limit.bytes / (limit.peak_gbs * 1e6), rel=1e-2)
    median = fused.timing.candidate_ms["median"]
    assert fused.sol_fraction == pytest.approx(limit.attainable_ms / median)
    assert limit.peak_gbs > 0 and limit.peak_gflops > 0
