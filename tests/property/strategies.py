"""Hypothesis strategies over the decision space (l2gen.space)."""

from hypothesis import strategies as st

from l2gen.ir import Family
from l2gen.space import SLOTS, assemble, random_program, sanitize
from l2gen.targets import GPUS

H200 = GPUS["h200"]


@st.composite
def any_program(draw, family=None):
    """A program with every slot drawn independently: valid or not."""
    fam = draw(st.sampled_from(list(Family))) if family is None else family
    choices = {slot.name: draw(st.sampled_from(slot.choices)) for slot in SLOTS[fam]}
    return assemble(fam, choices)


@st.composite
def valid_program(draw, family=None, gpu=H200):
    """A program the checker accepts (rejection sampling driven by a hypothesis random)."""
    rng = draw(st.randoms(use_true_random=False))
    return sanitize(random_program(rng, gpu, family))
