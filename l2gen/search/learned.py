"""A learned cost model: the analytic model's time, corrected by what was measured.

:class:`LearnedModel` is a ridge regression of log(measured time) on a program's features
on a shape (:func:`~l2gen.search.policies.program_vector`: its decisions crossed with the
shape's features, wave quantization, split work) plus log of the analytic model's time
(:func:`~l2gen.search.simulate.model_us`), then corrected, program by program, by how the
same program measured on nearby shapes: its residuals there (each shape's mean residual
taken out, so only the program's standing among that shape's candidates counts), weighted
by closeness in log2 M, N and K. Fit on the measurements of other shapes, it ranks a new
shape's candidates far closer to how they measure than the analytic model alone
(``bench/model_rank.py --learned``, leave-one-shape-out over the committed results).
It needs measurements to learn from: :meth:`LearnedModel.from_dbs` fits one on kernel
databases' verified rows, or returns None where there are too few.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..ir import BLayout, Program
from ..problem import Shape, program_key
from ..targets import Gpu
from .policies import RidgeCostModel, program_vector
from .simulate import model_us

MIN_ROWS = 32  # fewer verified measurements than this: no learned model
# The neighbour correction: a residual measured d octaves away (log2 distance over M, N
# and K) weighs exp(-(d / NEIGHBOUR_OCTAVES)^2), and the weights' sum is shrunk by
# NEIGHBOUR_PRIOR (a program seen on one far shape moves little). Both chosen on benchmark
# files the reported figure does not use (bench/results/README.md, "cpu-model-rank-neighbours").
NEIGHBOUR_OCTAVES = 2.0
NEIGHBOUR_PRIOR = 0.1


def measured_db_path(gpu: Gpu) -> Path | None:
    """The measured rows shipped for ``gpu`` (``l2gen/data/measured_<gpu>.db``): every
    verified row of the committed clean-L2 benchmark files, whatever its speed (the
    serving database keeps the winners' shapes only), for a learned model to start from.
    None where none is shipped."""
    path = Path(__file__).resolve().parent.parent / "data" / f"measured_{gpu.name}.db"
    return path if path.is_file() else None


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long sequences (ties share their mean
    rank); 0 where either is constant."""

    def ranks(values):
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for t in range(i, j + 1):
                out[order[t]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = np.array(ranks(list(a))), np.array(ranks(list(b)))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    var = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum()) / var if var else 0.0


def features(program: Program, shape: Shape, gpu: Gpu) -> np.ndarray:
    return np.append(program_vector(program, shape, gpu), math.log(model_us(program, shape, gpu)))


def _octaves(shape: Shape) -> np.ndarray:
    return np.log2([shape.m, shape.n, shape.k])


class LearnedModel:
    """Predicted microseconds of a program on a shape, learned from measured ones.

    ``neighbours=False`` leaves out the per-program correction (the ridge regression alone).
    """

    def __init__(self, gpu: Gpu, lam: float = 1.0, *, neighbours: bool = True):
        self.gpu = gpu
        self._ridge = RidgeCostModel(lam=lam)
        self.neighbours = neighbours
        # every row fit: (program key, shape, its features, log µs); the residual table
        # (program key -> shapes' octaves, residuals) is remade after a fit, when first needed
        self._rows: list[tuple[str, Shape, np.ndarray, float]] = []
        self._table: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    def __len__(self) -> int:
        return len(self._ridge)

    def fit(self, rows: Iterable[tuple[Program, Shape, float]]) -> "LearnedModel":
        """Add (program, shape, measured µs) rows; returns self."""
        rows = [(p, s, t) for p, s, t in rows if t and t > 0]
        if rows:
            vectors = [features(p, s, self.gpu) for p, s, _ in rows]
            targets = [math.log(t) for _, _, t in rows]
            self._ridge.add_many(vectors, targets)
            self._rows += [(program_key(p), s, v, y) for (p, s, _), v, y in zip(rows, vectors, targets)]
            self._table = None
        return self

    def _residuals(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per program key: the octaves of the shapes it was measured on, and its residual
        there (measured minus the regression's log time, less that shape's mean residual)."""
        if self._table is None:
            res = np.array([y for *_, y in self._rows]) - self._ridge.predict([v for _, _, v, _ in self._rows])
            by_shape: dict[Shape, list[int]] = {}
            for i, (_, s, _, _) in enumerate(self._rows):
                by_shape.setdefault(s, []).append(i)
            for ii in by_shape.values():
                res[ii] -= res[ii].mean()
            table: dict[str, tuple[list, list]] = {}
            for (key, s, _, _), r in zip(self._rows, res):
                octaves, values = table.setdefault(key, ([], []))
                octaves.append(_octaves(s))
                values.append(r)
            self._table = {k: (np.array(o), np.array(v)) for k, (o, v) in table.items()}
        return self._table

    def _correction(self, program: Program, shape: Shape) -> float:
        found = self._residuals().get(program_key(program))
        if found is None:
            return 0.0
        octaves, values = found
        w = np.exp(-((octaves - _octaves(shape)) ** 2).sum(axis=1) / NEIGHBOUR_OCTAVES**2)
        return float((w * values).sum() / (w.sum() + NEIGHBOUR_PRIOR))

    def predict_us(self, programs: Sequence[Program], shape: Shape) -> list[float]:
        if not len(self._ridge):
            return [model_us(p, shape, self.gpu) for p in programs]
        logs = self._ridge.predict([features(p, shape, self.gpu) for p in programs])
        if self.neighbours:
            logs = [v + self._correction(p, shape) for v, p in zip(logs, programs)]
        return [math.exp(v) for v in logs]

    @classmethod
    def from_dbs(cls, dbs: Sequence, gpu: Gpu, *, l2: str | None = None, b_layout: BLayout | None = None,
                 min_rows: int = MIN_ROWS) -> "LearnedModel | None":
        """A model fit on :func:`db_rows` of kernel databases for ``gpu``, or None where they
        hold fewer than ``min_rows``."""
        rows = db_rows(dbs, gpu, l2=l2, b_layout=b_layout)
        return cls(gpu).fit(rows) if len(rows) >= min_rows else None


def db_rows(dbs: Sequence, gpu: Gpu, *, l2: str | None = None,
            b_layout: BLayout | None = None) -> list[tuple[Program, Shape, float]]:
    """(program, shape, µs) of the verified rows of kernel databases for ``gpu`` (under
    ``l2``; of ``b_layout``, if given): what a learned model fits on. A row that two
    databases both hold (the same program, shape and times: one benchmark file imported
    into each) counts once."""
    rows, seen = [], set()
    for db in dbs:
        for shape in db.shapes(gpu):
            for m in db.history(gpu, shape, l2=l2, loops=False):
                if m.status == "ok" and m.time_us and (b_layout is None or m.program.b_layout is b_layout):
                    key = (program_key(m.program), shape, m.time_us, m.baseline_us)
                    if key not in seen:
                        seen.add(key)
                        rows.append((m.program, shape, m.time_us))
    return rows
