"""How much prefill one step may carry: a token budget, and under an inter-token-latency
target, the tokens a cost model of the step predicts will fit in it. The target is a time
(``itl_target_ms``), a multiple of what the step's decodes alone take (``itl_ratio``: the
default, so a step that prefills beside decodes lasts at most that many decode steps, on a
fast machine or a slow one), or the shorter of the two.

A mixed step carries every running decode, so its length is every running request's
inter-token latency. The model predicts a step's seconds as a linear function of its shape,
refitted from the steps the engine really ran:

    seconds ~ c0 + c1 * extend tokens + c2 * decode rows + c3 * decode KV tokens
              + c4 * extend attention pairs

(a decode row reads its whole context; an extend token at position p attends over p + 1
keys, so a chunk of n tokens after a prefix of p costs ``n * p + n (n + 1) / 2`` pairs).
Coefficients are kept non-negative: a step never gets cheaper by carrying more.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

# Fit on the most recent steps: those that prefilled (they teach the prefill costs) and,
# kept apart so a long decode-only stretch does not push them out, those that did not.
PREFILL_WINDOW = 256
DECODE_WINDOW = 64
MIN_PREFILL_SAMPLES = 6
# Feature scales: the fit sees numbers near 1.
_SCALE = np.array([1.0, 1e3, 1e2, 1e5, 1e6])


def extend_pairs(n: int, prefix: int) -> int:
    """Query-key pairs of a chunk of ``n`` tokens after ``prefix`` cached ones."""
    return n * prefix + n * (n + 1) // 2


def step_features(extends: Iterable[tuple[int, int]], decode_contexts: Iterable[int]) -> np.ndarray:
    """``extends``: (new tokens, prefix) per chunk; ``decode_contexts``: each decode row's
    context length."""
    ext = list(extends)
    ctx = list(decode_contexts)
    return np.array(
        [1.0, sum(n for n, _ in ext), len(ctx), sum(ctx), sum(extend_pairs(n, p) for n, p in ext)]
    )


class StepCostModel:
    def __init__(self) -> None:
        self._prefill: deque[tuple[np.ndarray, float]] = deque(maxlen=PREFILL_WINDOW)
        self._decode: deque[tuple[np.ndarray, float]] = deque(maxlen=DECODE_WINDOW)
        self._coef: np.ndarray | None = None
        self._stale = False  # steps seen since the last fit

    @property
    def fitted(self) -> bool:
        return len(self._prefill) >= MIN_PREFILL_SAMPLES

    @property
    def coef(self) -> np.ndarray | None:
        """Seconds per unit of each feature, refitted when read after new steps (a stretch
        of decode-only steps, which size no prefill, pays no fit)."""
        if self._stale and self.fitted:
            self._coef, self._stale = self._fit(), False
        return self._coef

    def observe(self, features: np.ndarray, seconds: float) -> None:
        (self._prefill if features[1] else self._decode).append((features, seconds))
        self._stale = True

    def predict(self, features: np.ndarray) -> float:
        coef = self.coef
        if coef is None:
            raise RuntimeError("the step cost model has seen too few steps to predict")
        return float(features @ coef)

    def _fit(self) -> np.ndarray:
        samples = list(self._prefill) + list(self._decode)
        x = np.stack([f for f, _ in samples]) / _SCALE
        y = np.array([s for _, s in samples])
        # Least squares, dropping a feature whose weight comes out negative and refitting
        # (with five features this is non-negative least squares in a few passes).
        active = np.ones(x.shape[1], dtype=bool)
        while True:
            coef = np.zeros(x.shape[1])
            coef[active] = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
            negative = active & (coef < 0)
            if not negative.any():
                return coef / _SCALE
            active &= ~negative

    def max_extend(self, prefix: int, seconds: float) -> int:
        """The longest chunk after ``prefix`` cached tokens predicted to take ``seconds``."""
        if seconds <= 0:
            return 0
        coef = self.coef
        b = coef[1] + coef[4] * (prefix + 0.5)  # per token, plus n^2/2 per pair
        e = coef[4] / 2
        if e <= 0:
            return math.inf if b <= 0 else int(seconds / b)
        return int((-b + math.sqrt(b * b + 4 * e * seconds)) / (2 * e))


class ItlBudget:
    """Sizes the prefill of each step that carries decodes to an inter-token-latency target
    (``target_s``, ``ratio`` times the decodes' own time, or the shorter); a step without
    decodes has no one's latency to protect and takes the token budget whole. Until the
    model has seen enough prefill steps it probes: the allowance doubles after a step within
    the target and halves after one over it, so the first steps neither stall decodes nor
    crawl (under a ratio, the last decode-only step stands for the decodes' time)."""

    def __init__(
        self, page: int, max_tokens: int, target_s: float | None = None, ratio: float | None = None
    ) -> None:
        if target_s is None and ratio is None:
            raise ValueError("an ITL budget needs a target time or a ratio")
        self.target_s = math.inf if target_s is None else target_s
        self.ratio = ratio
        self.page = page
        self.max_tokens = max_tokens
        self.model = StepCostModel()
        self.probe = page
        # the last decode-only step's seconds, for probing under a ratio (none seen yet: the
        # probe holds at a page until one is, or until the model fits)
        self.decode_s = 0.0

    def target(self, decode_s: float) -> float:
        """The longest a step may take whose decodes alone take ``decode_s``."""
        return self.target_s if self.ratio is None else min(self.target_s, self.ratio * decode_s)

    def budget(self, tokens: int, decode_contexts: list[int]) -> PrefillBudget:
        if not decode_contexts:
            return PrefillBudget(tokens, self.page)
        if not self.model.fitted:
            return PrefillBudget(min(tokens, self.probe), self.page)
        decode = self.model.predict(step_features((), decode_contexts))
        return PrefillBudget(tokens, self.page, self.model, self.target(decode) - decode)

    def observe(self, features: np.ndarray, seconds: float) -> None:
        self.model.observe(features, seconds)
        if not features[2]:  # nothing decoded: no one's latency to learn from
            return
        if not features[1]:  # decodes alone
            self.decode_s = seconds
        else:  # a step that prefilled beside decodes
            grow = seconds <= self.target(self.decode_s)
            self.probe = min(self.max_tokens, self.probe * 2) if grow else self.probe // 2
            self.probe = max(self.page, self.probe)


class PrefillBudget:
    """What is left of one step's prefill allowance while the scheduler fills it."""

    def __init__(
        self,
        tokens: int,
        page: int,
        model: StepCostModel | None = None,
        seconds: float = math.inf,
    ) -> None:
        """``tokens``: the token budget left after the decodes; ``seconds``: the time left
        for prefill under the target (``model`` turns it into tokens)."""
        self.page = page
        self.tokens = max(tokens, page)  # the floor: a page of progress whenever prompts wait
        self.model = model if seconds != math.inf else None
        self.seconds = seconds
        self.floor_left = True
        self.initial = self.allow(0)

    def allow(self, prefix: int) -> int:
        """Tokens a chunk starting after ``prefix`` computed tokens may take."""
        n = self.tokens
        if self.model is not None:
            n = min(n, self.model.max_extend(prefix, self.seconds))
        if self.floor_left:
            n = max(n, self.page)
        return max(n, 0)

    def take(self, n: int, prefix: int) -> None:
        self.tokens -= n
        if self.model is not None:
            c = self.model.coef
            self.seconds -= c[1] * n + c[4] * extend_pairs(n, prefix)
        self.floor_left = False

    @property
    def exhausted(self) -> bool:
        return self.allow(0) <= 0
