"""What judged a check: the device, its driver and the software versions, for each report
(benchmark cards print them beside the numbers).

Child side: torch and triton are imported where they are used (the judge has them loaded).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

__all__ = ["environment"]

# The NVIDIA kernel module says its version here; the PID namespace's fresh /proc shows it.
_NVIDIA_VERSION = Path("/proc/driver/nvidia/version")


def environment(device: str, backend: str = "") -> dict[str, str]:
    """Device name, driver and versions in words (empty values left out); on the CPU, the
    processor and the threads the check computes with (``backend``: what runs there)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        pass
    if device == "cuda":
        found["device_name"] = torch.cuda.get_device_name()
        found["cuda"] = str(torch.version.cuda or "")
        found["driver"] = _nvidia_driver()
    else:
        count = torch.get_num_threads()
        threads = f"{count} thread" + ("s" if count != 1 else "")
        runs = "Triton in its interpreter" if backend == "triton" else threads
        found["device_name"] = f"cpu ({_cpu_model()}; {runs})"
    return {key: value for key, value in found.items() if value}


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
