"""Shared fixtures: real clusters come from ``distributed.utils_test``."""

import gc

import pytest
from distributed import Client, LocalCluster

import crux_dask

pytest_plugins = ["distributed.utils_test"]


@pytest.fixture(scope="module")
def crux_client():
    """A client of 2 worker processes x 2 threads with Crux attached, for one module's tests.

    Modules put their tests that run in-process clusters before those that use it.
    """
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        yield client


@pytest.fixture(autouse=True, scope="module")
def _heap_out_of_the_way():
    """Each module starts with the garbage of the modules before it collected, and the
    objects left frozen out of the collector's way.

    The schedulers of ``LocalCluster`` and ``gen_cluster`` run in this process: a full
    collection of a heap grown over the suite held their event loop up to 0.9 s in the
    middle of timed runs (measured with ``gc.callbacks``), as no real scheduler's is.
    """
    gc.collect()
    gc.freeze()
    yield
