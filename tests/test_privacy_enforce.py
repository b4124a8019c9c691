"""rayfed.privacy.enforce over named columns: counted per column, refusals name the column."""

import numpy as np
import pytest

from rayfed.errors import DataError
from rayfed.privacy import Ball, Interval, enforce


def test_named_columns_are_counted_each_and_a_refusal_names_the_first_outside():
    x = np.array([[0.0, 2.0, -5.0], [0.5, 1.0, 0.0], [-1.0, 1.5, 0.0]])
    clipped, c = enforce(x, Interval(-1, 1, 3), "clip", "data", "ood", columns=["a", "b", "c"])
    assert clipped.tolist() == [[0.0, 1.0, -1.0], [0.5, 1.0, 0.0], [-1.0, 1.0, 0.0]]
    assert (c.field, c.count, c.total, c.domain) == ("data", 3, 9, "[-1, 1]")
    assert c.columns == (("a", 0), ("b", 2), ("c", 1))
    assert c.statement() == "3 of 9 data values clipped to [-1, 1] (b: 2, c: 1)"
    assert c.to_dict()["columns"] == {"a": 0, "b": 2, "c": 1}
    with pytest.raises(DataError) as err:
        enforce(x, Interval(-1, 1), "refuse", "data", "ood", columns=["a", "b", "c"], widen="w")
    assert err.value.field == "data.b"
    assert "2 of 3 values of column 'b' and 1 of 3 values of column 'c'" in err.value.problem
    assert err.value.allowed.startswith("w, or set ood=clip")
    _, one = enforce(x[:, :1], Interval(-1, 1), "refuse", "data", "ood", columns=["a"])
    assert one.statement() == "0 of 3 data.a values clipped to [-1, 1]"


def test_named_columns_need_matching_values_and_an_interval():
    x = np.zeros((4, 2))
    with pytest.raises(ValueError):
        enforce(x, Interval(-1, 1), "clip", "data", "ood", columns=["a", "b", "c"])
    with pytest.raises(ValueError):
        enforce(x, Interval(-1, 1, 3), "clip", "data", "ood", columns=["a", "b"])
    with pytest.raises(ValueError):
        enforce(x, Ball(1.0, 2, 2), "clip", "data", "ood", columns=["a", "b"])
