"""Workflow simulator: emulation atoms, the Crux thesis's HPC workflow cases, replay.

Every case is configured so that the step on its critical path is known in
advance; that makes the simulator both a way to rehearse workflow shapes and
the ground truth the critical path is checked against.
"""

from crux_dask.sim_workflows.cases import CASES, Case, SimConfig, build_case
from crux_dask.sim_workflows.run import Fidelity, SimResult, replay, replay_graph, run_case

__all__ = ["CASES", "Case", "Fidelity", "SimConfig", "SimResult", "build_case", "replay",
           "replay_graph", "run_case"]
