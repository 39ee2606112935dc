"""Shared fixtures: real clusters come from ``distributed.utils_test``."""

pytest_plugins = ["distributed.utils_test"]
