"""Properties of the rule table on random programs: every diagnostic comes from a rule of
the program's family and is located at one of the decisions that rule concerns."""

from hypothesis import given

from l2gen.check import check, violations
from l2gen.targets import GPUS

from .strategies import any_program


@given(any_program())
def test_every_diagnostic_is_a_rule_of_the_family_at_its_decisions(program):
    for gpu in GPUS.values():
        found = violations(program, gpu)
        assert [d for _, d in found] == check(program, gpu)
        for rule, d in found:
            assert program.family in rule.families and d.code == rule.code
            assert any(d.span == program.span_of(x) for x in rule.decisions), (rule.name, str(d))
