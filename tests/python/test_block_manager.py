import numpy as np
import pytest

import beaconkv


def make(layers=2, heads=2, head_dim=4, block_size=4, num_blocks=64, host=0):
    return beaconkv.BlockManager(layers, heads, head_dim, block_size=block_size,
                                 num_blocks=num_blocks, num_host_blocks=host)


def kv(rng, *shape):
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def test_prompt_and_appended_bytes_read_back_exactly():
    rng = np.random.default_rng(0)
    bm = make()
    k, v = kv(rng, 2, 2, 6, 4)
    bm.add_sequence(1, 6, keys=k, values=v)
    k2, v2 = kv(rng, 2, 2, 4)
    bm.append_token(1, keys=k2, values=v2)
    keys, values, pos = bm.read_head(1, 1, 0)
    np.testing.assert_array_equal(keys[:6], k[1, 0])
    np.testing.assert_array_equal(keys[6], k2[1, 0])
    np.testing.assert_array_equal(values[6], v2[1, 0])
    np.testing.assert_array_equal(pos, np.arange(7))
    assert bm.blocks_of(1) == 2 * 2 * 2
    bm.verify_integrity()


def test_keep_sets_compact_and_free_blocks():
    rng = np.random.default_rng(1)
    bm = make(layers=1, heads=2)
    k, v = kv(rng, 1, 2, 12, 4)
    bm.add_sequence(5, 12, keys=k, values=v)
    used = bm.num_used_blocks
    stats = bm.apply_keep_sets(5, {(0, 0): np.array([11, 0, 1, 10]), (0, 1): [3]})
    assert stats["tokens_evicted"] == 8 + 11
    assert stats["blocks_freed"] == 2 + 2
    assert bm.num_used_blocks == used - 4
    keys, _, pos = bm.read_head(5, 0, 0)
    np.testing.assert_array_equal(pos, [0, 1, 10, 11])
    np.testing.assert_array_equal(keys, k[0, 0, [0, 1, 10, 11]])
    assert bm.retained_tokens(5, 0, 1) == 1
    assert 0.0 < bm.fragmentation < 1.0
    bm.verify_integrity()


def test_swap_round_trip_is_bit_exact():
    rng = np.random.default_rng(2)
    bm = make(num_blocks=40, host=40)
    k, v = kv(rng, 2, 2, 9, 4)
    bm.add_sequence(3, 9, keys=k, values=v)
    before = [bm.read_head(3, l, h) for l in range(2) for h in range(2)]
    bm.swap_out(3)
    assert bm.is_swapped_out(3)
    assert bm.num_used_blocks == 0
    with pytest.raises(ValueError, match="swapped out"):
        bm.append_token(3)
    bm.swap_in(3)
    after = [bm.read_head(3, l, h) for l in range(2) for h in range(2)]
    for a, b in zip(before, after):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    bm.verify_integrity()


def test_fork_shares_then_copies_on_write():
    bm = make(layers=1, heads=1)
    bm.add_sequence(1, 6)
    bm.fork(1, 2)
    assert bm.num_used_blocks == 2
    bm.append_token(2)
    assert bm.num_used_blocks == 3
    assert bm.block_table(1, 0, 0)[0] == bm.block_table(2, 0, 0)[0]
    assert bm.block_table(1, 0, 0)[1] != bm.block_table(2, 0, 0)[1]
    bm.verify_integrity()


def test_free_list_order_is_deterministic():
    bm = make(layers=1, heads=1, num_blocks=8)
    assert bm.free_list() == [1, 2, 3, 4, 5, 6, 7]
    bm.add_sequence(1, 8)   # blocks 1, 2
    bm.add_sequence(2, 4)   # block 3
    bm.free(1)
    assert bm.free_list() == [1, 2, 4, 5, 6, 7]


def test_out_of_blocks_is_memory_error_and_changes_nothing():
    bm = make(layers=1, heads=2, num_blocks=6)
    bm.add_sequence(1, 8)
    free_before = bm.free_list()
    with pytest.raises(MemoryError, match="needed 4, 1 free of 5"):
        bm.add_sequence(2, 8)
    assert bm.free_list() == free_before
    assert bm.sequence_ids == [1]
    bm.verify_integrity()


@pytest.mark.parametrize("call, message", [
    (lambda bm: bm.append_token(99), "unknown sequence id 99"),
    (lambda bm: bm.free(99), "unknown sequence id 99"),
    (lambda bm: bm.apply_keep_sets(1, {(0, 0): [1, 1]}), "slot 1 twice"),
    (lambda bm: bm.apply_keep_sets(1, {(0, 0): [40]}), "outside"),
    (lambda bm: bm.apply_keep_sets(1, {(7, 0): [0]}), "layer 7"),
    (lambda bm: bm.add_sequence(1, 3), "already exists"),
    (lambda bm: bm.add_sequence(2, 0), "prompt length 0"),
    (lambda bm: bm.append_token(1, keys=np.zeros((2, 2, 3), np.float32),
                                values=np.zeros((2, 2, 3), np.float32)), "shape"),
])
def test_bad_input_is_value_error_with_the_message(call, message):
    bm = make()
    bm.add_sequence(1, 5)
    with pytest.raises(ValueError, match=message):
        call(bm)
    assert bm.retained_tokens(1, 0, 0) == 5
    bm.verify_integrity()


def test_bad_configuration_is_value_error():
    with pytest.raises(ValueError, match="num_blocks"):
        beaconkv.BlockManager(1, 1, 4, block_size=4, num_blocks=1)
    with pytest.raises(ValueError, match="block_size=0"):
        beaconkv.BlockManager(1, 1, 4, block_size=0, num_blocks=8)


def test_demo_runs_and_reports_exact_swap():
    from beaconkv.demo import run_block_manager_demo
    result = run_block_manager_demo(seed=3)
    assert result["swap_exact"] is True
    assert result["blocks_freed_by_eviction"] > 0
