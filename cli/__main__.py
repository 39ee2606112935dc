"""``python -m crux_dask.cli``: the ``crux-dask`` command."""

from crux_dask.cli import main

main()
