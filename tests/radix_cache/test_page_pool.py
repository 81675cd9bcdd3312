"""PagePool: exact page ids and counts."""

import pytest

from radixlm.radix_cache import PagePool


def test_fresh_pool_hands_out_ascending_pages_never_page_zero() -> None:
    pool = PagePool(num_pages=5, page_size=4)
    assert pool.available_pages == 5
    assert pool.available_size == 20
    assert pool.total_size == 20
    assert pool.alloc(3) == [1, 2, 3]
    assert pool.alloc(2) == [4, 5]
    assert pool.available_pages == 0
    assert pool.available_size == 0


def test_alloc_zero_and_negative() -> None:
    pool = PagePool(4, 1)
    assert pool.alloc(0) == []
    assert pool.available_pages == 4
    with pytest.raises(ValueError):
        pool.alloc(-1)


def test_alloc_returns_none_and_allocates_nothing_when_short() -> None:
    pool = PagePool(4, 2)
    assert pool.alloc(3) == [1, 2, 3]
    assert pool.alloc(2) is None
    assert pool.available_pages == 1
    assert pool.alloc(1) == [4]
    assert pool.alloc(1) is None


def test_free_restores_counts_and_reuses_lifo() -> None:
    pool = PagePool(6, 1)
    pages = pool.alloc(6)
    assert pages == [1, 2, 3, 4, 5, 6]
    pool.free([2, 5])
    assert pool.available_pages == 2
    assert pool.is_free(2) and pool.is_free(5) and not pool.is_free(3)
    assert sorted(pool.alloc(2) or []) == [2, 5]
    assert pool.available_pages == 0


def test_double_free_raises_and_leaves_pool_unchanged() -> None:
    pool = PagePool(4, 1)
    pool.alloc(4)
    pool.free([1])
    with pytest.raises(ValueError, match="double free"):
        pool.free([1])
    # All or nothing: page 3 must not be freed when page 1 in the same call is a double free.
    with pytest.raises(ValueError, match="double free"):
        pool.free([3, 1])
    assert not pool.is_free(3)
    assert pool.available_pages == 1
    # Duplicate inside one call is a double free too.
    with pytest.raises(ValueError, match="double free"):
        pool.free([2, 2])
    assert not pool.is_free(2)
    assert pool.available_pages == 1


@pytest.mark.parametrize("page", [0, 5, -1])
def test_free_out_of_range_raises(page: int) -> None:
    pool = PagePool(4, 1)
    pool.alloc(4)
    with pytest.raises(ValueError, match="out of range"):
        pool.free([2, page])
    assert pool.available_pages == 0
    assert not pool.is_free(0)


def test_clear_frees_everything() -> None:
    pool = PagePool(3, 8)
    pool.alloc(3)
    pool.clear()
    assert pool.available_pages == 3
    assert pool.alloc(3) == [1, 2, 3]


@pytest.mark.parametrize("page_size", [0, 3, 6, -2])
def test_page_size_must_be_power_of_two(page_size: int) -> None:
    with pytest.raises(ValueError):
        PagePool(4, page_size)


def test_negative_num_pages_rejected_and_empty_pool_works() -> None:
    with pytest.raises(ValueError):
        PagePool(-1, 1)
    pool = PagePool(0, 1)
    assert pool.alloc(1) is None
    assert pool.alloc(0) == []
