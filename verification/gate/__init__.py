"""The static reward-hack gate (docs/verifier.md, "The static gate"): pure ``ast`` rules a
candidate must satisfy before it runs. The walker (:mod:`.walker`) and the rules every
backend shares live here; what a kernel DSL adds is its backend's
(:mod:`kernelflow.verification.backends`).

Daemon side only: a sandbox never imports the gate.
"""

from kernelflow.verification.gate.checks import Violation
from kernelflow.verification.gate.walker import MAX_VIOLATIONS, check_candidate, gate_findings

__all__ = ["MAX_VIOLATIONS", "Violation", "check_candidate", "gate_findings"]
