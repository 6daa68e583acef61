"""The LLM policy against a loopback OpenAI-compatible server (no network, no model).

The server answers ``/v1/responses`` and ``/v1/chat/completions`` from a per-test script,
so each behaviour (valid answers, parse and checker errors, repair, empty answers, slow
answers, 429, 5xx, 401, unknown model, mode fallback, budgets) is exercised through the real
``openai`` client.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("openai")  # the 'llm' extra

from l2gen.parse import grammar_text, parse
from l2gen.printer import format_program
from l2gen.problem import Measurement, Shape
from l2gen.search.llm import (
    ENV_API_KEY,
    ENV_BASE_URL,
    ENV_MODEL,
    TOOL_NAME,
    LLMConfig,
    LLMConfigError,
    LLMError,
    LLMPolicy,
    extract_program_text,
    read_answer,
)
from l2gen.targets import GPUS

H200 = GPUS["h200"]
SHAPE = Shape(128, 4096, 4096)
OTHER = Shape(256, 4096, 4096)

VALID_SM80 = "kernel a {\n    arch sm80\n    tile 64 x 128 x 64\n    warps 2 x 2\n    stages 4\n}"
VALID_SM90 = "kernel b { arch sm90a tile 128 x 256 x 64 cluster 2 x 1 x 1 mainloop cooperative }"
PARSE_BAD = "kernel c {\n    arch sm70\n    tile 64 x 64 x 64\n}"
CHECK_BAD = "kernel d {\n    arch sm80\n    tile 128 x 128 x 64\n    warps 2 x 2\n    stages 8\n}"
# Distinct valid programs, for tests that need many answers none of which is a repeat.
VARIANTS = [
    f"kernel v{i} {{ arch sm80 tile 64 x 128 x 64 warps 2 x 2 stages {2 + i % 7} swizzle {i // 7} }}"
    for i in range(28)
]
USAGE = (100, 10)  # (input, output) tokens every scripted answer reports


# -- the loopback server ------------------------------------------------------------------


@dataclass
class Reply:
    """One scripted answer: a 200 carrying ``text``, or an error ``status``."""

    text: str = ""
    status: int = 200
    message: str = ""
    code: str | None = None
    delay: float = 0.0
    usage: tuple | None = USAGE


def answer(text, **kw) -> Reply:
    return Reply(text=text, **kw)


def error(status, message="error", code=None) -> Reply:
    return Reply(status=status, message=message, code=code)


def distinct(wrap=lambda text: text):
    """A reply function that answers each request with the next of VARIANTS."""
    it = iter(VARIANTS)
    return lambda path, body: answer(wrap(next(it)))


class FakeOpenAI:
    """An OpenAI-compatible HTTP server on 127.0.0.1 that replies from a script.

    ``script`` entries are Reply objects or callables ``(path, body) -> Reply``; when the
    script runs out, ``default`` answers. Every request is recorded as (path, body)."""

    def __init__(self):
        self.script: collections.deque = collections.deque()
        self.default: Reply = error(500, "script exhausted")
        self.requests: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                path = self.path.split("?")[0]
                with fake._lock:
                    fake.requests.append((path, body))
                    reply = fake.script.popleft() if fake.script else fake.default
                if callable(reply):
                    reply = reply(path, body)
                if path not in ("/v1/responses", "/v1/chat/completions"):
                    reply = error(404, "Not Found")
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.status != 200:
                    payload = {"error": {"message": reply.message, "type": "error", "code": reply.code}}
                else:
                    payload = fake._wire(path, body, reply)
                data = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def add(self, *replies) -> None:
        self.script.extend(replies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _wire(path: str, body: dict, reply: Reply) -> dict:
        tin, tout = reply.usage or (0, 0)
        if path == "/v1/responses":
            out = {
                "id": "resp_1",
                "object": "response",
                "created_at": 0,
                "model": body.get("model"),
                "status": "completed",
                "output": [
                    {
                        "type": "custom_tool_call",
                        "id": "ctc_1",
                        "call_id": "call_1",
                        "name": TOOL_NAME,
                        "input": reply.text,
                        "status": "completed",
                    }
                ],
                "parallel_tool_calls": False,
                "tool_choice": body.get("tool_choice"),
                "tools": body.get("tools", []),
            }
            if reply.usage:
                out["usage"] = {"input_tokens": tin, "output_tokens": tout, "total_tokens": tin + tout}
            return out
        out = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": "stop"}
            ],
        }
        if reply.usage:
            out["usage"] = {"prompt_tokens": tin, "completion_tokens": tout, "total_tokens": tin + tout}
        return out


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def server():
    s = FakeOpenAI()
    yield s
    s.close()


def make(server, mode="text", **kw) -> LLMPolicy:
    cfg = dict(
        base_url=server.base_url,
        api_key="test-key",
        model="fake-model",
        mode=mode,
        timeout_s=2.0,
        max_retries=2,
        backoff_s=0.01,
    )
    cfg.update(kw)
    return LLMPolicy(LLMConfig(**cfg), H200)


def fenced(text: str) -> str:
    return f"Here is a kernel.\n\n```l2gen\n{text}\n```\nIt should be fast."


# -- configuration ------------------------------------------------------------------------


def test_config_names_every_missing_variable():
    with pytest.raises(LLMConfigError) as exc:
        LLMConfig.from_env({})
    for var in (ENV_BASE_URL, ENV_API_KEY, ENV_MODEL):
        assert var in str(exc.value)
    with pytest.raises(LLMConfigError) as exc:
        LLMConfig.from_env({ENV_BASE_URL: "http://h/v1", ENV_API_KEY: "k"})
    assert ENV_MODEL in str(exc.value) and ENV_API_KEY not in str(exc.value)


def test_config_from_env_and_explicit_arguments():
    env = {ENV_BASE_URL: "http://h/v1", ENV_API_KEY: "k", ENV_MODEL: "m", "L2GEN_LLM_MODE": "text"}
    cfg = LLMConfig.from_env(env)
    assert (cfg.base_url, cfg.api_key, cfg.model, cfg.mode) == ("http://h/v1", "k", "m", "text")
    cfg = LLMConfig.from_env(env, model="other", mode=None, max_requests_per_shape=3)
    assert cfg.model == "other" and cfg.mode == "text" and cfg.max_requests_per_shape == 3
    with pytest.raises(LLMConfigError, match="mode"):
        LLMConfig.from_env(env, mode="telepathy")


def test_auto_mode_picks_by_server():
    assert LLMConfig("https://api.openai.com/v1", "k", "m").first_modes() == ["responses_grammar", "text"]
    assert LLMConfig("http://localhost:8000/v1", "k", "m").first_modes() == ["chat_grammar", "text"]
    assert LLMConfig("http://localhost:8000/v1", "k", "m", mode="text").first_modes() == ["text"]


# -- reading answers ----------------------------------------------------------------------


def test_extract_program_text():
    assert extract_program_text(fenced(VALID_SM80)) == VALID_SM80
    assert extract_program_text("```\n" + VALID_SM90 + "\n```") == VALID_SM90
    prose = "Try this: kernel x { arch sm80 # a { brace in a comment\n tile 64 x 64 x 64 } and more }"
    assert extract_program_text(prose) == "kernel x { arch sm80 # a { brace in a comment\n tile 64 x 64 x 64 }"
    assert extract_program_text("I cannot help with that.") is None


def test_read_answer_reports_located_diagnostics():
    program, diags = read_answer(VALID_SM80, H200)
    assert program is not None and diags == []
    program, diags = read_answer(PARSE_BAD, H200)
    assert program is None and diags[0].code == "E-PARSE" and str(diags[0]).startswith("answer.l2:2:")
    program, diags = read_answer(CHECK_BAD, H200)
    assert program is not None and [d.code for d in diags] == ["E-SMEM"]
    assert read_answer("  ", H200)[1][0].code == "E-EMPTY"
    assert read_answer("no kernel here", H200)[1][0].code == "E-NOPROGRAM"


# -- the three modes ----------------------------------------------------------------------


def test_text_mode_valid_answers_and_token_counts(server):
    server.add(answer(fenced(VALID_SM80)), answer(VALID_SM90))
    policy = make(server, "text")
    proposals = policy.propose(SHAPE, [], 2)
    assert [p.program for p in proposals] == [parse(VALID_SM80), parse(VALID_SM90)]
    assert all(not p.meta.get("rejected") for p in proposals)
    usage = policy.stats.per_shape[SHAPE]
    assert (usage.requests, usage.input_tokens, usage.output_tokens, usage.rejected) == (2, 200, 20, 0)
    assert policy.stats.total.tokens == 220
    path, body = server.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "fake-model"
    assert "structured_outputs" not in body
    # the second request of a round is told what the first proposed
    assert "kernel a {" in server.requests[1][1]["messages"][1]["content"]


def test_chat_grammar_mode_sends_the_grammar(server):
    server.add(answer(VALID_SM80))
    policy = make(server, "chat_grammar")
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.program == parse(VALID_SM80) and p.meta["mode"] == "chat_grammar"
    body = server.requests[0][1]
    assert body["structured_outputs"] == {"grammar": grammar_text()}
    assert grammar_text() in body["messages"][0]["content"]


def test_responses_grammar_mode_forces_the_custom_tool(server):
    server.add(answer(VALID_SM90))
    policy = make(server, "responses_grammar")
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.program == parse(VALID_SM90)
    path, body = server.requests[0]
    assert path == "/v1/responses"
    (tool,) = body["tools"]
    assert tool["type"] == "custom" and tool["name"] == TOOL_NAME
    assert tool["format"] == {"type": "grammar", "syntax": "lark", "definition": grammar_text()}
    assert body["tool_choice"] == {"type": "custom", "name": TOOL_NAME}
    assert policy.stats.total.input_tokens == 100 and policy.stats.total.output_tokens == 10


def test_missing_usage_is_estimated(server):
    server.add(answer(VALID_SM80, usage=None))
    policy = make(server)
    policy.propose(SHAPE, [], 1)
    assert policy.stats.total.input_tokens > 0 and policy.stats.total.output_tokens > 0


# -- bad answers: repair and rejection ----------------------------------------------------


def test_parse_error_then_valid_repair(server):
    server.add(answer(fenced(PARSE_BAD)), answer(fenced(VALID_SM80)))
    policy = make(server)
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.program == parse(VALID_SM80)
    assert p.meta["repaired"] and p.meta["first_diagnostics"][0].startswith("answer.l2:2:")
    assert "(repaired)" in p.note
    repair = server.requests[1][1]["messages"][1]["content"]
    assert "E-PARSE" in repair and "arch sm70" in repair
    usage = policy.stats.per_shape[SHAPE]
    assert (usage.requests, usage.repairs, usage.repaired, usage.rejected) == (2, 1, 1, 0)


def test_checker_error_twice_is_rejected_with_diagnostics(server):
    server.add(answer(CHECK_BAD), answer(CHECK_BAD))
    policy = make(server)
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.meta["rejected"] and "unparsed" not in p.meta
    assert p.program == parse(CHECK_BAD)  # the program is kept: the search records it
    assert any("E-SMEM" in d for d in p.meta["diagnostics"])
    assert "E-SMEM" in p.note
    assert "E-SMEM" in server.requests[1][1]["messages"][1]["content"]
    assert policy.stats.per_shape[SHAPE].rejected == 1


def test_empty_and_nonsense_answers_are_rejected_and_the_search_goes_on(server):
    server.add(answer(""), answer("I am sorry, I cannot write kernels."), answer(VALID_SM80))
    policy = make(server, repair=False)
    first, second, third = policy.propose(SHAPE, [], 3)
    assert first.meta["rejected"] and first.meta["unparsed"] and "E-EMPTY" in first.meta["diagnostics"][0]
    assert second.meta["rejected"] and "E-NOPROGRAM" in second.meta["diagnostics"][0]
    assert not third.meta.get("rejected") and third.program == parse(VALID_SM80)
    assert policy.stats.total.rejected == 2 and policy.stats.total.requests == 3


def test_a_repeat_is_asked_again(server):
    server.add(answer(VALID_SM80), answer(VALID_SM80.replace("kernel a", "kernel renamed")), answer(VALID_SM90))
    policy = make(server)
    first, second = policy.propose(SHAPE, [], 2)
    assert first.program == parse(VALID_SM80) and second.program == parse(VALID_SM90)
    assert not second.meta["duplicate"]
    followup = server.requests[2][1]["messages"][1]["content"]
    assert "repeats a program" in followup and "kernel renamed" in followup
    usage = policy.stats.per_shape[SHAPE]
    assert (usage.requests, usage.reasks, usage.repeats) == (3, 1, 0)


def test_a_repeat_of_a_measured_program_that_stays_a_repeat_is_flagged(server):
    server.add(answer(VALID_SM80), answer(VALID_SM80))
    policy = make(server)
    (p,) = policy.propose(SHAPE, [_measure(SHAPE, VALID_SM80, time_us=8.0)], 1)
    assert p.meta["duplicate"] and "(repeat)" in p.note
    assert policy.stats.total.repeats == 1 and policy.stats.total.reasks == 1


# -- transport failures -------------------------------------------------------------------


def test_rate_limit_then_success_is_retried(server):
    server.add(error(429, "slow down"), answer(VALID_SM80))
    policy = make(server)
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.program == parse(VALID_SM80)
    assert policy.stats.total.retries == 1 and policy.stats.total.requests == 1
    assert len(server.requests) == 2


def test_slow_answer_times_out_and_is_retried(server):
    server.add(answer(VALID_SM80, delay=1.0), answer(VALID_SM90))
    policy = make(server, timeout_s=0.3)
    start = time.monotonic()
    (p,) = policy.propose(SHAPE, [], 1)
    assert time.monotonic() - start < 1.0
    assert p.program == parse(VALID_SM90)
    assert policy.stats.total.retries == 1


def test_server_errors_exhaust_retries_then_raise(server):
    server.default = error(500, "upstream exploded")
    policy = make(server, max_retries=1, max_failures=2)
    # A round with no answer at all is an error, not a rejected program (nothing to record).
    with pytest.raises(LLMError, match="upstream exploded"):
        policy.propose(SHAPE, [], 1)
    assert policy.stats.total.retries == 1 and policy.stats.total.failures == 1
    with pytest.raises(LLMError):  # later calls fail at once, without a request
        policy.propose(SHAPE, [], 1)
    assert len(server.requests) == 2


def test_failures_in_a_row_reset_on_success(server):
    server.add(error(503), error(503), answer(VALID_SM80), error(503), error(503))
    policy = make(server, max_retries=1, max_failures=2, repair=False)
    # The unanswered requests are left out (not rejected programs); the answer is kept,
    # and the failure after it is one in a row again, not two.
    (only,) = policy.propose(SHAPE, [], 3)
    assert not only.meta.get("rejected")
    assert policy.stats.total.failures == 2


def test_bad_key_raises_once_clearly(server):
    server.add(error(401, "Incorrect API key provided"))
    policy = make(server)
    with pytest.raises(LLMError, match=ENV_API_KEY) as exc:
        policy.propose(SHAPE, [], 3)
    assert "Incorrect API key" in str(exc.value)
    with pytest.raises(LLMError):  # later calls fail at once, without a request
        policy.propose(OTHER, [], 1)
    assert len(server.requests) == 1


def test_unknown_model_raises_clearly(server):
    server.add(error(404, "The model `fake-model` does not exist.", code="model_not_found"))
    policy = make(server, mode="chat_grammar")
    with pytest.raises(LLMError, match=ENV_MODEL) as exc:
        policy.propose(SHAPE, [], 1)
    assert "fake-model" in str(exc.value)
    assert policy.stats.fallbacks == []  # a missing model is not a reason to change mode


def test_auto_falls_back_to_text_and_remembers(server):
    def grammar_unsupported(path, body):
        if "structured_outputs" in body:
            return error(400, "structured_outputs is not supported")
        return texts(path, body)

    texts = distinct(fenced)
    server.default = grammar_unsupported
    policy = make(server, mode="auto")
    assert policy.stats.mode == "chat_grammar"
    policy.propose(SHAPE, [], 1)
    policy.propose(OTHER, [], 2)
    assert policy.stats.mode == "text"
    assert len(policy.stats.fallbacks) == 1 and "chat_grammar -> text" in policy.stats.fallbacks[0]
    constrained = [b for _, b in server.requests if "structured_outputs" in b]
    assert len(constrained) == 1 and len(server.requests) == 4
    assert policy.stats.total.requests == 3  # the rejected constrained request is not counted twice


def test_auto_against_openai_uses_responses_then_falls_back(server):
    import openai

    server.add(error(404, "Not Found"), answer(VALID_SM80))
    cfg = LLMConfig("https://api.openai.com/v1", "k", "m", backoff_s=0.01)
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=2.0)
    policy = LLMPolicy(cfg, H200, client=client)
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.program == parse(VALID_SM80)
    assert [path for path, _ in server.requests] == ["/v1/responses", "/v1/chat/completions"]


def test_grammar_rejected_by_a_fixed_mode_is_an_error(server):
    server.add(error(400, "unknown field structured_outputs"))
    policy = make(server, mode="chat_grammar")
    with pytest.raises(LLMError, match="400"):
        policy.propose(SHAPE, [], 1)


# -- budgets and memory -------------------------------------------------------------------


def test_request_budget_ends_proposals_for_the_shape(server):
    server.default = distinct()
    policy = make(server, max_requests_per_shape=2)
    assert len(policy.propose(SHAPE, [], 5)) == 2
    assert policy.exhausted(SHAPE) and policy.propose(SHAPE, [], 1) == []
    assert len(policy.propose(OTHER, [], 1)) == 1  # other shapes have their own budget
    assert policy.stats.total.requests == 3


def test_token_budget_ends_proposals_for_the_shape(server):
    server.default = distinct()  # 110 tokens per request
    policy = make(server, max_tokens_per_shape=250)
    assert len(policy.propose(SHAPE, [], 10)) == 3
    assert policy.propose(SHAPE, [], 1) == []


def test_no_repair_when_the_budget_is_spent(server):
    server.add(answer(CHECK_BAD), answer(VALID_SM80))
    policy = make(server, max_requests_per_shape=1)
    (p,) = policy.propose(SHAPE, [], 1)
    assert p.meta["rejected"] and len(server.requests) == 1


def _measure(shape, text, status="ok", time_us=None, error_text=None):
    return Measurement(shape, parse(text), status, time_us=time_us, baseline_us=10.0 if time_us else None, error=error_text)


def test_prompt_shows_best_worst_and_similar_shapes(server):
    server.default = distinct()
    policy = make(server)
    fast = "kernel fast { arch sm80 tile 64 x 64 x 64 warps 2 x 2 stages 3 }"
    slow = "kernel slow { arch sm80 tile 128 x 128 x 32 warps 2 x 2 stages 2 smem_swizzle 2 3 3 }"
    history = [_measure(SHAPE, fast, time_us=5.0), _measure(SHAPE, slow, time_us=20.0)]
    (p,) = policy.propose(SHAPE, history, 1)
    policy.update(SHAPE, [(p, _measure(SHAPE, VARIANTS[0], "build_error", error_text="nvcc: boom\nmore"))])
    policy.propose(SHAPE, history, 1)
    prompt = policy.prompts[-1]
    assert "2.000x" in prompt and "kernel fast {" in prompt
    assert "0.500x" in prompt and "build_error (nvcc: boom)" in prompt
    assert "M=128 N=4096 K=4096" in prompt and "Floor time" in prompt
    # a nearby shape sees the best of this one
    policy.propose(OTHER, [], 1)
    assert "128x4096x4096: 2.000x" in policy.prompts[-1] and "kernel fast {" in policy.prompts[-1]


def test_unparsed_proposals_are_not_remembered(server):
    server.add(answer(""))
    policy = make(server, repair=False)
    (p,) = policy.propose(SHAPE, [], 1)
    policy.update(SHAPE, [(p, Measurement(SHAPE, p.program, "rejected", error="E-EMPTY"))])
    assert "unparsed" not in policy.prompts[-1]
    policy.propose(SHAPE, [], 0)
    assert policy._examples(SHAPE).measured == 0


def test_stats_as_dict_is_json():
    policy = LLMPolicy(LLMConfig("http://h/v1", "k", "m"), H200)
    policy._usage(SHAPE).requests = 2
    data = json.loads(json.dumps(policy.stats.as_dict()))
    assert data["per_shape"]["128x4096x4096"]["requests"] == 2 and data["mode"] == "chat_grammar"


def test_policy_satisfies_the_interface():
    policy = LLMPolicy(LLMConfig("http://h/v1", "k", "m"), H200)
    assert policy.name == "llm" and callable(policy.propose) and callable(policy.update)
    assert policy.propose(SHAPE, [], 0) == []


# -- the grammar under llguidance ---------------------------------------------------------


class _ByteTokenizer:
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@pytest.fixture(scope="module")
def matcher():
    llguidance = pytest.importorskip("llguidance")
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()), slices=[])
    grammar = llguidance.LLMatcher.grammar_from_lark(grammar_text())
    assert llguidance.LLMatcher.validate_grammar(grammar, tokenizer) == ""

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        ok = m.consume_tokens(list(text.encode()))
        return bool(ok) and not m.is_error() and m.is_accepting()

    return accepts


@pytest.mark.parametrize("text", [VALID_SM80, VALID_SM90, CHECK_BAD])
def test_llguidance_accepts_canonical_programs(matcher, text):
    canonical = format_program(parse(text)).strip()  # no leading comment, no trailing newline
    assert matcher(canonical)
    assert matcher(" ".join(canonical.split()))  # the one-line form the prompts show


@pytest.mark.parametrize("text", [PARSE_BAD, "kernel x { arch sm80 tile 64 x 64 }", "kernel { arch sm80 }"])
def test_llguidance_rejects_malformed_programs(matcher, text):
    assert not matcher(text)


def test_fatal_error_mid_round_keeps_the_proposals_already_made(server):
    server.add(answer(VALID_SM80), error(401, "key revoked"))
    policy = make(server)
    (p,) = policy.propose(SHAPE, [], 3)
    assert p.program == parse(VALID_SM80)
    with pytest.raises(LLMError, match="key revoked"):
        policy.propose(SHAPE, [], 1)
    assert len(server.requests) == 2


def test_an_unreachable_server_stops_the_tune_and_records_nothing(server, tmp_path):
    """No answer is not a rejected program: the shape must not end up 'done' with rows
    that say the programs were bad, and the tune must end in an error."""
    from l2gen.db import KernelDB
    from l2gen.search.loop import tune
    from l2gen.search.simulate import SimulatedEvaluator

    server.default = error(503, "the server is down")
    policy = make(server, max_retries=0, max_failures=3)
    with KernelDB(tmp_path / "k.db") as db:
        with pytest.raises(LLMError, match="no answer from the LLM server"):
            tune([SHAPE], policy, SimulatedEvaluator(H200), db, budget=2, batch=2, gpu=H200, progress=False)
        assert db.count() == 0 and db.history(H200, SHAPE) == []


def test_the_cli_says_so_and_exits_1_when_the_server_is_unreachable(tmp_path, monkeypatch, capsys):
    from l2gen.cli import main
    from l2gen.search import llm

    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("L2GEN_LLM_MODEL", "m")
    real = llm.LLMConfig.from_env
    monkeypatch.setattr(llm.LLMConfig, "from_env", classmethod(lambda cls, env=None, **kw: replace(real(env, **kw), max_retries=0, timeout_s=1.0)))
    db = tmp_path / "k.db"
    rc = main(["tune", "--simulate", "--policy", "llm", "--llm-base-url", "http://127.0.0.1:9/v1", "--budget", "2",
               "--shape", "64x4096x4096", "--db", str(db)])
    err = capsys.readouterr().err
    assert rc == 1 and "the LLM policy stopped" in err and "Traceback" not in err
    import sqlite3

    assert sqlite3.connect(db).execute("SELECT count(*) FROM measurements").fetchone()[0] == 0


def test_the_shape_facts_name_the_tile_widths_that_fill_the_sms():
    from l2gen.search.llm_prompt import shape_facts, wave_fits

    # the prefill rows' winners: 2048 x 3584 is 224 tiles of 128 x 256 (1.7 waves) but 256
    # of 128 x 224; 4096 x 1280 is 256 tiles of 128 x 160; 2048 x 4608 384 of 128 x 192
    for (m, n, k), best in (((2048, 3584, 3584), (128, 224)), ((4096, 1280, 8192), (128, 160)), ((2048, 4608, 3584), (128, 192))):
        fits = wave_fits(Shape(m, n, k), GPUS["h200"])
        assert fits[0][:2] == best and fits[0][4] > 0.96, fits
    assert "128x224: 256 tiles, 97% of 2 waves" in shape_facts(Shape(2048, 3584, 3584), GPUS["h200"])
