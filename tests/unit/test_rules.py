"""The checker's rules as data: every rule is enforced, every rule is stated in the LLM
prompt, and the prompt states no rule the table does not hold."""

import itertools
import re
from dataclasses import replace

import pytest

from l2gen.check import check, violations
from l2gen.diagnostics import DiagnosticError
from l2gen.ir import Family
from l2gen.limits import SM80_TILE_K, SM80_TILE_M, SM80_TILE_N, SM80_WARPS, sm90_stages_and_smem
from l2gen.parse import grammar_text, parse
from l2gen.printer import format_program
from l2gen.rules import BY_NAME, RULES, rules_for
from l2gen.search.llm_prompt import EVERY_PROGRAM, FAMILY_LABELS, instructions, rules_text
from l2gen.targets import GPUS
from tests.unit.programs import l2gen as l2, sm80, sm90

H = GPUS["h200"]
A = GPUS["a100"]
MODES = ("text", "chat_grammar", "responses_grammar")


# rule name -> (a program that breaks that rule and no other, the target)
BREAKS = {
    "arch": (sm90("tile 128 x 128 x 64"), A),
    "sm80.tile": (sm80("tile 100 x 128 x 32"), H),
    "sm80.warps": (sm80("tile 128 x 128 x 32 warps 3 x 2"), H),
    "sm80.threads": (sm80("tile 128 x 128 x 32 warps 4 x 4"), H),
    "sm80.warp_rows": (sm80("tile 32 x 128 x 32 warps 4 x 1"), H),
    "sm80.warp_cols": (sm80("tile 128 x 32 x 32 warps 1 x 4"), H),
    "sm80.copy": (sm80("tile 16 x 64 x 32 warps 1 x 4"), H),
    "sm80.accumulators": (sm80("tile 256 x 256 x 32 warps 2 x 2"), H),
    "sm80.split_k": (sm80("tile 128 x 128 x 32 split_k cluster"), H),
    "sm80.stages": (sm80("tile 128 x 128 x 32 stages 1"), H),
    "sm80.smem_swizzle": (sm80("tile 128 x 128 x 32 smem_swizzle 3 2 3"), H),
    "sm80.smem": (sm80("tile 128 x 128 x 64 warps 2 x 2 stages 8"), H),
    "sm80.min_blocks": (sm80("tile 128 x 128 x 32 min_blocks 9"), H),
    "sm80.occupancy_smem": (sm80("tile 128 x 128 x 64 stages 4 min_blocks 2"), H),
    "sm80.registers": (sm80("tile 128 x 256 x 32 warps 2 x 4 min_blocks 2 stages 2"), H),
    "sm80.splits": (sm80("tile 128 x 128 x 32 splits 4"), H),
    "sm90.tile": (sm90("tile 96 x 128 x 64"), H),
    "sm90.cluster": (sm90("tile 128 x 128 x 64 cluster 3 x 1 x 1"), H),
    "sm90.cluster_k": (sm90("tile 128 x 128 x 64 cluster 1 x 1 x 2"), H),
    "sm90.cluster_size": (sm90("tile 128 x 128 x 64 cluster 4 x 4 x 1"), H),
    "sm90.cooperative": (sm90("tile 64 x 128 x 64 mainloop cooperative"), H),
    "sm90.stream_k": (sm90("tile 128 x 128 x 64 mainloop pingpong scheduler stream_k"), H),
    "sm90.accumulators": (sm90("tile 128 x 256 x 64 mainloop pingpong"), H),
    "sm90.stages": (sm90("tile 128 x 128 x 64 stages 9"), H),
    "sm90.room": (sm90("tile 256 x 192 x 128 mainloop cooperative"), H),
    "sm90.smem": (sm90("tile 128 x 256 x 128 stages 7"), H),
    "sm90.epilogue_tile": (sm90("tile 128 x 128 x 64 epilogue_tile 48"), H),
    "sm90.epilogue_stages": (sm90("tile 128 x 128 x 64 epilogue_stages 5"), H),
    "sm90.splits": (sm90("tile 128 x 128 x 64 splits 2"), H),
    "sm90.decomposition": (sm90("tile 128 x 128 x 64 decomposition stream_k"), H),
    "sm90.fixed_splits": (sm90("tile 128 x 128 x 64 scheduler stream_k splits 2 decomposition data_parallel"), H),
    "l2gen.tile": (l2("tile 128 x 100 x 64 b nk"), H),
    "l2gen.n_major": (l2("tile 64 x 40 x 64 b kn"), H),
    "l2gen.accumulators": (l2("tile 256 x 192 x 64 stages 3"), H),
    "l2gen.split_k": (l2("tile 64 x 128 x 64 split_k parallel"), H),
    "l2gen.cluster": (l2("tile 128 x 128 x 64 cluster 3 x 1 x 1"), H),
    "l2gen.cluster_k": (l2("tile 128 x 128 x 64 cluster 2 x 1 x 2"), H),
    "l2gen.cluster_size": (l2("tile 128 x 128 x 64 cluster 4 x 4 x 1"), H),
    "l2gen.cluster_split_k": (l2("tile 128 x 128 x 64 split_k cluster cluster 2 x 1 x 1"), H),
    "l2gen.multicast_pieces": (l2("tile 16 x 128 x 64 swap_ab on cluster 1 x 4 x 1"), H),
    "l2gen.stages": (l2("tile 64 x 128 x 64 stages 17"), H),
    "l2gen.smem": (l2("tile 128 x 256 x 128 stages 8"), H),
    "l2gen.splits": (l2("tile 64 x 128 x 64 splits 2"), H),
    "l2gen.cluster_splits": (l2("tile 64 x 128 x 64 split_k cluster splits 9"), H),
    "l2gen.ordered_splits": (l2("tile 64 x 128 x 64 split_k ordered splits 17"), H),
    "l2gen.decomposition": (l2("tile 64 x 128 x 64 decomposition split_k"), H),
    "l2gen.stream_k": (l2("tile 64 x 128 x 64 decomposition stream_k"), H),
    "l2gen.stream_k_splits": (l2("tile 64 x 128 x 64 split_k atomic splits 2 decomposition stream_k"), H),
    "knobs.swizzle": (sm80("tile 128 x 128 x 32 swizzle 5"), H),
    "knobs.splits": (sm80("tile 128 x 128 x 32 split_k parallel splits 100"), H),
    "knobs.grid": (l2("tile 128 x 128 x 64 cluster 2 x 1 x 1 grid 121"), H),
}

# Rules no program in the other rules' bounds breaks: a guard, proved below.
UNREACHABLE = {
    # Every sm80 stage is a power of two of at least 16 x 32 = 512 elements, a multiple of
    # the largest swizzle period (64 << 3); the rule guards against wider tile ranges.
    "sm80.swizzle_period",
    # At most 256 threads (sm80.threads) times at most 4 blocks (sm80.min_blocks) is 1024.
    "sm80.occupancy_threads",
}


def _program(name: str):
    if name == "name":  # the grammar accepts identifiers only; the rule guards built programs
        return replace(parse(sm80("tile 128 x 128 x 32")), name="not-an-identifier"), H
    if name == "knobs.pdl":  # the parser takes pdl in l2gen programs only; the rule guards built ones
        program = parse(sm90("tile 128 x 128 x 64"))
        return replace(program, knobs=replace(program.knobs, pdl=True)), H
    if name == "knobs.grid_sm80":  # the parser takes grid in sm90a programs only; likewise
        program = parse(sm80("tile 128 x 128 x 32"))
        return replace(program, knobs=replace(program.knobs, grid=64)), H
    text, gpu = BREAKS[name]
    return parse(text, "p.l2"), gpu


def test_every_rule_has_a_case():
    assert not set(BREAKS) & UNREACHABLE
    covered = set(BREAKS) | UNREACHABLE | {"name", "knobs.pdl", "knobs.grid_sm80"}
    assert covered == set(BY_NAME), covered ^ set(BY_NAME)


@pytest.mark.parametrize("rule", [r for r in RULES if r.name not in UNREACHABLE], ids=lambda r: r.name)
def test_a_program_breaking_the_rule_gets_its_diagnostic(rule):
    program, gpu = _program(rule.name)
    found = violations(program, gpu)
    assert {r.name for r, _ in found} == {rule.name}, [f"{r.name}: {d}" for r, d in found]
    assert all(d.code == r.code for r, d in found)
    assert all(any(d.span == program.span_of(x) for x in r.decisions) for r, d in found)  # at its decisions
    assert [d for _, d in found] == check(program, gpu)


def test_unreachable_rules_never_fire():
    """Every sm80 tile, swizzle, warp grid and min_blocks the range rules allow."""
    fired = set()
    tiles = itertools.product(SM80_TILE_M, SM80_TILE_N, SM80_TILE_K, range(4))
    for bm, bn, bk, b in tiles:
        text = sm80(f"tile {bm} x {bn} x {bk} warps 1 x 1 smem_swizzle {b} 3 3")
        fired |= {r.name for r, _ in violations(parse(text), H)}
    for wm, wn, blocks in itertools.product(SM80_WARPS, SM80_WARPS, range(1, 5)):
        text = sm80(f"tile 256 x 256 x 64 warps {wm} x {wn} min_blocks {blocks}")
        fired |= {r.name for r, _ in violations(parse(text), H)}
    assert not fired & UNREACHABLE


def test_the_table_is_well_formed():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    grammar = grammar_text()
    for i, r in enumerate(RULES):
        assert r.code.startswith("E-") and r.families and r.decisions
        assert all(f'"{d}"' in grammar for d in r.decisions if d != "name"), r.decisions
        earlier = {e.name: e for e in RULES[:i]}
        for name in r.after:  # a rule waits only on earlier rules that run where it runs
            assert name in earlier and set(r.families) <= set(earlier[name].families), (r.name, name)
        for gpu in GPUS.values():
            stated = r.state(gpu)
            assert ";" not in stated and "{" not in stated.replace("in {", "") and not stated.endswith(".")


def _rules_section(gpu, mode):
    text = instructions(gpu, mode)
    head = f"Rules the checker enforces on {gpu.name} (a program that breaks one is rejected unmeasured):\n"
    assert head in text
    return text.split(head, 1)[1].split("\n\n", 1)[0]


@pytest.mark.parametrize("gpu", GPUS.values(), ids=lambda g: g.name)
@pytest.mark.parametrize("mode", MODES)
def test_the_prompt_states_every_rule_of_the_families_the_gpu_runs(gpu, mode):
    section = _rules_section(gpu, mode)
    assert section == rules_text(gpu)
    for family in gpu.families():
        for r in rules_for(family):
            assert r.state(gpu) in section, r.name


@pytest.mark.parametrize("gpu", GPUS.values(), ids=lambda g: g.name)
def test_the_prompt_states_no_rule_outside_the_table(gpu):
    labels = {FAMILY_LABELS[f]: f for f in gpu.families()}
    for line in _rules_section(gpu, "text").splitlines():
        assert line.startswith("- ") and line.endswith("."), line
        label, body = line[2:-1].split(": ", 1)
        if label == EVERY_PROGRAM:
            table = [r for r in RULES if set(r.families) == set(Family)]
        else:
            table = [r for r in rules_for(labels[label]) if set(r.families) != set(Family)]
        assert body.split("; ") == [r.state(gpu) for r in table], label


def test_a_family_the_gpu_does_not_run_is_not_stated():
    section = rules_text(A)
    assert "sm90a" not in section and f"arch sm80 (what {A.name} runs)" in section


@pytest.mark.parametrize("text, at, words", [
    (l2("tile 128 x 128 x 64 grid 133"), "grid", "between 1 and 132"),
    (l2("tile 128 x 128 x 64 cluster 4 x 1 x 1 grid 66"), "grid", "whole clusters of 4"),
    (l2("tile 128 x 128 x 64 split_k cluster grid 64"), "split_k", "a cluster per tile"),
    (l2("tile 128 x 128 x 64 decomposition data_parallel grid 64"), "decomposition", "in waves"),
    (l2("tile 128 x 256 x 128 stages 6 grid 64"), "stages", "persistent kernel needs"),
    (sm90("tile 128 x 128 x 64 mainloop ws grid 64"), "mainloop", "a CTA per tile"),
])
def test_grid_is_refused_where_no_persistent_launch_can_keep_to_it(text, at, words):
    program = parse(text, "p.l2")
    found = [d for r, d in violations(program, H) if r.name == "knobs.grid"]
    assert len(found) == 1 and words in found[0].message, found
    assert found[0].span == program.span_of(at)


def test_grid_caps_the_persistent_kernels_and_is_printed_only_when_set():
    for text in (l2("tile 128 x 128 x 64 grid 120"), l2("tile 128 x 128 x 64 cluster 2 x 1 x 1 grid 64"),
                 l2("tile 64 x 128 x 64 split_k atomic decomposition stream_k grid 112"),
                 sm90("tile 128 x 128 x 64 mainloop cooperative cluster 2 x 1 x 1 grid 128"),
                 sm90("tile 128 x 128 x 64 mainloop pingpong grid 1")):
        program = parse(text)
        assert check(program, H) == [], text
        assert re.search(rf"\n +grid +{program.knobs.grid}\n", format_program(program))
        assert parse(format_program(program)) == program
    assert "grid" not in format_program(parse(l2("tile 128 x 128 x 64")))


@pytest.mark.parametrize("text, decision, words", [
    (sm90("tile 128 x 128 x 64 epilogue direct epilogue_tile 64"), "epilogue_tile", "only the TMA epilogue"),
    (sm90("tile 128 x 128 x 64 epilogue_tile 40"), "epilogue_tile", "a multiple of 16 that divides the tile's BN 128 (e.g. 16, 32, 64, 128)"),
    (sm90("tile 128 x 192 x 64 epilogue_tile 128"), "epilogue_tile", "divides the tile's BN 192"),
    (sm90("tile 128 x 128 x 64 epilogue direct epilogue_stages 2"), "epilogue_stages", "only the TMA epilogue"),
    (sm90("tile 128 x 128 x 64 epilogue_stages 5"), "epilogue_stages", "out of range 1..4"),
])
def test_an_epilogue_decision_is_refused_where_the_epilogue_cannot_stage_it(text, decision, words):
    program = parse(text, "p.l2")
    found = [d for r, d in violations(program, H) if r.name == f"sm90.{decision}"]
    assert len(found) == 1 and words in found[0].message, found
    assert found[0].span == program.span_of(decision)


def test_an_epilogue_tile_is_a_cutlass_decision_printed_only_when_set():
    for text in (sm90("tile 128 x 128 x 64 mainloop cooperative epilogue_tile 64"),
                 sm90("tile 64 x 256 x 64 mainloop pingpong epilogue_tile 256"),
                 sm90("tile 128 x 160 x 64 mainloop pingpong epilogue_tile 80")):
        program = parse(text)
        assert check(program, H) == [], text
        assert re.search(rf"\n +epilogue_tile +{program.config.epilogue_tile}\n", format_program(program))
        assert parse(format_program(program)) == program
    assert "epilogue_tile" not in format_program(parse(sm90("tile 128 x 128 x 64")))
    for text in (l2("tile 128 x 128 x 64 epilogue_tile 64"), sm80("tile 128 x 128 x 32 epilogue_tile 64")):
        with pytest.raises(DiagnosticError, match="E-FAMILY"):
            parse(text)


def test_a_store_depth_counts_in_the_shared_memory_and_prints_only_when_set():
    """Deeper store pipelines take shared memory from the mainloop's stages (auto) or exceed
    it (fixed stages), each decision at its own location."""
    shallow = parse(sm90("tile 128 x 256 x 64 mainloop cooperative epilogue_tile 256 epilogue_stages 1"))
    deep = parse(sm90("tile 128 x 256 x 64 mainloop cooperative epilogue_tile 256 epilogue_stages 2"))
    assert check(shallow, H) == [] and check(deep, H) == []
    assert sm90_stages_and_smem(shallow.config)[0] == 3 and sm90_stages_and_smem(deep.config)[0] == 2
    over = parse(sm90("tile 128 x 256 x 64 mainloop cooperative epilogue_tile 256 epilogue_stages 3"), "p.l2")
    assert any(r.name == "sm90.room" for r, _ in violations(over, H))
    for text in (sm90("tile 128 x 128 x 64 mainloop pingpong epilogue_tile 128 epilogue_stages 4"),
                 sm90("tile 256 x 128 x 64 mainloop cooperative epilogue_stages 3")):
        program = parse(text)
        assert check(program, H) == [], text
        assert re.search(rf"\n +epilogue_stages +{program.config.epilogue_stages}\n", format_program(program))
        assert parse(format_program(program)) == program
    assert "epilogue_stages" not in format_program(parse(sm90("tile 128 x 128 x 64 epilogue_tile 64")))
    for text in (l2("tile 128 x 128 x 64 epilogue_stages 2"), sm80("tile 128 x 128 x 32 epilogue_stages 2")):
        with pytest.raises(DiagnosticError, match="E-FAMILY"):
            parse(text)
