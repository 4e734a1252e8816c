"""The inbox's settings and its operator switches (pause, outbox hold)."""

from __future__ import annotations

from ..settings import Settings
from .decoding import settings_from
from .journal import audit
from .tx import Tx

FLAGS = ("paused", "outbox_held")


def load_settings(tx: Tx) -> Settings:
    text = tx.settings_text()
    return settings_from(text)


def store_settings(tx: Tx, settings: Settings) -> None:
    tx.run("settings_store", json=settings.to_json())


def set_flag(
    tx: Tx, flag: str, value: bool, action: str, now: int | None, actor: str, reason: str | None
) -> bool:
    """Turn a switch on or off (audited either way); True when it changed."""
    if flag not in FLAGS:
        raise KeyError(flag)
    now = tx.now(now)
    before = bool(tx.meta(flag))
    if before != value:
        tx.set_meta(flag, value)
    audit(
        tx,
        now,
        actor,
        action,
        flag,
        str(before).lower(),
        str(value).lower(),
        before != value,
        reason,
    )
    return before != value
