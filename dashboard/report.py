"""A standalone HTML report of the work done inside a ``with`` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["crux_report", "report_html"]


def report_html(pag: Any, title: str = "Crux report", load: Any = None,
                functions: Any = None) -> str:
    """A self-contained HTML page (Bokeh inlined) with the Crux components of ``pag``,
    the advice its ``load`` table supports (:func:`crux_dask.get_load`) and the code
    behind its prefixes, of its ``functions`` table (:func:`crux_dask.get_functions`)."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    from crux_dask.dashboard.data import static_source
    from crux_dask.dashboard.layout import crux_layout

    _, layout = crux_layout(static_source(pag, load=load, functions=functions),
                            background=False)
    return file_html(layout, INLINE, title)


@contextlib.contextmanager
def crux_report(filename: str = "crux-report.html", client: Any = None) -> Iterator[None]:
    """Write the critical path of the work done inside the block to ``filename``.

    Like :func:`distributed.performance_report`: attaches Crux if needed, and
    on leaving the block writes an HTML file that needs no server.
    """
    from distributed import default_client

    import crux_dask

    client = client or default_client()
    crux_dask.attach(client)
    yield
    pag = crux_dask.get_pag(client)
    with open(filename, "w") as f:
        f.write(report_html(pag, load=crux_dask.get_load(client),
                            functions=crux_dask.get_functions(client)))
