"""Policies that need no network and no GPU to propose: random, and an embedded learner.

:class:`RandomPolicy` draws valid programs uniformly from the decision space.
:class:`EmbeddedPolicy` is a factorized softmax over the decision slots of
:data:`l2gen.space.SLOTS`, conditioned on features of the shape and trained by policy
gradient across shapes, so that it proposes well for shapes it never measured. Both keep
to the :class:`~l2gen.search.base.Policy` interface.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..check import is_valid
from ..ir import (
    BLayout,
    Decomposition,
    Family,
    Program,
    Scheduler,
    Sm90Config,
    Sm90L2genConfig,
)
from ..parse import parse
from ..printer import format_program
from ..space import SLOTS, Slot, assemble, choices_of, grid_applies, random_program, sanitize, splits_apply
from ..targets import Gpu, get_gpu
from ..problem import Measurement, Shape, program_key
from .base import REWARD_REJECTED, Proposal, reward

FEATURE_NAMES = (
    "bias",
    "log2_m",
    "log2_n",
    "log2_k",
    "tiles_per_sm_64x64",
    "tiles_per_sm_128x128",
    "tiles_per_sm_128x256",
    "aspect_m_n",
    "aspect_k_mn",
    "k_over_m_plus_n",
)


def shape_features(shape: Shape, gpu: Gpu) -> np.ndarray:
    """Features of a shape on a GPU, each roughly in [-2, 2] over the shapes of interest:
    a bias, normalized log2 M/N/K, log2 of tiles per SM for three reference tiles, and
    aspect ratios."""
    lm, ln, lk = (math.log2(v) for v in (shape.m, shape.n, shape.k))
    tiles = [math.log2(math.ceil(shape.m / bm) * math.ceil(shape.n / bn) / gpu.sms) / 4 for bm, bn in ((64, 64), (128, 128), (128, 256))]
    return np.array(
        [1.0, (lm - 10) / 4, (ln - 10) / 4, (lk - 10) / 4, *tiles, (lm - ln) / 4, (lk - (lm + ln) / 2) / 4, math.log2(shape.k / (shape.m + shape.n)) / 4]
    )


def _encode(value) -> str:
    """A slot value as a stable string (enums by value, tuples joined by 'x')."""
    if hasattr(value, "value"):
        return str(value.value)
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


def _active(program: Program) -> set[str]:
    """Slots that matter for this program (split counts need a splitter, a grid cap a kernel
    that loops over its tiles)."""
    names = {s.name for s in SLOTS[program.family]}
    if not splits_apply(program.config):
        names -= {"splits", "decomposition"}
    if not grid_applies(program):
        names.discard("grid")
    return names


PRIOR_SHARE = 0.7  # the probability a slot's prior choice starts with, in any shape


def _initial_weights(slot: Slot, features: int) -> np.ndarray:
    """A slot's weights before any training: all choices alike, or, for a slot with a
    prior, that choice drawn with PRIOR_SHARE in every shape (through the constant
    feature), the others sharing the rest. A policy saved before the slot existed starts it
    here too (:meth:`EmbeddedPolicy.load`)."""
    w = np.zeros((len(slot.choices), features))
    if slot.prior is not None and len(slot.choices) > 1:
        w[slot.choices.index(slot.prior), 0] = math.log(PRIOR_SHARE * (len(slot.choices) - 1) / (1 - PRIOR_SHARE))
    return w


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def fill_uniform(rng: random.Random, gpu: Gpu, b_layout: BLayout, seen: set, out: list[Proposal], count: int, note: str, *, tries: int) -> list[Proposal]:
    """Top ``out`` up to ``count`` proposals with uniform valid programs not in ``seen``."""
    for _ in range(tries):
        if len(out) >= count:
            break
        program = random_program(rng, gpu, b_layout=b_layout)
        key = program_key(program)
        if key not in seen:
            seen.add(key)
            out.append(Proposal(program, note, {"kind": "random"}))
    return out


class RandomPolicy:
    """Uniform over valid programs (:func:`l2gen.space.random_program`); learns nothing."""

    name = "random"

    def __init__(self, gpu: Gpu, *, seed: int = 0, b_layout: BLayout = BLayout.KN):
        self.gpu = gpu
        self.rng = random.Random(seed)
        self.b_layout = b_layout

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        seen = {program_key(m.program) for m in history}
        return fill_uniform(self.rng, self.gpu, self.b_layout, seen, [], n, "random", tries=50 * n)

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        pass


# ---------------------------------------------------------------------------------------
# The optional cost model.


def _onehot_index() -> tuple[dict, int]:
    """Column of each (family, slot, value) in the one-hot program encoding."""
    index, col = {}, 0
    for family, slots in SLOTS.items():
        index[(family, "family", family.value)] = col
        col += 1
        for slot in slots:
            for value in slot.choices:
                index[(family, slot.name, _encode(value))] = col
                col += 1
    return index, col


_ONEHOT, _ONEHOT_WIDTH = _onehot_index()
_DERIVED = 8


def _derived(program: Program, shape: Shape, gpu: Gpu) -> list[float]:
    """Features of a program on a shape: wave quantization, split work, waste."""
    cfg, kn = program.config, program.knobs
    t = cfg.tile
    tm, tn = math.ceil(shape.m / t.m), math.ceil(shape.n / t.n)
    splits = kn.splits if splits_apply(cfg) else 1
    streamk = kn.decomposition is Decomposition.STREAM_K and (
        (isinstance(cfg, Sm90Config) and cfg.scheduler is Scheduler.STREAM_K) or isinstance(cfg, Sm90L2genConfig))
    units = tm * tn * splits
    sms = min(gpu.sms, kn.grid) if kn.grid else gpu.sms  # a capped persistent grid's CTAs
    util = 1.0 if streamk else units / (math.ceil(units / sms) * sms)
    k_iters = math.ceil(shape.k / splits / t.k)
    return [
        math.log2(tm * tn / gpu.sms) / 4,
        util,
        math.log2(units / gpu.sms) / 4,
        math.log2(k_iters) / 4,
        1 - shape.m / (tm * t.m),
        1 - shape.n / (tn * t.n),
        math.log2(t.m * t.n) / 16,
        util * util,
    ]


def program_vector(program: Program, shape: Shape, gpu: Gpu) -> np.ndarray:
    """The cost model's input: one-hot slots crossed with shape features, plus derived
    quantization features per family."""
    onehot = np.zeros(_ONEHOT_WIDTH)
    fam = program.family
    onehot[_ONEHOT[(fam, "family", fam.value)]] = 1.0
    choices = choices_of(program)
    for name in _active(program):
        col = _ONEHOT.get((fam, name, _encode(choices[name])))
        if col is not None:
            onehot[col] = 1.0
    derived = np.zeros(2 * _DERIVED)
    offset = 0 if fam is Family.SM80 else _DERIVED
    derived[offset : offset + _DERIVED] = _derived(program, shape, gpu)
    return np.concatenate([np.outer(onehot, shape_features(shape, gpu)).ravel(), derived])


class RidgeCostModel:
    """Ridge regression from :func:`program_vector` to reward, updated online.

    Keeps the inverse of ``X^T X + lam I`` and updates it by Sherman–Morrison with every
    measurement (O(d^2), no factorization), so fitting stays cheap and its cost does not
    grow with the number of measurements. The mean reward is the unpenalized intercept.
    """

    def __init__(self, lam: float = 1.0):
        self.lam = lam
        self._n = 0
        self._inv: np.ndarray | None = None  # (X^T X + lam I)^-1
        self._xty: np.ndarray | None = None  # X^T y
        self._xsum: np.ndarray | None = None  # X^T 1
        self._ysum = 0.0
        self._w: np.ndarray | None = None

    def __len__(self) -> int:
        return self._n

    def add(self, vector: np.ndarray, target: float) -> None:
        self.add_many([vector], [target])

    def add_many(self, vectors: Sequence[np.ndarray], targets: Sequence[float]) -> None:
        """Add a batch of measurements: one Woodbury update of the inverse."""
        if not len(vectors):
            return
        v = np.array(vectors).T  # d x b
        if self._inv is None:
            d = v.shape[0]
            self._inv = np.eye(d) / self.lam
            self._xty = np.zeros(d)
            self._xsum = np.zeros(d)
        u = self._inv @ v
        s = np.eye(v.shape[1]) + v.T @ u
        self._inv -= u @ np.linalg.solve(s, u.T)
        self._xty += v @ np.asarray(targets, dtype=float)
        self._xsum += v.sum(axis=1)
        self._ysum += float(np.sum(targets))
        self._n += v.shape[1]
        self._w = None

    def predict(self, vectors: Sequence[np.ndarray]) -> np.ndarray:
        if not self._n:
            return np.zeros(len(vectors))
        mean = self._ysum / self._n
        if self._w is None:
            self._w = self._inv @ (self._xty - mean * self._xsum)
        return np.array(vectors) @ self._w + mean


# ---------------------------------------------------------------------------------------
# The embedded policy.


class EmbeddedPolicy:
    """A factorized softmax policy over the decision slots, trained by REINFORCE.

    One categorical for the family and one per slot of each family, with logits
    ``W_slot @ shape_features(shape)`` (the bias is a feature). ``update`` takes a
    policy-gradient step with advantage = (reward − a per-shape moving baseline) / the
    batch's spread, plus an entropy bonus. Sampled programs the checker rejects get
    :data:`REWARD_REJECTED` at once and are redrawn (at most ``max_draws`` per proposal).
    A share ``uniform_mix`` of the draws is made uniformly over the slots, a floor of
    exploration for a policy that has only seen other shapes.

    Beside fresh samples, a share ``edit_fraction`` of each batch (once the shape has a
    verified program) are *edits*: one or two slots of the best program so far changed.
    A share ``knob_edit`` of those change run-time knobs only: the same binary, so on a
    device they cost no build. The first batch of a shape also tries the best programs of
    the nearest shapes tuned before (``transfer``).

    With ``cost_model=True`` (the default) a :class:`RidgeCostModel`, fit on every
    measurement the policy is shown, ranks ``oversample`` times more candidates than
    needed, and the top ones are proposed (one sample per batch is left unranked, to keep
    exploring). On the simulated H200 at small budgets (8 shapes x 48 candidates) the
    cost model and the edits carry most of the gain over random search; REINFORCE shows
    in the quality of fresh samples on shapes never measured (their mean reward rises
    as shapes are tuned), which is why its learning rate is modest.
    """

    name = "embedded"

    def __init__(
        self,
        gpu: Gpu,
        *,
        seed: int = 0,
        b_layout: BLayout = BLayout.KN,
        lr: float = 0.02,
        entropy: float = 0.01,
        baseline_rate: float = 0.3,
        edit_fraction: float = 0.5,
        knob_edit: float = 0.5,
        edit_weight: float = 0.5,
        cost_model: bool = True,
        oversample: int = 8,
        min_fit: int = 16,
        max_draws: int = 40,
        transfer: int = 2,
        reject_weight: float = 1.0,
        uniform_mix: float = 0.5,
    ):
        self.gpu = gpu
        self.b_layout = b_layout
        self.lr = lr
        self.entropy = entropy
        self.baseline_rate = baseline_rate
        self.edit_fraction = edit_fraction
        self.knob_edit = knob_edit
        self.edit_weight = edit_weight
        self.oversample = oversample
        self.min_fit = min_fit
        self.max_draws = max_draws
        self.transfer = transfer
        self.reject_weight = reject_weight  # total step weight of one draw's rejections
        self.uniform_mix = uniform_mix  # share of draws made uniformly over the slots (exploration floor)
        self.rng = np.random.default_rng(seed)
        self.pyrng = random.Random(seed)
        self.families: tuple[Family, ...] = gpu.families()
        nf = len(FEATURE_NAMES)
        self.family_w = np.zeros((len(self.families), nf))
        self.w: dict[Family, dict[str, np.ndarray]] = {fam: {s.name: _initial_weights(s, nf) for s in SLOTS[fam]} for fam in self.families}
        self._index = {fam: {s.name: {_encode(v): i for i, v in enumerate(s.choices)} for s in SLOTS[fam]} for fam in self.families}
        self.baselines: dict[str, float] = {}
        self.elite: dict[str, tuple[str, float]] = {}  # shape -> (program text, reward)
        self.cost = RidgeCostModel() if cost_model else None

    # -- sampling ------------------------------------------------------------------------

    def probabilities(self, shape: Shape) -> dict:
        """The policy's distributions for a shape: {"family": {...}, family: {slot: {...}}}."""
        x = shape_features(shape, self.gpu)
        out: dict = {"family": {f.value: float(p) for f, p in zip(self.families, _softmax(self.family_w @ x))}}
        for fam in self.families:
            out[fam.value] = {name: {_encode(v): float(p) for v, p in zip(_slot(fam, name).choices, _softmax(w @ x))} for name, w in self.w[fam].items()}
        return out

    def log_probability(self, program: Program, shape: Shape) -> float:
        """log P(program) for a shape under the factorized policy: its family, then each
        slot that matters for it (a value outside a slot's list adds nothing)."""
        x = shape_features(shape, self.gpu)
        if program.family not in self.families:
            return -math.inf
        lp = float(np.log(_softmax(self.family_w @ x)[self.families.index(program.family)] + 1e-12))
        choices = choices_of(program)
        for name in _active(program):
            i = self._index[program.family][name].get(_encode(choices[name]))
            if i is not None:
                lp += float(np.log(_softmax(self.w[program.family][name] @ x)[i] + 1e-12))
        return lp

    def _tables(self, x: np.ndarray | None) -> tuple:
        """Cumulative distributions of the family and of every slot (uniform if x is None)."""

        def cum(w: np.ndarray) -> np.ndarray:
            return np.cumsum(_softmax(w @ x)) if x is not None else np.arange(1, len(w) + 1) / len(w)

        fam_cum = cum(self.family_w)
        slots = {fam: [(slot, cum(self.w[fam][slot.name])) for slot in SLOTS[fam]] for fam in self.families}
        return fam_cum, slots

    def _sample(self, tables: tuple) -> Program:
        fam_cum, slots = tables
        fam = self.families[min(int(np.searchsorted(fam_cum, self.pyrng.random() * fam_cum[-1], side="right")), len(self.families) - 1)]
        choices = {}
        for slot, cum in slots[fam]:
            i = min(int(np.searchsorted(cum, self.pyrng.random() * cum[-1], side="right")), len(cum) - 1)
            choices[slot.name] = slot.choices[i]
        return sanitize(assemble(fam, choices, b_layout=self.b_layout))

    def _draw(self, shape: Shape, x: np.ndarray, count: int, seen: set[str]) -> list[Proposal]:
        """Valid, unseen samples; rejected ones are penalized (after the draw)."""
        out: list[Proposal] = []
        base = self.baselines.get(str(shape), 0.0)
        tables = self._tables(x)
        uniform = self._tables(None)
        rejected: list[Program] = []
        for _ in range(count * self.max_draws):
            if len(out) >= count:
                break
            from_policy = self.pyrng.random() >= self.uniform_mix
            program = self._sample(tables if from_policy else uniform)
            if not is_valid(program, self.gpu):
                if from_policy:
                    rejected.append(program)
                continue
            key = program_key(program)
            if key not in seen:
                seen.add(key)
                out.append(Proposal(program, "sampled" if from_policy else "sampled (uniform share)", {"kind": "sample" if from_policy else "random"}))
        if rejected:
            advantage = max(-2.0, REWARD_REJECTED - base) * self.reject_weight / len(rejected)
            self._step(x, rejected, [advantage] * len(rejected))
        # the policy is stuck: fall back to uniform draws
        return fill_uniform(self.pyrng, self.gpu, self.b_layout, seen, out, count, "uniform (policy draws exhausted)", tries=20 * (count - len(out)))

    def _edit(self, program: Program, x: np.ndarray, knobs_only: bool) -> tuple[Program, list[str]]:
        fam = program.family
        active = _active(program)
        slots = [s for s in SLOTS[fam] if s.name in active]
        if knobs_only:
            slots = [s for s in slots if s.runtime]
        chosen = self.pyrng.sample(slots, min(len(slots), self.pyrng.choice((1, 1, 2))))
        choices = choices_of(program)
        for slot in chosen:
            current = _encode(choices[slot.name])
            options = [i for i, v in enumerate(slot.choices) if _encode(v) != current]
            if not options:
                continue
            if fam in self.w and self.pyrng.random() < 0.5:
                p = _softmax(self.w[fam][slot.name] @ x)[options]
                i = options[self.rng.choice(len(options), p=p / p.sum())]
            else:
                i = self.pyrng.choice(options)
            choices[slot.name] = slot.choices[i]
        edited = sanitize(assemble(fam, choices, b_layout=program.b_layout))
        return edited, [s.name for s in chosen]

    def _edits(self, best: Program, x: np.ndarray, count: int, seen: set[str], knobs_only: bool) -> list[Proposal]:
        out: list[Proposal] = []
        for _ in range(count * 10):
            if len(out) >= count:
                break
            program, slots = self._edit(best, x, knobs_only)
            key = program_key(program)
            if key in seen or not is_valid(program, self.gpu):
                continue
            seen.add(key)
            knobs = all(_slot(program.family, s).runtime for s in slots)
            out.append(Proposal(program, f"edit of best: {', '.join(slots)}", {"kind": "edit", "knob_only": knobs}))
        return out

    def _transfers(self, shape: Shape, x: np.ndarray, seen: set[str]) -> list[Proposal]:
        """Best programs of the nearest shapes tuned before."""
        scored = []
        for text_shape, (text, r) in self.elite.items():
            if text_shape == str(shape):
                continue
            other = shape_features(Shape.parse(text_shape), self.gpu)
            scored.append((float(np.abs(other - x).sum()), text_shape, text))
        out = []
        for _, source, text in sorted(scored)[: self.transfer]:
            try:
                program = parse(text)
            except Exception:
                continue
            key = program_key(program)
            if key not in seen and is_valid(program, self.gpu):
                seen.add(key)
                out.append(Proposal(program, f"best of {source}", {"kind": "transfer"}))
        return out

    def _rank(self, shape: Shape, pool: list[Proposal], n: int, explore: int) -> list[Proposal]:
        if n <= 0:
            return []
        if self.cost is None or len(self.cost) < self.min_fit or len(pool) <= n:
            return pool[:n]
        scores = self.cost.predict([program_vector(p.program, shape, self.gpu) for p in pool])
        order = list(np.argsort(-scores))
        for i in order:
            pool[i].meta["predicted"] = float(scores[i])
        keep = n - min(explore, n - 1)
        chosen = order[:keep]
        rest = order[keep:]
        chosen += [rest[i] for i in self.rng.choice(len(rest), size=n - keep, replace=False)] if n > keep else []
        return [pool[i] for i in chosen]

    def propose(self, shape: Shape, history: Sequence[Measurement], n: int) -> list[Proposal]:
        x = shape_features(shape, self.gpu)
        seen = {program_key(m.program) for m in history}
        ok = [m for m in history if m.speedup is not None]
        out: list[Proposal] = []
        if not history:
            out += self._transfers(shape, x, seen)[:n]
        if ok:
            best = max(ok, key=lambda m: m.speedup).program
            n_edit = round(self.edit_fraction * n)
            n_knob = round(self.knob_edit * n_edit)  # same binary, other knobs: no build
            knob = self._rank(shape, self._edits(best, x, n_knob * self.oversample, seen, knobs_only=True), n_knob, explore=0)
            n_rest = n_edit - len(knob)
            out += knob + self._rank(shape, self._edits(best, x, n_rest * self.oversample, seen, knobs_only=False), n_rest, explore=0)
        need = n - len(out)
        out += self._rank(shape, self._draw(shape, x, need * self.oversample, seen), need, explore=1)
        return out[:n]

    def prime(self, best: dict) -> None:
        """Take a database's best program per shape (``KernelDB.best_all``: shape ->
        (program, speedup, time_us)) as the elites that new shapes transfer from, where
        they beat what the policy has already seen; measured programs from earlier runs,
        benches or hand-written examples so seed the first batch of every shape."""
        for shape, (program, speedup, _time_us) in best.items():
            if program.family not in self.families or not speedup or speedup <= 0:
                continue
            key, r = str(shape), math.log(speedup)
            if r > self.elite.get(key, ("", -math.inf))[1]:
                self.elite[key] = (format_program(program), r)

    # -- learning ------------------------------------------------------------------------

    def _step(self, x: np.ndarray, programs: Sequence[Program], advantages: Sequence[float]) -> None:
        """One REINFORCE step for programs drawn for the same shape features ``x``.

        With x shared, sum_i a_i grad log pi(program_i) is, per categorical,
        (sum_i a_i onehot_i - (sum_i a_i) p) outer x: one update per slot, not per program.
        """
        fam_target = np.zeros(len(self.families))
        slot_target: dict[tuple[Family, str], np.ndarray] = {}
        slot_total: dict[tuple[Family, str], float] = {}
        for program, a in zip(programs, advantages):
            if program.family not in self.families or a == 0.0:
                continue
            fam_target[self.families.index(program.family)] += a
            choices = choices_of(program)
            index = self._index[program.family]
            for name in _active(program):
                i = index[name].get(_encode(choices[name]))
                if i is None:  # a value outside the slot's list (e.g. an LLM's program)
                    continue
                key = (program.family, name)
                if key not in slot_target:
                    slot_target[key] = np.zeros(len(index[name]))
                    slot_total[key] = 0.0
                slot_target[key][i] += a
                slot_total[key] += a
        if not fam_target.any():
            return
        self.family_w += self.lr * np.outer(fam_target - fam_target.sum() * _softmax(self.family_w @ x), x)
        for (fam, name), target in slot_target.items():
            w = self.w[fam][name]
            w += self.lr * np.outer(target - slot_total[(fam, name)] * _softmax(w @ x), x)

    def _entropy_step(self, x: np.ndarray) -> None:
        mats = [self.family_w] + [w for fam in self.families for w in self.w[fam].values()]
        for w in mats:
            p = _softmax(w @ x)
            h = -float(np.sum(p * np.log(p + 1e-12)))
            w += self.lr * self.entropy * np.outer(-p * (np.log(p + 1e-12) + h), x)

    def update(self, shape: Shape, results: Sequence[tuple[Proposal, Measurement]]) -> None:
        if not results:
            return
        x = shape_features(shape, self.gpu)
        rewards = [reward(m) for _, m in results]
        key = str(shape)
        base = self.baselines.get(key, float(np.mean(rewards)))
        spread = float(np.std(rewards)) if len(rewards) > 1 else 0.0
        advantages, fit = [], []
        for (proposal, m), r in zip(results, rewards):
            kind = proposal.meta.get("kind", "sample")
            weight = 1.0 if kind in ("sample", "random") else self.edit_weight
            advantages.append(weight * float(np.clip((r - base) / (spread + 0.1), -3.0, 3.0)))
            if self.cost is not None and m.status != "rejected" and m.program.family in self.families:
                fit.append((program_vector(m.program, shape, self.gpu), r))
            if m.speedup is not None and r > self.elite.get(key, ("", -math.inf))[1]:
                self.elite[key] = (format_program(m.program), r)
        self._step(x, [m.program for _, m in results], advantages)
        if fit:
            self.cost.add_many([v for v, _ in fit], [r for _, r in fit])
        self._entropy_step(x)
        self.baselines[key] = base + self.baseline_rate * (float(np.mean(rewards)) - base)

    # -- persistence ---------------------------------------------------------------------

    def state(self) -> dict:
        """Everything learned, as JSON-able data (the cost model's data lives in the DB)."""
        return {
            "format": "l2gen-embedded-policy",
            "version": 1,
            "gpu": self.gpu.name,
            "features": list(FEATURE_NAMES),
            "families": [f.value for f in self.families],
            "family_w": self.family_w.tolist(),
            "slots": {
                fam.value: {name: {"choices": [_encode(v) for v in _slot(fam, name).choices], "w": w.tolist()} for name, w in self.w[fam].items()}
                for fam in self.families
            },
            "baselines": self.baselines,
            "elite": {k: list(v) for k, v in self.elite.items()},
        }

    def save(self, path: str | Path) -> None:
        """Write the policy state as JSON (atomically: a temporary file, then a rename)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self.state(), f, indent=1)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path, *, gpu: Gpu | None = None, **options) -> "EmbeddedPolicy":
        """A policy from :meth:`save`'s JSON. Passing ``gpu`` asserts the target: a policy
        trained for another GPU raises ValueError. A slot whose choices changed since the
        save keeps the rows of the choices it still has; new choices start from zero (a
        slot that lost a choice warns: what it learned of that choice is dropped)."""
        path = Path(path)
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: cannot read an embedded policy: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != "l2gen-embedded-policy":
            raise ValueError(f"{path}: not an l2gen embedded-policy file")
        saved_gpu = get_gpu(state["gpu"])
        if gpu is not None and gpu.name != saved_gpu.name:
            raise ValueError(f"{path}: policy was trained for {saved_gpu.name}, not {gpu.name}; train a new one or pass the matching --gpu")
        policy = cls(gpu or saved_gpu, **options)
        if state.get("features") != list(FEATURE_NAMES):
            warnings.warn(f"{path}: the shape features changed since this policy was saved; starting from zero")
            return policy
        if state.get("families") == [f.value for f in policy.families]:
            policy.family_w = np.array(state["family_w"], dtype=float)
        for fam in policy.families:
            for name, saved in state.get("slots", {}).get(fam.value, {}).items():
                if name not in policy.w[fam]:
                    warnings.warn(f"{path}: slot {fam.value}.{name} is no longer in the decision space; dropped")
                    continue
                rows = dict(zip(saved["choices"], np.array(saved["w"], dtype=float)))
                index = policy._index[fam][name]
                for choice, i in index.items():
                    if choice in rows:
                        policy.w[fam][name][i] = rows[choice]
                if lost := [c for c in rows if c not in index]:
                    warnings.warn(f"{path}: slot {fam.value}.{name} no longer offers {', '.join(lost)}; what was learned of it is dropped")
        policy.baselines = {k: float(v) for k, v in state.get("baselines", {}).items()}
        policy.elite = {k: (v[0], float(v[1])) for k, v in state.get("elite", {}).items()}
        return policy


def shipped_policy(gpu: Gpu) -> Path | None:
    """The trained embedded-policy state that ships with l2gen for ``gpu``, if any."""
    import importlib.resources

    try:
        path = importlib.resources.files("l2gen").joinpath("data", f"policy_{gpu.name}.json")
        return Path(str(path)) if path.is_file() else None
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        return None


def _slot(family: Family, name: str) -> Slot:
    for slot in SLOTS[family]:
        if slot.name == name:
            return slot
    raise KeyError(f"{family.value} has no slot {name}")
