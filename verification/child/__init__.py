"""The verifier's sandbox process (``python -I -m kernelflow.verification.child``, see
:mod:`.__main__`), split by concern:

- judging side: :mod:`.judge` (the reference, its inputs, the trials, the verdict),
  :mod:`.compare` (outputs against the reference), :mod:`.report` (result dicts, readable
  errors, and ``write_result``, where results leave the sandbox);
- candidate-running side: :mod:`.candidate` (load, build and call ``ModelNew``),
  :mod:`.guards` (runtime guards around its calls), :mod:`.timing` (on a GPU);
- shared: :mod:`.job` (one job, phase by phase), :mod:`.loading` (modules and values),
  :mod:`.runtime` (torch and triton, preloaded and probed).

Imported only inside sandboxes: stdlib, torch, triton and numpy, and kernelflow's
sandbox and backends packages; nothing of the daemon (msgspec, nats, pykka, yaml).
"""
