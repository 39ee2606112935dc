"""The CPU seconds of each worker's process, sampled with the load.

A worker's process spends CPU besides its tasks' threads: its event loop
reports each task, sends and fetches data, runs a shuffle's comms.  The load
samples each process's CPU seconds so far; attach samples them before the
first computation it records.
"""

from __future__ import annotations

import time

from distributed import Client, LocalCluster

import crux_dask


def test_attach_samples_each_worker_s_cpu_seconds_before_the_first_run():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        crux_dask.attach(client)
        attached = time.time()
        load = crux_dask.get_load(client)
        counted = load[load["cpu_time"].notna() & (load["time"] <= attached)]
        assert set(counted["process"]) == set(client.scheduler_info()["workers"]) | {
            "scheduler"}
