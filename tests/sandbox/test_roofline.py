"""The roofline the verifier records beside a timed candidate (docs/verifier.md,
"Speed-of-light"): the reference's work and least traffic, the machine's peaks measured
here, and the classification they give. Run in this process: the judge runs the same
functions in the sandbox."""

from __future__ import annotations

import pytest
import torch

from kernelflow.verification.child.roofline import (
    copy_bandwidth_gbs,
    count_flops,
    float_dtype,
    moved_bytes,
    peak_gflops,
    roofline,
)


class Add(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class Linear(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


@pytest.fixture(scope="module")
def peaks() -> tuple[float, float]:
    return copy_bandwidth_gbs("cpu"), peak_gflops("cpu", torch.float32)


def test_an_elementwise_op_is_memory_bound_and_a_matmul_compute_bound(
    peaks: tuple[float, float],
) -> None:
    bandwidth, compute = peaks
    a, b = torch.randn(1 << 22), torch.randn(1 << 22)
    add = Add()
    flops = count_flops(add, [a, b])
    moved = moved_bytes(add, [a, b], add(a, b))
    assert flops == 0 and moved == 3 * 4 * (1 << 22)  # two inputs, one output
    assert roofline(flops, moved, bandwidth, compute, 1.0)["bound"] == "memory"

    n = 1024
    linear, x = Linear(n), torch.randn(n, n)
    flops = count_flops(linear, [x])
    moved = moved_bytes(linear, [x], linear(x))
    assert flops == 2 * n**3
    assert moved == 3 * 4 * n * n  # the input, the weight (a parameter) and the output
    # n / 6 FLOP a byte: far above any CPU's balance of peak compute to bandwidth.
    assert roofline(flops, moved, bandwidth, compute, 1.0)["bound"] == "compute"


def test_the_attainable_time_is_the_slower_of_the_two_limits() -> None:
    found = roofline(flops=2e9, moved=1.2e7, peak_gbs=10.0, peak_gflops=100.0, candidate_ms=40.0)
    # Compute: 2e9 / 1e11 = 20 ms; memory: 1.2e7 / 1e10 = 1.2 ms.
    assert found["bound"] == "compute"
    assert found["attainable_ms"] == pytest.approx(20.0)
    assert found["sol_fraction"] == pytest.approx(0.5)
    slow_memory = roofline(
        flops=0.0, moved=1e9, peak_gbs=10.0, peak_gflops=100.0, candidate_ms=400.0
    )
    assert slow_memory["bound"] == "memory" and slow_memory["sol_fraction"] == pytest.approx(0.25)


def test_an_op_the_counter_cannot_follow_gives_no_roofline() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("not this op")

    assert count_flops(broken, [torch.randn(4)]) is None


def test_the_probe_runs_in_the_inputs_floating_dtype() -> None:
    assert float_dtype([torch.arange(3), torch.randn(2, dtype=torch.float64)]) == torch.float64
    assert float_dtype([torch.arange(3)]) == torch.float32
