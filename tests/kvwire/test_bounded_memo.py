import pytest

from kvwire.bounded_memo import BoundedMemo


def test_the_least_recently_used_entry_goes_first() -> None:
    memo: BoundedMemo[str, int] = BoundedMemo(2)
    memo.put("a", 1)
    memo.put("b", 2)
    assert memo.get("a", None) == 1  # now the most recently used
    memo.put("c", 3)
    assert (memo.get("b", None), memo.get("a", None), memo.get("c", None)) == (None, 1, 3)
    assert memo.weight == 0  # nothing weighed without ``weight``


def test_a_weight_bound_evicts_the_oldest_until_the_entries_fit() -> None:
    memo: BoundedMemo[str, str] = BoundedMemo(10, weight=len, max_weight=10)
    memo.put("a", "xxxx")
    memo.put("b", "yyyy")
    memo.put("a", "xx")  # replaced: its old weight is taken back
    assert memo.weight == 6 and len(memo) == 2
    memo.put("c", "zzzzzz")  # 12 > 10: "b", the least recently used, goes
    assert memo.get("b", None) is None and memo.weight == 8
    memo.put("d", "w" * 11)  # heavier than the bound: nothing, itself included, stays
    assert len(memo) == 0 and memo.weight == 0


def test_a_weight_needs_its_bound() -> None:
    with pytest.raises(ValueError, match="together"):
        BoundedMemo(4, weight=len)
    with pytest.raises(ValueError, match="max_weight must be >= 1, got 0"):
        BoundedMemo(4, weight=len, max_weight=0)
