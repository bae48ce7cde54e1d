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


def environment(device: str) -> dict[str, str]:
    """Device name, driver and versions in words (empty values left out)."""
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
        found["device_name"] = f"cpu ({platform.machine()}; Triton in its interpreter)"
    return {key: value for key, value in found.items() if value}


def _nvidia_driver() -> str:
    try:
        text = _NVIDIA_VERSION.read_text()
    except OSError:
        return ""
    match = re.search(r"Kernel Module\s+(\S+)", text)
    return match.group(1) if match else ""
