"""Shared fixtures: real clusters come from ``distributed.utils_test``."""

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
