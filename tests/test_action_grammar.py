"""--grammar: the four-tag GBNF with the domain's own action rule (so a small local model emits runnable actions)."""
from __future__ import annotations

import re

import pytest

from uqh.domains.domain_registry import domain_names, get_domain_class
from uqh.cli import main
from uqh.harness.model.client import grammar_text
from test_runner import solver


def _action_rule(grammar: str) -> str:
    (line,) = [ln for ln in grammar.splitlines() if ln.startswith("action ")]
    return line


def test_generic_grammar_keeps_free_text_action():
    assert _action_rule(grammar_text()) == _action_rule(grammar_text(None))
    assert "[^<" in _action_rule(grammar_text())


@pytest.mark.parametrize("name", ["arithmetic", "strategyqa", "hotpotqa", "webshop", "tau2-retail"])
def test_domain_rule_replaces_only_the_action_line(name):
    rule = get_domain_class(name).action_gbnf
    assert rule, f"{name} has no action grammar"
    composed, generic = grammar_text(rule).splitlines(), grammar_text().splitlines()
    assert len(composed) == len(generic)
    differing = [(a, b) for a, b in zip(composed, generic) if a != b]
    assert len(differing) == 1 and differing[0][0] == f"action      ::= {rule}"


def _gbnf_literals(rule: str) -> list[str]:
    return [m.replace('\\"', '"') for m in re.findall(r'"((?:[^"\\]|\\.)*)"', rule)]


@pytest.mark.parametrize(
    "name,tools",
    [("arithmetic", ["Calc[", "Finish["]), ("strategyqa", ["Search[", "Lookup[", "Finish[yes]", "Finish[no]"]),
     ("hotpotqa", ["Search[", "Lookup[", "Finish["]), ("webshop", ["Search[", "Click["]),
     ("tau2-airline", ["Tool[", 'Respond["'])],
)
def test_action_rules_name_exactly_the_prompt_tools(name, tools):
    literals = _gbnf_literals(get_domain_class(name).action_gbnf)
    starts = [lit for lit in literals if lit[:1].isalpha()]
    assert sorted(starts) == sorted(tools)


def test_every_domain_declares_an_action_rule():
    assert all(get_domain_class(n).action_gbnf for n in domain_names())


def test_run_sends_the_domain_grammar_only_with_flag(fake_server, tmp_path):
    with fake_server(solver) as srv:
        base = ["run", "--domain", "arithmetic", "--model", "openai/fake", "--api-base", srv.base_url, "--tasks", "1",
                "--no-progress"]
        assert main([*base, "--grammar", "--out", str(tmp_path / "g")]) == 0
        with_flag = srv.requests[-1]
        n = len(srv.requests)
        assert main([*base, "--out", str(tmp_path / "plain")]) == 0
        without_flag = srv.requests[n:]
    assert _action_rule(with_flag["grammar"]) == f"action      ::= {get_domain_class('arithmetic').action_gbnf}"
    assert all("grammar" not in body for body in without_flag)
