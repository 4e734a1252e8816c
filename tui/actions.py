"""The desk's side of the operator actions: for each row of core.actions.ACTIONS, its key, its
label and the words of its outcome.

Keys are the desk's business, so they live here and not in the core. Which actions a pane
offers follows from what it shows (`offered(target, states)`: the core rows whose allowed
states meet the pane's); their bindings, the pane's set of writing actions, the footer, help
and the command palette all follow from that. Adding an operator action is a row in
core/actions.py, its core method, and a row here.

Every action runs as `act('<name>')`, one Textual action with the core's name as parameter,
so a pane or screen has one handler (`action_act`) and one gate (`check_action`) for all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from textual.binding import Binding

from onwatch.core import ACTIONS


@dataclass(frozen=True, slots=True)
class DeskAction:
    """How the desk offers one core action and words what it did."""

    key: str
    label: str  # its name in the footer, help and the command palette
    tooltip: str  # what it does (help, palette); "(confirmed)" is added when it asks first
    done: str  # the outcome when applied; {label} is the target as shown ("#7", "r1")
    verb: str = ""  # over several rows: "<verb> 3 of 4"
    confirm: bool = True  # asks first, with the core row's question and note
    footer: bool = True  # False: help and palette only (a rare key must not crowd the footer)
    already: str = ""  # a switch found already so


KEYS: dict[str, DeskAction] = {
    "requeue": DeskAction(
        "r",
        "Requeue",
        "back to pending with a fresh attempt budget",
        "requeued {label}: pending again with a fresh attempt budget",
        "requeued",
    ),
    "cancel": DeskAction(
        "c",
        "Cancel",
        "the event will never be claimed",
        "cancelled {label}: it will never run",
        "cancelled",
    ),
    "resolve": DeskAction(
        "m",
        "Resolve",
        "an interrupted event's effect did happen: done, never rerun",
        "resolved {label} as done: its effect is taken as having happened",
        "resolved",
    ),
    "bury": DeskAction(
        "D",
        "Bury",
        "to dead by hand (pending or interrupted): it stays there until requeued",
        "buried {label}: it stays in Dead until requeued",
        "buried",
        footer=False,
    ),
    "run_now": DeskAction(
        "N",
        "Run now",
        "end its backoff: claimable now, tries kept",
        "{label} runs now: the worker may claim it at once",
        "run now",
        footer=False,
    ),
    "approve": DeskAction(
        "a",
        "Approve",
        "answer yes; the agent resumes with it",
        "approved {label}",
        "approved",
    ),
    "deny": DeskAction(
        "d",
        "Deny",
        "answer no; the agent resumes with a refusal",
        "denied {label}",
        "denied",
    ),
    "expire": DeskAction(
        "e",
        "Expire",
        "end the request now as if its deadline had passed",
        "expired {label} now: the agent resumes with a refusal",
        "expired",
    ),
    "mark_sent": DeskAction(
        "x",
        "Mark sent",
        "the oldest uncertain send did reach the channel",
        "{label} marked sent",
        "marked sent",
    ),
    "send_again": DeskAction(
        "A",
        "Send again",
        "the oldest uncertain send: its messages held again, to go out under a new key",
        "{label}: its messages are held again for a new send",
        "sent again",
    ),
    "fire_timer": DeskAction(
        "f",
        "Fire now",
        "the timer's next occurrence becomes an event now (a repeating one moves on)",
        "fired {label} now: its next occurrence is an event",
        "fired",
    ),
    "pause_timer": DeskAction(
        "z",
        "Pause timer",
        "the scheduler skips the timer until it is resumed",
        "paused {label}: nothing fires until you resume it",
        "paused",
    ),
    "resume_timer": DeskAction(
        "Z",
        "Resume timer",
        "a paused timer fires again; what it missed catches up by its policy",
        "resumed {label}: it fires again",
        "resumed",
        footer=False,
    ),
    "delete_timer": DeskAction(
        "X",
        "Delete timer",
        "the timer never fires again (unless the agent registers it again)",
        "deleted {label}: it never fires again",
        "deleted",
        footer=False,
    ),
    "raise_budget": DeskAction(
        "B",
        "Raise budget",
        "raise a delaying budget (spend per day of a unit, runs per day) to a value you give",
        "raised {label}",
        "raised",
        footer=False,
    ),
    # The switches act at once (pressing the key again undoes them); p and o are in help
    # and the palette, not the footer: at 80 columns it keeps the pane's own keys.
    "pause": DeskAction(
        "p",
        "Pause",
        "claims return nothing until resumed; intake never stops",
        "paused: claims return nothing until you resume (intake goes on)",
        confirm=False,
        footer=False,
        already="already paused",
    ),
    "resume": DeskAction(
        "p",
        "Resume",
        "the worker may claim events again",
        "resumed: the worker may claim events again",
        confirm=False,
        footer=False,
        already="already running",
    ),
    "hold": DeskAction(
        "o",
        "Hold outbox",
        "paced sends wait until the outbox is released",
        "outbox held: paced sends wait until you release it",
        confirm=False,
        footer=False,
        already="outbox already held",
    ),
    "release": DeskAction(
        "o",
        "Release outbox",
        "paced sends go out again",
        "outbox released: paced sends go out again",
        confirm=False,
        footer=False,
        already="outbox already released",
    ),
}


def offered(target: str | None, states: Iterable[str]) -> tuple[str, ...]:
    """The core actions on `target` that apply to a row in one of `states`, in table order.

    A core row without a desk key yet is left out (the CLI has it already);
    tests/tui/test_action_table.py fails until it gets one."""
    shown = set(states)
    return tuple(
        a.name
        for a in ACTIONS.values()
        if a.target == target and shown.intersection(a.allowed) and a.name in KEYS
    )


def tooltip(name: str) -> str:
    desk = KEYS[name]
    return f"{desk.tooltip} (confirmed)" if desk.confirm else desk.tooltip


def bindings(names: Iterable[str], *, id_prefix: str = "") -> list[Binding]:
    """One binding per action, `act('<name>')`, with the id `<id_prefix><cli command>`."""
    return [
        Binding(
            KEYS[name].key,
            f"act({name!r})",
            KEYS[name].label,
            show=KEYS[name].footer,
            id=id_prefix + ACTIONS[name].command,
            tooltip=tooltip(name),
        )
        for name in names
    ]


def acted(binding: Binding) -> str | None:
    """The operator action `binding` runs (its core name), or None for any other key."""
    action = binding.action.removeprefix("app.")
    if not (action.startswith("act(") and action.endswith(")")):
        return None
    name = action[4:-1].strip("'\"")
    return name if name in ACTIONS else None
