"""How a pane's columns share the width: by importance, by what they hold; ids cut in the middle.

At 120 columns every column gets its width. At 80 something must give: a table that cuts
every column a little shows three source ids as `delivery-7f` while an empty `last error`
keeps eighteen cells. So each column says what it is worth (`rank`: 0 always shown, the
highest gives way first), the least it can be (`narrow`) and the most it wants (`width`),
and `fit` decides with what the rows hold: a column every row leaves empty gives way before
any other and takes no more than its heading; the space left goes to the fill column while
it has text to show, else to the others by importance; and an id too long for its column
keeps its distinguishing end (`middle`: `gh-de…-4411`, not `gh-delivery`).

No Textual here: tui/panes/base.py applies the widths to its DataTable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from rich.cells import cell_len
from rich.text import Text

ELLIPSIS = "…"
ID_CHARS = 1024  # an id's longest (docs/rules.md#bounds-and-reserved-names): kept whole, so
# that `middle` keeps its true end


@dataclass(frozen=True, slots=True)
class Column:
    """One table column; `ticking` columns depend on the clock and are redrawn each second
    (their width never follows what they hold: `width`, or `narrow` when space is short)."""

    key: str
    label: str
    width: int  # the width it is comfortable at (more for the fill column, when there is)
    ticking: bool = False
    fill: bool = False  # takes the width the other columns leave (one per table)
    narrow: int | None = None  # the least it keeps before giving way (default: width)
    rank: int = 0  # 0: always shown; otherwise the highest rank gives way (is hidden) first
    middle: bool = False  # an id: shortened in the middle, keeping its distinguishing end

    @property
    def least(self) -> int:
        return self.width if self.narrow is None else self.narrow


def fit(
    columns: Iterable[Column], available: int, content: Mapping[str, int], padding: int = 2
) -> dict[str, int]:
    """Each column's width in a table `available` cells wide (0: the column gives way).

    `content[key]` is the widest cell the column's rows hold now (0 or absent: all empty);
    `padding` is what the table adds around every shown column. First every column gets
    its least (an empty one: its heading), columns giving way, most dispensable first, until
    that fits; then each grows, by importance, toward what it holds up to its comfortable
    width, and past it while the fill column has no text to show; what is left goes to the
    fill column.
    """
    columns = list(columns)
    order = {c.key: i for i, c in enumerate(columns)}

    def held(c: Column) -> int:
        return content.get(c.key, 0)

    def least(c: Column) -> int:
        heading = cell_len(c.label)
        if not c.ticking and held(c) == 0 and (c.fill or c.rank):
            return min(c.least, heading)  # every row empty: its heading is enough
        return min(c.least, max(heading, held(c))) if c.fill else c.least

    def comfortable(c: Column) -> int:
        if c.ticking:
            return c.width
        return max(least(c), min(c.width, max(cell_len(c.label), held(c))))

    shown = list(columns)
    while sum(least(c) + padding for c in shown) > available:
        droppable = [c for c in shown if c.rank > 0]
        if not droppable:
            break
        # An empty column goes first, then the least important, then the rightmost.
        shown.remove(max(droppable, key=lambda c: (held(c) == 0, c.rank, order[c.key])))
    widths = {c.key: 0 for c in columns}
    widths.update({c.key: least(c) for c in shown})
    left = available - sum(widths[c.key] + padding for c in shown)
    by_rank = sorted(shown, key=lambda c: (c.rank, order[c.key]))
    for c in by_rank:
        grow = min(left, comfortable(c) - widths[c.key])
        if grow > 0:
            widths[c.key] += grow
            left -= grow
    fill = next((c for c in shown if c.fill), None)
    if fill is None or fill.key not in content:
        # Room to spare and no text to fill it with: a long id is shown whole.
        for c in by_rank:
            if not (c.ticking or c.fill):
                grow = min(left, held(c) - widths[c.key])
                if grow > 0:
                    widths[c.key] += grow
                    left -= grow
    if fill is not None and left > 0:  # the rest: the fill column spans the table
        widths[fill.key] += left
    return widths


def middle(text: Text, width: int) -> Text:
    """`text` in at most `width` cells: whole if it fits, else its start and (the larger
    part) its end around '…' — ids differ at their end (`gh-delivery-4411`, `msg-12`)."""
    if text.cell_len <= width:
        return text
    if width <= 1:
        return Text(ELLIPSIS[:width], end="", no_wrap=True)
    keep = width - cell_len(ELLIPSIS)
    tail_cells = (keep + 1) // 2
    head_cells = keep - tail_cells
    plain = text.plain
    head = _chars_within(plain, head_cells)
    tail = len(plain) - _chars_within(plain[::-1], tail_cells)
    shortened = text[:head]
    shortened.append(ELLIPSIS)
    shortened.append_text(text[tail:])
    shortened.no_wrap = True
    return shortened


def _chars_within(plain: str, cells: int) -> int:
    """How many leading characters of `plain` fit in `cells` cells."""
    used = 0
    for index, char in enumerate(plain):
        used += cell_len(char)
        if used > cells:
            return index
    return len(plain)
