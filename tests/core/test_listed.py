"""checks.listed, which every list argument of the engine goes through (ids, messages,
approvals, timers): a finite list within its limit, or BadInput; never a hang."""

from __future__ import annotations

import itertools

import pytest

from onwatch.core.checks import listed
from onwatch.core.errors import BadInput


@pytest.mark.parametrize("values", [[1, 2, 3], (1, 2, 3), iter([1, 2, 3]), range(1, 4)])
def test_a_finite_iterable_within_its_limit_is_a_new_list(values) -> None:
    got = listed("ids", values, 3)
    assert got == [1, 2, 3] and type(got) is list and got is not values


@pytest.mark.parametrize("values", ["123", b"123", {1: 2}, 7, None])
def test_text_a_mapping_or_a_scalar_is_not_a_list(values) -> None:
    with pytest.raises(BadInput, match="ids must be a list"):
        listed("ids", values, 3)


@pytest.mark.parametrize(
    "values", [[1, 2, 3, 4], (1, 2, 3, 4), itertools.count(), (n for n in itertools.count())]
)
def test_more_than_the_limit_is_refused_even_an_endless_one(values) -> None:
    with pytest.raises(BadInput, match="ids has more than 3 items"):
        listed("ids", values, 3)


class Endless(list):
    """A list whose iteration never ends: only the exact list and tuple types are trusted
    to be what their length says."""

    def __iter__(self):
        return itertools.count()

    def __len__(self) -> int:
        return 1


def test_a_list_subclass_is_iterated_with_the_limit_not_trusted() -> None:
    with pytest.raises(BadInput, match="more than 3 items"):
        listed("ids", Endless([1]), 3)
