"""Columns of Bokeh data tables, made of few Bokeh models.

Every model of a page is checked and encoded on the scheduler's event loop
when the page is shown, about a quarter of a millisecond each.  A Bokeh
``TableColumn`` left to its defaults makes a formatter and an editor of its
own: two models more per column.  The columns made here share one editor
(the tables are not editable) and one formatter per number format.
"""

from __future__ import annotations

from bokeh.models import CellFormatter, NumberFormatter, StringEditor, StringFormatter, TableColumn

__all__ = ["table_columns"]

#: A column: ``(field, title)``, optionally followed by its width in pixels and its
#: number format (``NumberFormatter``'s ``format``, e.g. ``"0.000"``).
ColumnSpec = tuple


def table_columns(*specs: ColumnSpec) -> list[TableColumn]:
    """The columns of one table, sharing one editor and one formatter per format.

    Examples
    --------
    >>> columns = table_columns(("key", "key", 260), ("busy", "busy (s)", 70, "0.000"))
    >>> columns[1].formatter.format
    '0.000'
    """
    editor = StringEditor()
    formatters: dict[str | None, CellFormatter] = {}
    columns = []
    for field, title, *rest in specs:
        width = rest[0] if rest else None
        number_format = rest[1] if len(rest) > 1 else None
        if number_format not in formatters:
            formatters[number_format] = (StringFormatter() if number_format is None
                                         else NumberFormatter(format=number_format))
        extra = {} if width is None else {"width": width}
        columns.append(TableColumn(field=field, title=title, editor=editor,
                                   formatter=formatters[number_format], **extra))
    return columns
