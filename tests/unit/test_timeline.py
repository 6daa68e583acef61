"""bench/timeline.py's reading of the trace: which blocks ran, their phases, and the two waits
of their first unit as shares of its mainloop."""

from __future__ import annotations

import pytest

from tests.unit.bench_scripts import load

pytest.importorskip("torch")
timeline = load("timeline")


def row(entry_ns: int, cycles0: int, loop_cycles: int, full: int, empty: int, sm: int) -> list[int]:
    """One block's trace as the kernel writes it: ns of each point, cycles of each, its SM,
    "ran", then its waits."""
    n = len(timeline.POINTS)
    ns = [entry_ns + 1000 * i for i in range(n)]
    cycles = [cycles0 + 2000 * i for i in range(n)]
    at = timeline.POINTS.index
    cycles[at("mainloop")] = cycles[at("first_full")] + loop_cycles
    return ns + cycles + [sm, 1, full, empty]


def test_blocks_that_never_ran_are_left_out_and_waits_are_shares_of_the_mainloop():
    rows = [row(10_000, 0, 10_000, 2_500, 100, sm=3), [0] * timeline.SLOTS,
            row(10_500, 50, 20_000, 10_000, 0, sm=7)]
    raw = [v for r in rows for v in r]
    assert len(raw) == 3 * timeline.SLOTS
    blocks = timeline.blocks_of(raw, 3)
    assert [b["block"] for b in blocks] == [0, 2]
    assert [b["sm"] for b in blocks] == [3, 7]
    assert blocks[1]["waits"] == {"full_wait": 10_000, "empty_wait": 0}
    summary = timeline.phases(blocks)
    # full: 25% and 50% of the mainloop's cycles; empty: 1% and 0%: medians of two blocks
    assert summary["waited"]["full_wait"] == pytest.approx(0.375)
    assert summary["waited"]["empty_wait"] == pytest.approx(0.005)
    assert summary["blocks"] == 2
    assert summary["phases"]["start"] == (0.25, 0.5)


def test_a_split_reduction_is_read_in_two_parts_for_writers_and_leavers():
    """With a split of K, blocks that reach "stored" wrote their tile; the others left it to
    another split. Each group's median of its own part (mainloop to ticket) and of the
    read-back (ticket to reduced)."""
    at = timeline.POINTS.index

    def split_row(ticket_after: int, sum_after: int, writes: bool) -> list[int]:
        r = row(10_000, 0, 10_000, 0, 0, sm=1)
        ns_loop = r[at("mainloop")]
        r[at("ticketed")] = ns_loop + ticket_after
        r[at("reduced")] = ns_loop + ticket_after + sum_after
        if not writes:
            r[at("stored")] = 0  # it left the tile: no store
        return r

    rows = [split_row(2_000, 0, False), split_row(3_000, 0, False), split_row(1_000, 500, True)]
    blocks = timeline.blocks_of([v for r in rows for v in r], 3)
    parts = timeline.phases(blocks)["reduce_parts"]
    assert parts["leavers"] == {"blocks": 2, "own": 2.5, "sum": 0.0}
    assert parts["writers"] == {"blocks": 1, "own": 1.0, "sum": 0.5}
    # No split: no block takes a ticket, no parts.
    unsplit = row(10_000, 0, 10_000, 0, 0, sm=1)
    unsplit[at("ticketed")] = 0
    assert timeline.phases(timeline.blocks_of(unsplit, 1))["reduce_parts"] == {}


def test_unit_paces_group_blocks_by_their_units_and_time_them_from_the_first_entry():
    """A persistent launch: two blocks ran three units, one ran two; each group's median
    mainloop end of every unit and consumers' exit, in us after the first block entered."""
    rows = [row(10_000, 0, 10_000, 0, 0, sm=0), row(11_000, 0, 10_000, 0, 0, sm=1), row(12_000, 0, 10_000, 0, 0, sm=2)]
    raw = [v for r in rows for v in r]

    def units(ends, exit_ns):
        return ends + [0] * (timeline.UNIT_SLOTS - 1 - len(ends)) + [exit_ns]

    units_raw = (units([20_000, 40_000, 60_000], 61_000) + units([22_000, 44_000, 66_000], 67_000)
                 + units([30_000, 50_000], 52_000))
    blocks = timeline.blocks_of(raw, 3, units_raw)
    paces = timeline.unit_paces(blocks)
    assert [(g["units"], g["blocks"]) for g in paces] == [(3, 2), (2, 1)]
    assert paces[0]["ends_us"] == [11.0, 32.0, 53.0]  # medians of (20, 22), (40, 44), (60, 66) us less 10
    assert paces[0]["exit_us"] == 54.0 and paces[0]["last_exit_us"] == 57.0
    assert paces[1]["ends_us"] == [20.0, 40.0] and paces[1]["exit_us"] == 42.0
    assert timeline.unit_paces(timeline.blocks_of(raw, 3)) == []  # a trace without the unit stamps
