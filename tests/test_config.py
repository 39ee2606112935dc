"""The crux-dask configuration: defaults valid against the schema, schema complete."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from distributed.utils_test import async_poll_for, gen_cluster, inc

import crux_dask
from crux_dask.plugins import CruxSchedulerPlugin, CruxWorkerPlugin, config


def leaves(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        out |= leaves(value, path) if isinstance(value, dict) else {path}
    return out


def schema_leaves(schema: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out |= schema_leaves(value, path) if "properties" in value else {path}
    return out


def test_defaults_validate_against_the_schema():
    schema = yaml.safe_load(config.SCHEMA_PATH.read_text())
    jsonschema.validate(config.defaults, schema)


def test_schema_is_complete_and_every_key_is_described():
    schema = yaml.safe_load(config.SCHEMA_PATH.read_text())
    assert leaves(config.defaults) == schema_leaves(schema)

    def described(node: dict) -> None:
        for key, value in node.get("properties", {}).items():
            assert value.get("description"), key
            described(value)

    described(schema)


@pytest.mark.parametrize("make", [
    lambda: CruxWorkerPlugin(flush_interval="soon"),
    lambda: CruxWorkerPlugin(batch_size=0),
    lambda: CruxWorkerPlugin(max_buffered_events=-5),
    lambda: CruxSchedulerPlugin(apply_interval=-1),
    lambda: CruxSchedulerPlugin(park_timeout="never"),
])
def test_wrong_configuration_fails_early_with_a_clear_error(make):
    with pytest.raises(ValueError, match="crux-dask"):
        make()


@pytest.mark.parametrize("patterns", ["*.csv", [3], None])
def test_file_patterns_must_be_lists_of_globs(patterns):
    import dask

    with dask.config.set({"crux-dask.files.exclude": patterns}), pytest.raises(
            ValueError, match=r"crux-dask\.files\.exclude must be a list of glob patterns"):
        CruxWorkerPlugin()


def test_configuration_is_read_when_plugins_are_built():
    import dask

    with dask.config.set({"crux-dask.flush-interval": "250ms", "crux-dask.batch-size": 7}):
        plugin = CruxWorkerPlugin()
    assert plugin.flush_interval == 0.25 and plugin.batch_size == 7


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)])
async def test_by_default_a_worker_sends_every_two_seconds(c, s, a):
    await crux_dask.attach(c)
    plugin = a.plugins["crux"]
    assert plugin.flush_interval is None
    heartbeat = a.periodic_callbacks["heartbeat"]
    await a.heartbeat()  # the scheduler sets the heartbeat's interval by the cluster's size
    assert heartbeat.callback_time == 500
    await c.gather(c.map(inc, range(5)))
    # Events reach the scheduler with no flush asked for, slower than heartbeats.
    await async_poll_for(lambda: s.plugins["crux"].counts["events_from_workers"] > 0, 10)
    await async_poll_for(lambda: plugin._callback.callback_time == 2000, 5)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)],
             config={"crux-dask.park-timeout": "600ms"})
async def test_a_worker_sends_well_within_the_time_the_scheduler_waits_for_it(c, s, a):
    await crux_dask.attach(c)
    plugin = a.plugins["crux"]
    await a.heartbeat()
    assert a.periodic_callbacks["heartbeat"].callback_time == 500
    await async_poll_for(lambda: plugin._callback.callback_time == 300, 5)  # half of 600 ms
