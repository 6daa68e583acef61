"""The LLM policy: an OpenAI-compatible model proposes l2gen programs.

Each proposal is one request that asks for one program (so a grammar-constrained server can
hold the answer to the grammar, which describes exactly one kernel). Three ways to ask:

``responses_grammar``
    OpenAI Responses API with a *custom tool* whose input format is the DSL grammar
    (``{"type": "grammar", "syntax": "lark", "definition": ...}``); ``tool_choice`` forces
    the call and the program is the tool call's ``input``.
``chat_grammar``
    Chat completions with vLLM's structured outputs,
    ``extra_body={"structured_outputs": {"grammar": ...}}`` (vLLM >= 0.10.2; the older
    ``guided_grammar`` field was removed in vLLM 0.12 and is not sent).
``text``
    Plain chat completions; the program is taken from a fenced block or the first balanced
    ``kernel NAME { ... }`` in the answer.

``auto`` starts with ``responses_grammar`` against api.openai.com and ``chat_grammar``
anywhere else, and falls back to ``text`` for the rest of the run when the server rejects
the constrained request (400, 404 that is not about the model, 422, 501).

Whatever the mode, every answer is parsed and checked here. An answer with diagnostics gets
one repair round (the diagnostics are sent back, ``file:line:col: code: message``); if it is
still wrong it becomes a *rejected* proposal carrying its diagnostics, which the search
records as data. Requests and tokens are counted per shape against budgets; a spent budget
makes :meth:`LLMPolicy.propose` return an empty list. A refused key, an unknown model or a
server that keeps failing raises :class:`LLMError`.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, Sequence
from urllib.parse import urlparse

from ..diagnostics import Diagnostic
from ..ir import BLayout, Family, Program, Sm80Config, Span, Tile
from ..parse import grammar_text
from ..targets import DEFAULT_GPU, Gpu, get_gpu
from ..problem import Measurement, Shape, program_key
from .base import Proposal
from .llm_prompt import (  # noqa: F401  (extract_program_text, read_answer: public API)
    ANSWER_FILE,
    TOOL_NAME,
    Entry,
    Examples,
    extract_program_text,
    instructions,
    one_line,
    read_answer,
    repair_prompt,
    task_prompt,
)

log = logging.getLogger("l2gen.llm")

ENV_BASE_URL = "OPENAI_BASE_URL"
ENV_API_KEY = "OPENAI_API_KEY"
ENV_MODEL = "L2GEN_LLM_MODEL"
ENV_MODE = "L2GEN_LLM_MODE"

MODES = ("auto", "responses_grammar", "chat_grammar", "text")

# A stand-in for answers that hold no parsable program: the checker rejects it too
# (tile 0 x 0 x 0), so a loop that ignores meta["rejected"] still records a rejection.
UNPARSED = Program("unparsed_llm_answer", Family.SM80, BLayout.KN, Sm80Config(Tile(0, 0, 0)))


class LLMConfigError(ValueError):
    """The LLM policy is not configured (a variable or flag is missing or invalid)."""


class LLMError(RuntimeError):
    """The LLM server cannot serve this search (bad key, unknown model, keeps failing)."""


class _Unanswered(Exception):
    """A request that got no answer after every retry (not a proposal, not a rejection)."""

    def __init__(self, diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


@dataclass(frozen=True)
class LLMConfig:
    """Where the model is and how much of it a search may use.

    Budgets are per shape: ``max_requests_per_shape`` counts requests (repair rounds
    included, retries not), ``max_tokens_per_shape`` input plus output tokens as the server
    reports them. ``temperature`` None leaves it to the server (reasoning models reject it).
    """

    base_url: str
    api_key: str
    model: str
    mode: str = "auto"
    max_requests_per_shape: int = 32
    max_tokens_per_shape: int = 400_000
    timeout_s: float = 120.0
    max_retries: int = 4
    temperature: float | None = None
    max_output_tokens: int = 4096
    backoff_s: float = 1.0  # first retry delay; doubles per retry, capped at MAX_BACKOFF_S
    max_failures: int = 3  # requests in a row that fail after all retries -> LLMError
    repair: bool = True  # one repair round for an answer with diagnostics

    def __post_init__(self):
        if self.mode not in MODES:
            raise LLMConfigError(f"LLM mode '{self.mode}' is not one of {', '.join(MODES)} ({ENV_MODE})")
        for name in ("max_requests_per_shape", "max_tokens_per_shape", "max_output_tokens", "max_failures"):
            if getattr(self, name) < 1:
                raise LLMConfigError(f"LLM setting {name} must be at least 1, got {getattr(self, name)}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0:
            raise LLMConfigError("LLM timeout must be positive, retries and backoff not negative")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides) -> "LLMConfig":
        """Read base URL, key, model and mode from the environment; explicit (non-None)
        arguments win. Raises :class:`LLMConfigError` naming every missing variable."""
        env = os.environ if env is None else env
        given = {k: v for k, v in overrides.items() if v is not None}
        variables = {"base_url": ENV_BASE_URL, "api_key": ENV_API_KEY, "model": ENV_MODEL, "mode": ENV_MODE}
        for key, var in variables.items():
            if key not in given and env.get(var):
                given[key] = env[var]
        hints = {
            "base_url": f"{ENV_BASE_URL} (e.g. https://api.openai.com/v1 or http://localhost:8000/v1 for vLLM)",
            "api_key": f"{ENV_API_KEY} (any non-empty value for a server without authentication)",
            "model": f"{ENV_MODEL} (the model name the server knows, e.g. what `vllm serve` was given)",
        }
        missing = [hint for key, hint in hints.items() if not given.get(key)]
        if missing:
            raise LLMConfigError("the LLM policy needs: " + "; ".join(missing))
        return cls(**given)

    def first_modes(self) -> list[str]:
        """The modes to try, in order; 'auto' picks by server and keeps text as fallback."""
        if self.mode != "auto":
            return [self.mode]
        host = (urlparse(self.base_url).hostname or "").lower()
        return ["responses_grammar" if host == "api.openai.com" else "chat_grammar", "text"]


MAX_BACKOFF_S = 30.0


@dataclass
class Usage:
    """What the policy spent and got, for one shape or in total."""

    requests: int = 0  # answered or failed requests (repairs included, retries not)
    retries: int = 0
    failures: int = 0  # requests that failed after every retry
    input_tokens: int = 0
    output_tokens: int = 0
    proposals: int = 0
    rejected: int = 0  # proposals with diagnostics (no program, parse or checker errors)
    repairs: int = 0  # repair rounds sent (for answers with diagnostics)
    repaired: int = 0  # repair rounds that produced a valid program
    reasks: int = 0  # follow-ups sent because a valid answer repeated a known program
    repeats: int = 0  # proposals that still repeat a known program (the loop drops them)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class LLMStats:
    total: Usage = field(default_factory=Usage)
    per_shape: dict = field(default_factory=dict)  # Shape -> Usage
    mode: str = ""  # the mode requests go out in now
    fallbacks: list = field(default_factory=list)  # "chat_grammar -> text: <why>"

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "fallbacks": list(self.fallbacks),
            "total": asdict(self.total) | {"tokens": self.total.tokens},
            "per_shape": {str(s): asdict(u) | {"tokens": u.tokens} for s, u in self.per_shape.items()},
        }


@dataclass(frozen=True)
class _Answer:
    text: str
    mode: str


class LLMPolicy:
    """Proposes programs by asking an LLM; see the module docstring for the protocol."""

    name = "llm"

    def __init__(self, config: LLMConfig, gpu: Gpu | None = None, *, client=None, seed: int = 0):
        self.config = config
        self.gpu = gpu or get_gpu(DEFAULT_GPU)
        self.stats = LLMStats()
        self._modes = config.first_modes()
        self.stats.mode = self._modes[0]
        self._client = client
        self._rng = random.Random(seed)
        self._memory: dict[Shape, dict[str, Entry]] = {}
        self._fatal: LLMError | None = None
        self._failures_in_row = 0
        self.prompts: list[str] = []  # user prompts sent, newest last (for inspection/tests)
        # shape -> the cost model's first (program, predicted µs) for it, shown in each task
        # prompt (l2gen tune sets it: the kernel library ranked by the learned model)
        self.ranking: Callable[[Shape], Sequence[tuple[Program, float]]] | None = None

    # -- Policy interface -------------------------------------------------------------

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        """Up to ``n`` proposals, one request each; [] once the shape's budget is spent.

        Raises :class:`LLMError` when the server cannot serve the search; later calls raise
        the same error without contacting the server.
        """
        if self._fatal:
            raise self._fatal
        for m in history:
            self._remember(m.shape, m, overwrite=False)
        out: list[Proposal] = []
        unanswered: Diagnostic | None = None
        for _ in range(n):
            if self.exhausted(shape):
                break
            try:
                out.append(self._propose_one(shape, out))
            except _Unanswered as exc:  # no answer is not a rejected program: nothing to record
                unanswered = exc.diagnostic
            except LLMError:
                if not out:
                    raise
                break  # hand over what this round got; the next call raises
        if not out and unanswered is not None:  # a round with no answer at all: the server is not serving
            self._fail(f"no answer from the LLM server at {self.config.base_url} for {shape}: {unanswered.message}")
        return out

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        """Remember how each proposal did, for the prompts of this and similar shapes."""
        for proposal, m in results:
            if proposal.meta.get("unparsed"):
                continue
            self._remember(shape, m)

    def exhausted(self, shape: Shape) -> bool:
        """Whether this shape's request or token budget is spent."""
        u = self.stats.per_shape.get(shape)
        return u is not None and (
            u.requests >= self.config.max_requests_per_shape or u.tokens >= self.config.max_tokens_per_shape
        )

    # -- one proposal -----------------------------------------------------------------

    def _propose_one(self, shape: Shape, batch: list[Proposal]) -> Proposal:
        """One request (and at most one follow-up) for one proposal.

        The follow-up repairs an answer with diagnostics, or asks again when a valid answer
        repeats a program already measured or proposed (the loop would drop it)."""
        usage = self._usage(shape)
        usage.proposals += 1
        self.stats.total.proposals += 1
        proposed = [p.program for p in batch if not p.meta.get("unparsed")]
        seen = set(self._memory.get(shape, {})) | {program_key(p) for p in proposed}
        examples = self._examples(shape)
        ranked = self._ranked(shape)
        answer, failure = self._ask(shape, task_prompt(shape, self.gpu, examples, proposed, ranked=ranked))
        if failure:
            raise _Unanswered(failure)
        program, diags = read_answer(answer.text, self.gpu)
        first = diags
        repeat = not diags and program_key(program) in seen
        followed = (diags or repeat) and self.config.repair and not self.exhausted(shape)
        if followed:
            self._count(shape, "repairs" if diags else "reasks")
            if diags:
                follow = repair_prompt(shape, self.gpu, answer.text, diags)
            else:
                follow = task_prompt(shape, self.gpu, examples, proposed, repeated=program, ranked=ranked)
            fix, failure = self._ask(shape, follow)
            if failure:
                diags = diags + [failure] if diags else diags
            else:
                program2, diags2 = read_answer(fix.text, self.gpu)
                if not diags2 and program_key(program2) not in seen:  # valid and new
                    program, diags, answer = program2, [], fix
                elif diags:  # the first answer was broken: report the latest one
                    program = program2 if program2 is not None else program
                    diags, answer = diags2, fix
                # else: the first answer was a valid repeat and stays the proposal
        if diags:
            return self._rejected(shape, program, diags, answer.text, first if followed else None)
        repaired = bool(first)
        if repaired:
            self._count(shape, "repaired")
        repeat = program_key(program) in seen
        if repeat:
            self._count(shape, "repeats")
        meta = {"mode": answer.mode, "text": answer.text, "repaired": repaired, "duplicate": repeat}
        if repaired:
            meta["first_diagnostics"] = [str(d) for d in first]
        note = f"llm:{answer.mode}" + (" (repaired)" if repaired else "") + (" (repeat)" if repeat else "")
        return Proposal(program, note=note, meta=meta)

    def _count(self, shape: Shape, what: str) -> None:
        for usage in (self._usage(shape), self.stats.total):
            setattr(usage, what, getattr(usage, what) + 1)

    def _rejected(self, shape, program, diags, text, first) -> Proposal:
        self._count(shape, "rejected")
        lines = [str(d) for d in diags]
        meta = {"rejected": True, "diagnostics": lines, "text": text, "mode": self.stats.mode}
        if first:
            meta["first_diagnostics"] = [str(d) for d in first]
        if program is None:
            meta["unparsed"] = True
        note = "llm: rejected: " + (lines[0] if lines else "no program")
        return Proposal(program or UNPARSED, note=note, meta=meta)

    # -- requests ---------------------------------------------------------------------

    def _ask(self, shape: Shape, prompt: str) -> tuple[_Answer | None, Diagnostic | None]:
        """One request, with retries and mode fallback. Returns (answer, None) or
        (None, diagnostic) when the request failed after every retry."""
        import openai

        usage = self._usage(shape)
        usage.requests += 1
        self.stats.total.requests += 1
        self.prompts.append(prompt)
        attempt = 0
        while True:
            mode = self._modes[0]
            try:
                text, tokens_in, tokens_out = self._call(mode, prompt)
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status in (401, 403):
                    self._fail(
                        f"the LLM server at {self.config.base_url} refused the API key ({status}): "
                        f"{_message(exc)}; check {ENV_API_KEY}"
                    )
                if status == 404 and _is_model_error(exc):
                    self._fail(
                        f"the LLM server at {self.config.base_url} does not know model "
                        f"'{self.config.model}' (404): {_message(exc)}; check {ENV_MODEL}"
                    )
                if status in (400, 404, 405, 422, 501):
                    if len(self._modes) > 1:
                        self._fall_back(f"{status}: {_message(exc)}")
                        continue
                    self._fail(
                        f"the LLM server at {self.config.base_url} rejected a {mode} request "
                        f"({status}): {_message(exc)}"
                    )
                if status in (408, 409, 429) or status >= 500:
                    if attempt < self.config.max_retries:
                        attempt = self._backoff(shape, attempt, exc)
                        continue
                    return None, self._failed(shape, f"{status}: {_message(exc)}", attempt)
                self._fail(f"the LLM server at {self.config.base_url} answered {status}: {_message(exc)}")
            except (openai.APIConnectionError, openai.APIResponseValidationError) as exc:
                if attempt < self.config.max_retries:
                    attempt = self._backoff(shape, attempt, exc)
                    continue
                return None, self._failed(shape, _message(exc), attempt)
            except openai.OpenAIError as exc:  # an answer the client cannot read: not retried
                return None, self._failed(shape, f"{type(exc).__name__}: {_message(exc)}", attempt)
            self._failures_in_row = 0
            if tokens_in is None and tokens_out is None:  # no usage reported: estimate
                tokens_in, tokens_out = len(prompt) // 4, len(text) // 4
            usage.input_tokens += tokens_in or 0
            usage.output_tokens += tokens_out or 0
            self.stats.total.input_tokens += tokens_in or 0
            self.stats.total.output_tokens += tokens_out or 0
            return _Answer(text, mode), None

    def _call(self, mode: str, prompt: str) -> tuple[str, int | None, int | None]:
        client = self._get_client()
        extra = {} if self.config.temperature is None else {"temperature": self.config.temperature}
        system = instructions(self.gpu, mode)
        if mode == "responses_grammar":
            r = client.responses.create(
                model=self.config.model,
                instructions=system,
                input=prompt,
                tools=[
                    {
                        "type": "custom",
                        "name": TOOL_NAME,
                        "description": "Submit one l2gen kernel program to be compiled and measured.",
                        "format": {"type": "grammar", "syntax": "lark", "definition": grammar_text()},
                    }
                ],
                tool_choice={"type": "custom", "name": TOOL_NAME},
                parallel_tool_calls=False,
                max_output_tokens=self.config.max_output_tokens,
                **extra,
            )
            text = next(
                (item.input for item in (r.output or []) if getattr(item, "type", "") == "custom_tool_call"),
                None,
            )
            if not text:  # no tool call (e.g. an incomplete answer): take any text
                text = getattr(r, "output_text", "") or ""
            u = r.usage
            return text, getattr(u, "input_tokens", None), getattr(u, "output_tokens", None)
        if mode == "chat_grammar":
            extra["extra_body"] = {"structured_outputs": {"grammar": grammar_text()}}
        r = client.chat.completions.create(
            model=self.config.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": prompt}],
            max_completion_tokens=self.config.max_output_tokens,
            **extra,
        )
        choice = r.choices[0] if r.choices else None
        text = (choice.message.content if choice and choice.message else None) or ""
        if not isinstance(text, str):  # some servers send a list of content parts
            text = "".join(str(getattr(part, "text", part)) for part in text)
        u = r.usage
        return text, getattr(u, "prompt_tokens", None), getattr(u, "completion_tokens", None)

    def _get_client(self):
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=self.config.base_url,
                api_key=self.config.api_key,
                timeout=self.config.timeout_s,
                max_retries=0,  # retries are ours: counted, and backed off per config
            )
        return self._client

    def _backoff(self, shape: Shape, attempt: int, exc: Exception) -> int:
        delay = min(MAX_BACKOFF_S, self.config.backoff_s * 2**attempt)
        retry_after = _retry_after(exc)
        if retry_after is not None:
            delay = min(MAX_BACKOFF_S, max(delay, retry_after))
        delay *= 1 + 0.1 * self._rng.random()
        log.info("LLM request failed (%s); retry %d in %.2f s", _message(exc), attempt + 1, delay)
        self._usage(shape).retries += 1
        self.stats.total.retries += 1
        time.sleep(delay)
        return attempt + 1

    def _failed(self, shape: Shape, why: str, retries: int) -> Diagnostic:
        self._usage(shape).failures += 1
        self.stats.total.failures += 1
        self._failures_in_row += 1
        if self._failures_in_row >= self.config.max_failures:
            self._fail(
                f"{self._failures_in_row} requests in a row to {self.config.base_url} failed "
                f"after {retries} retries each; last: {why}"
            )
        return Diagnostic("E-LLM", f"the request failed after {retries} retries: {why}", Span(ANSWER_FILE))

    def _fall_back(self, why: str) -> None:
        old = self._modes.pop(0)
        self.stats.mode = self._modes[0]
        self.stats.fallbacks.append(f"{old} -> {self._modes[0]}: {why}")
        log.warning("LLM server rejected %s requests (%s); using %s from now on", old, why, self._modes[0])

    def _fail(self, message: str):
        self._fatal = LLMError(message)
        raise self._fatal

    def _usage(self, shape: Shape) -> Usage:
        return self.stats.per_shape.setdefault(shape, Usage())

    # -- memory -----------------------------------------------------------------------

    def _remember(self, shape: Shape, m: Measurement, overwrite: bool = True) -> None:
        if m.program is UNPARSED or m.program.name == UNPARSED.name:
            return
        entries = self._memory.setdefault(shape, {})
        key = program_key(m.program)
        if not overwrite and key in entries:
            return
        error = (m.error or "").strip().splitlines()[0][:200] if m.error else None
        entries[key] = Entry(one_line(m.program), m.status, m.speedup, error)

    def _ranked(self, shape: Shape) -> Sequence[tuple[Program, float]]:
        """The cost model's first choices for ``shape`` (none without a ranking, or where
        the model cannot rank it: the prompt then goes without, as before)."""
        if self.ranking is None:
            return ()
        try:
            return list(self.ranking(shape))
        except Exception as exc:  # a model's failure must not stop the search
            log.warning("llm policy: no cost-model ranking for %s (%s)", shape, exc)
            return ()

    def _examples(self, shape: Shape) -> "Examples":
        here = list(self._memory.get(shape, {}).values())
        ok = sorted((e for e in here if e.speedup is not None), key=lambda e: -e.speedup)
        failed = [e for e in here if e.speedup is None]
        best = ok[:4]
        worst = [e for e in ok[4:][-2:]] + failed[-3:]
        similar = []
        for s in sorted((s for s in self._memory if s != shape), key=lambda s: _distance(s, shape)):
            ok_there = [e for e in self._memory[s].values() if e.speedup is not None]
            if ok_there and len(similar) < 3:
                similar.append((s, max(ok_there, key=lambda e: e.speedup)))
        return Examples(best, worst, similar, len(here))


# -- small helpers ------------------------------------------------------------------------


def _distance(a: Shape, b: Shape) -> float:
    return sum(abs(math.log2(x) - math.log2(y)) for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k)))


def _message(exc: Exception) -> str:
    """The server's own error message where it sent one (the client keeps the 'error' object)."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return body["message"]
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


def _is_model_error(exc: Exception) -> bool:
    if getattr(exc, "code", None) == "model_not_found":
        return True
    text = _message(exc).lower()
    return "model" in text and ("not exist" in text or "not found" in text)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
