"""Stream-K's schedule, held to its contract on the host, with no GPU.

templates/stream_k.cuh.j2 holds what the kernel reads to find its units (stream_k_units,
stream_k_unit) and what the entry computes to launch it (stream_k_plan). Compiled here on
the host alone, with every function the kernel calls, a harness plays each CTA of every
launch the entry can make over a range of tile counts, K depths and grids, and checks what
the GPU tests can only sample: every K tile of every tile is taken by exactly one CTA; the
CTAs that share a tile agree on how many they are, hold distinct ranks and one workspace
slot, which no other shared tile uses and which lies inside the workspace the entry asks
for. Both builds: the default (each left-over tile cut at the same K offsets) and
-DL2GEN_SK_ALIGNED=0 (runs laid end to end). The cost model's mirror of the plan
(l2gen.limits.stream_k_plan) must give the kernel's answers.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from l2gen.limits import L2GEN_SK_MAX_PARTS, stream_k_plan
from l2gen.lower import _environment

HARNESS = r"""
#define __host__
#define __device__
#include <cstdio>
#include <vector>
#include "stream_k.cuh"
#ifndef RED
#define RED 10
#endif

static int failures = 0;
#define EXPECT(cond, ...)                                                  \
  do {                                                                      \
    if (!(cond)) {                                                          \
      if (failures++ < 20) {                                                \
        std::printf("tiles %lld kt %d resident %d: ", tiles, kt, resident); \
        std::printf(__VA_ARGS__);                                           \
        std::printf("\n");                                                  \
      }                                                                     \
      return;                                                               \
    }                                                                       \
  } while (0)

// One launch as the entry makes it (sm90_l2gen_host.cuh.j2: stream_k_grid, the grid it
// launches), each CTA's units as the kernel walks them.
static void play(long long tiles, int kt, int resident) {
  const long long iters = tiles * kt;
  const int sk_grid = static_cast<int>(iters < resident ? iters : resident);
  const StreamKPlan s = stream_k_plan(tiles, kt, sk_grid, RED);
  const int grid = s.dp_tiles > 0 ? sk_grid : s.ctas;
  std::printf("plan %lld %d %d %d %d %d\n", tiles, kt, sk_grid, s.dp_tiles, s.ctas, s.q);
  EXPECT(s.dp_tiles % sk_grid == 0 && s.dp_tiles <= tiles && tiles - s.dp_tiles < sk_grid,
         "whole waves: %d tiles", s.dp_tiles);
  EXPECT(s.ctas <= sk_grid && (s.ctas > 0) == (tiles > s.dp_tiles), "%d CTAs take the rest", s.ctas);
  const long long rest = tiles - s.dp_tiles;
  std::vector<int> taken(rest * kt, 0), parts(rest, -1), slot(rest, -1), seen(rest, 0);
  std::vector<long long> ranks(rest, 0);
  std::vector<int> whole(s.dp_tiles, 0), slot_of(sk_grid, -1);
  for (int g = 0; g < grid; ++g) {
    const int units = stream_k_units(s, g);
    EXPECT(units >= 0 && units <= (g < s.ctas ? rest * L2GEN_SK_MAX_PARTS : 0), "CTA %d: %d units", g, units);
    for (int i = 0; i < units; ++i) {
      const StreamKUnit u = stream_k_unit(s, g, i, units);
      EXPECT(u.t >= 0 && u.t < rest, "CTA %d unit %d: tile %d", g, i, u.t);
      EXPECT(u.n_k >= 1 && u.kt_begin >= 0 && u.kt_begin + u.n_k <= kt, "CTA %d: K tiles [%d, +%d)", g,
             u.kt_begin, u.n_k);
      for (int k = u.kt_begin; k < u.kt_begin + u.n_k; ++k) ++taken[u.t * kt + k];
      EXPECT(parts[u.t] < 0 || parts[u.t] == u.parts, "tile %d: %d and %d parts", u.t, parts[u.t], u.parts);
      EXPECT(slot[u.t] < 0 || slot[u.t] == u.slot, "tile %d: slots %d and %d", u.t, slot[u.t], u.slot);
      EXPECT(u.rank >= 0 && u.rank < u.parts && u.rank < 62 && !(ranks[u.t] >> u.rank & 1),
             "tile %d: rank %d of %d twice or out of range", u.t, u.rank, u.parts);
      parts[u.t] = u.parts;
      slot[u.t] = u.slot;
      ranks[u.t] |= 1ll << u.rank;
      ++seen[u.t];
    }
    for (int i = 0; i < s.dp_tiles / grid; ++i) ++whole[g + i * grid];
  }
  for (long long c = 0; c < rest * kt; ++c)
    EXPECT(taken[c] == 1, "tile %lld K tile %lld taken %d times", c / kt, c % kt, taken[c]);
  for (int t = 0; t < rest; ++t) {
    EXPECT(seen[t] == parts[t], "tile %d: %d CTAs for %d parts", t, seen[t], parts[t]);
    if (parts[t] > 1) {  // summed in the workspace: a slot of its own, inside the workspace
      EXPECT(slot[t] >= 0 && slot[t] < sk_grid, "tile %d: slot %d of %d", t, slot[t], sk_grid);
      EXPECT(slot_of[slot[t]] < 0, "tiles %d and %d share slot %d", slot_of[slot[t]], t, slot[t]);
      slot_of[slot[t]] = t;
    }
  }
  for (int t = 0; t < s.dp_tiles; ++t) EXPECT(whole[t] == 1, "whole tile %d run %d times", t, whole[t]);
}

int main() {
  const int kts[] = {1, 2, 3, 5, 8, 13, 37, 64, 128, 296};
  const int residents[] = {1, 2, 7, 64, 100, 132, 264};
  for (long long tiles = 1; tiles <= 300; ++tiles)
    for (int kt : kts)
      for (int resident : residents) play(tiles, kt, resident);
  std::printf("failures %d\n", failures);
  return failures ? 1 : 0;
}
"""


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++) on PATH")
    work = tmp_path_factory.mktemp("stream_k")
    (work / "stream_k.cuh").write_text(
        _environment().get_template("stream_k.cuh.j2").render(sk_max_parts=L2GEN_SK_MAX_PARTS))
    (work / "harness.cpp").write_text(HARNESS)
    return cxx, work


def _play(header, *defines: str) -> list[tuple[int, ...]]:
    cxx, work = header
    exe = work / ("harness" + "".join(d.replace("=", "_") for d in defines))
    subprocess.run([cxx, "-std=c++17", "-O2", *defines, "-o", str(exe), str(work / "harness.cpp")],
                   check=True, capture_output=True, text=True, timeout=300)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    failures = [line for line in run.stdout.splitlines() if not line.startswith("plan ")]
    assert run.returncode == 0, "\n".join(failures[-25:])
    return [tuple(int(x) for x in line.split()[1:]) for line in run.stdout.splitlines() if line.startswith("plan ")]


def test_the_default_cut_takes_every_k_tile_once_and_the_model_plans_as_the_kernel(header):
    plans = _play(header)
    assert len(plans) == 300 * 10 * 7
    for tiles, kt, grid, dp_tiles, ctas, pieces in plans:
        assert stream_k_plan(tiles, kt, grid) == (dp_tiles, ctas, pieces), (tiles, kt, grid)
    # the cut is used: some launches cut left-over tiles into the most pieces allowed
    assert any(pieces == L2GEN_SK_MAX_PARTS for *_, pieces in plans)


def test_runs_laid_end_to_end_take_every_k_tile_once(header):
    plans = _play(header, "-DL2GEN_SK_ALIGNED=0")
    assert len(plans) == 300 * 10 * 7


def test_a_smaller_piece_cap_still_takes_every_k_tile_once(header):
    _play(header, "-DL2GEN_SK_MAX_PARTS=3")


@pytest.mark.parametrize("red", [0, 10, 1000])
def test_pieces_spread_over_several_rounds_take_every_k_tile_once(header, red):
    """-DL2GEN_SK_SPREAD=1: more pieces than the grid holds, dealt round-robin K offset first;
    the plan weighs each piece's sum at `red` K tiles (0: cut as finely as allowed; 1000:
    never cut)."""
    plans = _play(header, "-DL2GEN_SK_SPREAD=1", f"-DRED={red}")
    rounds = [(tiles - dp) * pieces / ctas for tiles, kt, grid, dp, ctas, pieces in plans if ctas]
    if red == 1000:
        assert all(pieces <= 1 for *_, pieces in plans)
    else:  # some launches give a CTA pieces of several left-over tiles
        assert max(rounds) > 1
