"""Kernel search over the workflow and the verifier: strategies (best-of-N, evolution,
refinement tree) whose every candidate is a task in the log, and the driver that runs
them (``kernelflow bench``). A search's state is a projection of the log
(``kernelflow.projections.search``), so a search killed at any point resumes exactly."""
