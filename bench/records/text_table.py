"""Tables for the terminal: rich's when `rich` is installed (the `bench` extra), else
aligned plain text, so a command of the base install prints the same rows either way."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class TextTable:
    """A titled table; the first column is left-aligned, the others right-aligned."""
    title: str
    columns: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)

    def add_row(self, *cells: str) -> None:
        self.rows.append(cells)


def print_blocks(blocks: Sequence[str | TextTable], file=None, width: int = 110) -> None:
    """Each block in order: a line of text, or a table."""
    file = file or sys.stdout
    try:
        from rich.console import Console
    except ImportError:
        for block in blocks:
            print(block if isinstance(block, str) else "\n" + plain_table(block), file=file)
        return
    console = Console(file=file, width=width)
    for block in blocks:
        if isinstance(block, str):
            console.print(block, soft_wrap=True)
        else:
            console.print(_rich_table(block))


def plain_table(table: TextTable) -> str:
    cells = [list(table.columns), *map(list, table.rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    lines = [table.title]
    for row in cells:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return "\n".join(lines)


def _rich_table(table: TextTable):
    from rich.table import Table
    out = Table(title=table.title)
    for i, name in enumerate(table.columns):
        out.add_column(name, justify="left" if i == 0 else "right")
    for row in table.rows:
        out.add_row(*row)
    return out
