"""core/timing.py alone, without a database: the plans both stores write.

The one-shot fast path splices the stored payload text into the occurrence's JSON instead of
decoding and encoding it again; it must say what `json.dumps(occurrence(…))` says, or refuse
the row (the per-row path then judges it). A recurring timer's plans, applied pass after
pass, must turn every scheduled time into exactly one event or one counted skip/overflow.
"""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from onwatch.core.clock import MAX_TIME
from onwatch.core.engine.decoding import TIMER_COLUMNS, checked_timer
from onwatch.core.records import Timer
from onwatch.core.engine.timing import first_unfired, firing, occurrence, plain_occurrence

T = 1_000_000
COLUMNS = [c.strip() for c in TIMER_COLUMNS.split(",")]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


def row(**values: object) -> tuple[object, ...]:
    stored = {"catch_up": "coalesce", "last_skipped": 0, "overflow": 0, "kind": "timer"}
    stored.update(values)
    return tuple(stored.get(column) for column in COLUMNS)


@settings(max_examples=300, deadline=None)
@given(
    timer_id=st.text(min_size=1, max_size=20),
    due=st.integers(0, MAX_TIME),
    late=st.integers(0, 10**6),
    data=json_values,
    proven=st.booleans(),
    key=st.none() | st.tuples(st.text(max_size=5), st.text(max_size=5)),
)
def test_the_spliced_occurrence_is_the_encoded_one(timer_id, due, late, data, proven, key):
    stored = row(
        id=timer_id,
        due=due,
        payload=json.dumps(data),
        key_source=None if key is None else key[0],
        key_id=None if key is None else key[1],
    )
    now = due + late
    spliced = plain_occurrence(stored, now, proven)
    [(source, source_id, payload)] = firing(checked_timer(stored), now, 100).events
    assert spliced is not None
    assert spliced[:2] == (source, source_id)
    assert json.loads(spliced[2]) == json.loads(json.dumps(payload))
    assert spliced[3:] == (now,)


def test_a_payload_that_is_not_json_is_never_spliced():
    for text in ("{", "[1,", "NaN]", "[" * 5000 + "]" * 5000, ""):
        assert plain_occurrence(row(id="t", due=T, payload=text), T, False) is None
    # SQLite's json_valid vouching is trusted, but not for deep nesting Python refuses.
    assert plain_occurrence(row(id="t", due=T, payload="[" * 5000 + "]" * 5000), T, True) is None


def test_rows_for_the_per_row_path_are_not_spliced():
    assert plain_occurrence(row(id="t", due=T, every=60, payload="1"), T, True) is None
    assert plain_occurrence(row(id="t", due=T, kind="approval", payload="1"), T, True) is None
    assert plain_occurrence(row(id="t", due="soon", payload="1"), T, True) is None
    assert plain_occurrence(row(id="t", due=T, catch_up="all", payload="1"), T, True) is None


@settings(max_examples=300, deadline=None)
@given(
    every=st.integers(1, 500),
    start=st.integers(0, 2_000),
    passes=st.lists(st.integers(0, 3_000), min_size=1, max_size=6),
    catch_up=st.sampled_from(["coalesce", "each"]),
    limit=st.integers(1, 5),
)
def test_every_occurrence_is_fired_or_counted_once(every, start, passes, catch_up, limit):
    timer = Timer("t", T + start, every, catch_up, None)
    fired: list[int] = []
    counted = 0  # occurrences covered without their own event (skipped or overflow)
    now = T
    for step in passes:
        now += step
        if timer.due > now:
            continue  # the store selects only due timers
        plan = firing(timer, now, limit)
        scheduled = [payload["scheduled_for"] for _, _, payload in plan.events]
        assert all(s <= now for s in scheduled) and scheduled == sorted(set(scheduled))
        assert [key for _, key, _ in plan.events] == [f"t@{s}" for s in scheduled]
        fired += scheduled
        if plan.fired is not None:
            counted += plan.skipped if catch_up == "coalesce" else plan.overflow
            timer = Timer(
                "t",
                plan.due,
                every,
                catch_up,
                None,
                last_fired=plan.fired,
                last_skipped=plan.skipped or 0,
                overflow=timer.overflow + plan.overflow,
            )
        else:
            timer = Timer("t", plan.due, every, catch_up, None, last_fired=timer.last_fired)
    assert fired == sorted(set(fired))  # nothing fires twice, in order
    occurrences = len(range(T + start, now + 1, every))
    assert len(fired) + counted == occurrences
    assert first_unfired(timer) > now


def test_a_redefined_timer_keeps_what_it_already_fired():
    # Registered again with an earlier due: the occurrences fired before are not fired again.
    timer = Timer("t", T, 60, "each", None, last_fired=T + 120)
    assert first_unfired(timer) == T + 180
    plan = firing(timer, T + 240, 10)
    assert [p["scheduled_for"] for _, _, p in plan.events] == [T + 180, T + 240]
    assert occurrence(timer, T + 180, T + 240, 0)["late_by"] == 60
