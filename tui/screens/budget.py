"""The raise-budget dialog: which delaying budget (max_spend_per_day of a unit, or
max_runs_per_day) and its new limit; the app confirms, then raises it (audited)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from onwatch.core import Overview


def _number(value: float) -> str:
    return f"{value:,.6f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value):,}"


@dataclass(frozen=True, slots=True)
class BudgetChoice:
    """A delaying budget that is set: its limit as the operator sees it, and its use."""

    budget: str  # max_spend_per_day | max_runs_per_day
    unit: str | None
    limit: float
    used: float

    @property
    def name(self) -> str:
        return self.budget if self.unit is None else f"{self.budget} {self.unit}"

    def shown(self, value: float) -> str:
        return f"{_number(value)} {self.unit}" if self.unit else f"{_number(value)} runs"

    def line(self) -> str:
        """'max_spend_per_day usd: 5.2 of 5 usd in the last 24 h (reached)'."""
        state = " (reached: runs wait)" if self.used >= self.limit else ""
        return (
            f"{self.name}: {self.shown(self.used)} of {self.shown(self.limit)} in the last "
            f"24 h{state}"
        )


def budgets_set(overview: Overview | None) -> list[BudgetChoice]:
    """The delaying budgets of the inbox that are set, the ones reached first."""
    if overview is None:
        return []
    found = []
    runs = overview.budgets.get("max_runs_per_day", {})
    if runs.get("limit"):
        found.append(BudgetChoice("max_runs_per_day", None, runs["limit"], runs.get("used", 0)))
    spend = overview.budgets.get("max_spend_per_day", {})
    for unit, limit in sorted((spend.get("limit") or {}).items()):
        used = (spend.get("used") or {}).get(unit, 0.0)
        found.append(BudgetChoice("max_spend_per_day", unit, limit, used))
    return sorted(found, key=lambda c: c.used < c.limit)


def parse_limit(choice: BudgetChoice, text: str) -> float | int:
    """The new limit typed for `choice`; ValueError saying what is wrong."""
    try:
        value = Decimal(text.strip().replace(",", "").replace("_", ""))
    except InvalidOperation:
        raise ValueError(f"{text.strip()[:40]!r} is not a number") from None
    if not value.is_finite() or value <= 0:
        raise ValueError("the new limit must be a number above 0")
    if choice.unit is None:
        if value != value.to_integral_value():
            raise ValueError("runs per day is a whole number")
        number: float | int = int(value)
    else:
        number = float(value)
    if number <= choice.limit:
        raise ValueError(
            f"{choice.shown(number)} would not raise it (it is {choice.shown(choice.limit)})"
        )
    return number


class BudgetScreen(ModalScreen[tuple[BudgetChoice, float] | None]):
    """↑↓ picks the budget, type the new limit, Enter goes on (to the confirmation);
    Escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="budget-cancel", key_display="esc")]

    def __init__(self, choices: list[BudgetChoice]) -> None:
        super().__init__(classes="dialog-screen")
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog budget"):
            yield Label(Text("Raise which budget, and to what?"), classes="question")
            yield OptionList(
                *(Option(Text(c.line()), id=str(i)) for i, c in enumerate(self.choices)),
                id="budget-choices",
            )
            yield Input(
                value=_number(self.choices[0].limit * 2), placeholder="new limit", id="budget-to"
            )
            yield Label("", id="budget-problem", classes="note")
            yield Label(
                Text(
                    "Runs it delays may start at once, and what they spend is spent. "
                    "Lowering a budget: onwatch config."
                ),
                classes="note",
            )
            yield Label("↑↓ budget    type the new limit    ↵ go on    esc cancel", classes="keys")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = 0
        self.query_one(Input).focus()

    @property
    def chosen(self) -> BudgetChoice:
        index = self.query_one(OptionList).highlighted
        return self.choices[index or 0]

    def on_key(self, event: events.Key) -> None:
        # The input has the focus (for typing); up and down still pick the budget.
        if event.key in ("up", "down"):
            event.stop()
            options = self.query_one(OptionList)
            step = -1 if event.key == "up" else 1
            options.highlighted = ((options.highlighted or 0) + step) % len(self.choices)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.query_one(Input).value = _number(self.chosen.limit * 2)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            value = parse_limit(self.chosen, event.value)
        except ValueError as exc:
            self.query_one("#budget-problem", Label).update(Text(str(exc)))
            return
        self.dismiss((self.chosen, value))

    def action_cancel(self) -> None:
        self.dismiss(None)
