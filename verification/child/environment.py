"""What judged a check: the device, its driver and the software versions, for each report
(benchmark cards print them beside the numbers).

Child side: torch is imported where it is used (the judge has it loaded); each backend
says its own DSL's versions (``Backend.versions``).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

from kernelflow.verification.backends import Backend, UnknownBackend
from kernelflow.verification.backends import backend as find_backend

__all__ = ["environment"]

# The NVIDIA kernel module says its version here; the PID namespace's fresh /proc shows it.
_NVIDIA_VERSION = Path("/proc/driver/nvidia/version")


def environment(device: str, backend: str = "") -> dict[str, str]:
    """Device name, driver and versions in words (empty values left out): the backend's
    and those of the DSLs it borrows; on the CPU, the processor and how the backend's
    kernels run there (on the threads the check computes with, or as it says)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    dsls = _backends(backend)
    for dsl in dsls:
        found.update(dsl.versions())
    if device == "cuda":
        found["device_name"] = torch.cuda.get_device_name()
        found["cuda"] = str(torch.version.cuda or "")
        found["driver"] = _nvidia_driver()
    else:
        count = torch.get_num_threads()
        threads = f"{count} thread" + ("s" if count != 1 else "")
        runs = (dsls[0].cpu_runs if dsls else "") or threads
        found["device_name"] = f"cpu ({_cpu_model()}; {runs})"
    return {key: value for key, value in found.items() if value}


def _backends(name: str) -> list[Backend]:
    """The backend called ``name`` and those it borrows from (none for no known name)."""
    try:
        judge = find_backend(name) if name else None
    except UnknownBackend:
        judge = None
    if judge is None:
        return []
    return [judge, *(find_backend(other) for other in judge.borrows)]


def _cpu_model() -> str:
    """The processor's model name (/proc/cpuinfo), else its architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()


def _nvidia_driver() -> str:
    try:
        text = _NVIDIA_VERSION.read_text()
    except OSError:
        return ""
    match = re.search(r"Kernel Module\s+(\S+)", text)
    return match.group(1) if match else ""
