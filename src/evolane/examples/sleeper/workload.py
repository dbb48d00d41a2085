"""The sleeper's pure model: configuration, per-case plans, the judge's score and the dataset.

Everything is a function of its arguments alone. Randomness comes from `random.Random` seeded
with a string (CPython hashes a str seed with SHA-512, so it never depends on the salted
``hash()``), hence the same case, seed and configuration give the same plan on every run and
every host. Standard library only: the commands built on it must start in milliseconds.
"""

from __future__ import annotations

import math
import random

FAULT_MODES = ("fail", "hang", "ignore_term", "escape", "flood")
"""Fault modes in the order their rates partition the unit interval; the rest is ``normal``."""
MODES = ("normal", *FAULT_MODES)
"""Every mode a replay can take."""

SPLITS = ("train", "val", "test")
"""Dataset splits, about 25 / 50 / 25 per cent of the cases."""
NOISE_SD = 0.05
"""Standard deviation of the judge's per-replay noise."""
BASE_RANGE = (0.2, 0.8)
"""The per-case base score is uniform on this interval."""
TOKENS_RANGE = (100, 4000)
"""Reported tokens are uniform integers on this closed interval."""
USD_PER_TOKEN = 2e-6
"""Reported cost of one token."""

_RATE_FIELDS = tuple(f"{mode}_rate" for mode in FAULT_MODES)
_DEFAULTS: dict[str, float | int] = {
    "median_seconds": 0.2,
    "spread": 0.25,
    **dict.fromkeys(_RATE_FIELDS, 0.0),
    "flood_bytes": 1 << 20,
    "tokens_rate": 1.0,
}


def _rng(*parts: object) -> random.Random:
    """A generator determined by ``parts`` alone (a str seed is hashed with SHA-512)."""
    return random.Random("sleeper/" + "/".join(str(part) for part in parts))


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


class SleeperConfig:
    """The workload's knobs, stored as ``sleeper.json`` in the target (the candidate) folder."""

    __slots__ = (
        "escape_rate",
        "fail_rate",
        "flood_bytes",
        "flood_rate",
        "hang_rate",
        "ignore_term_rate",
        "median_seconds",
        "spread",
        "tokens_rate",
    )

    median_seconds: float
    spread: float
    fail_rate: float
    hang_rate: float
    ignore_term_rate: float
    escape_rate: float
    flood_rate: float
    flood_bytes: int
    tokens_rate: float

    def __init__(self, **fields: float) -> None:
        unknown = set(fields) - set(_DEFAULTS)
        if unknown:
            raise ValueError(f"unknown sleeper setting(s): {', '.join(sorted(unknown))}")
        for name, default in _DEFAULTS.items():
            value = _number(name, fields.get(name, default))
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
            if name.endswith("_rate") and value > 1:
                raise ValueError(f"{name} must be <= 1, got {value!r}")
            if name == "flood_bytes":
                if value != int(value):
                    raise ValueError(f"flood_bytes must be an integer, got {value!r}")
                value = int(value)
            object.__setattr__(self, name, value)
        total = sum(getattr(self, name) for name in _RATE_FIELDS)
        if total > 1 + 1e-9:
            raise ValueError(f"the fault rates add up to {total:.6g}, more than 1")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("SleeperConfig is immutable")

    @classmethod
    def from_dict(cls, data: object) -> SleeperConfig:
        """Parse a ``sleeper.json`` document; missing settings take their defaults."""
        if not isinstance(data, dict):
            raise ValueError("sleeper.json must hold a JSON object")
        return cls(**{key: value for key, value in data.items() if key != "version"})

    def to_dict(self) -> dict[str, float | int]:
        """The JSON form written to ``sleeper.json`` (keys sorted when dumped)."""
        return {"version": 1, **{name: getattr(self, name) for name in _DEFAULTS}}

    def rates(self) -> dict[str, float]:
        """The configured probability of each fault mode."""
        return {mode: getattr(self, f"{mode}_rate") for mode in FAULT_MODES}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SleeperConfig) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.to_dict().items()))

    def __repr__(self) -> str:
        settings = ", ".join(f"{name}={getattr(self, name)!r}" for name in _DEFAULTS)
        return f"SleeperConfig({settings})"


class Plan:
    """What one replay of a case with a seed does: its mode, its sleep and its usage report."""

    __slots__ = ("case_id", "cost_usd", "duration", "mode", "report_usage", "seed", "tokens")

    def __init__(
        self,
        *,
        case_id: str,
        seed: int,
        mode: str,
        duration: float,
        report_usage: bool,
        tokens: int,
        cost_usd: float,
    ) -> None:
        self.case_id = case_id
        self.seed = seed
        self.mode = mode
        self.duration = duration
        self.report_usage = report_usage
        self.tokens = tokens
        self.cost_usd = cost_usd

    def as_dict(self) -> dict[str, object]:
        """The plan's fields as a plain dict."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return hash(tuple(self.as_dict().items()))

    def __repr__(self) -> str:
        return "Plan(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


def plan(case_id: str, seed: int, config: SleeperConfig) -> Plan:
    """The replay of ``case_id`` with ``seed``: the fault mode, then usage, then the duration.

    The mode comes from one uniform draw against the cumulative fault rates (modes are
    exclusive); the duration is log-normal with median ``median_seconds`` and sigma ``spread``.
    """
    rng = _rng("plan", case_id, seed)
    draw = rng.random()
    mode, edge = "normal", 0.0
    for fault, rate in config.rates().items():
        edge += rate
        if draw < edge:
            mode = fault
            break
    report_usage = rng.random() < config.tokens_rate
    tokens = rng.randint(*TOKENS_RANGE)
    z = rng.gauss(0.0, 1.0)
    median = config.median_seconds
    duration = median * math.exp(config.spread * z) if median > 0 else 0.0
    return Plan(
        case_id=case_id,
        seed=seed,
        mode=mode,
        duration=duration,
        report_usage=report_usage,
        tokens=tokens,
        cost_usd=round(tokens * USD_PER_TOKEN, 10),
    )


def base_score(case_id: str) -> float:
    """The case's base score, uniform on `BASE_RANGE`; it depends on the case id only."""
    return _rng("base", case_id).uniform(*BASE_RANGE)


def noise(case_id: str, seed: int, variant: str = "") -> float:
    """The judge's noise, N(0, `NOISE_SD`), for one replay of ``case_id`` with ``seed``.

    ``variant`` names the candidate's behaviour (see `variant_of`), so a baseline and a
    candidate with different effects draw independent noise on the same case and seed.
    """
    return _rng("noise", case_id, seed, variant).gauss(0.0, NOISE_SD)


def variant_of(effect: float, declared: object = None) -> str:
    """The noise variant of a candidate: its declared ``variant``, else one named by its effect."""
    return declared if isinstance(declared, str) else f"effect={float(effect)!r}"


def score(case_id: str, seed: int, effect: float, variant: str = "") -> dict[str, float]:
    """The judge's verdict: ``score = clip(base + effect + noise, 0, 1)`` with its parts."""
    base = base_score(case_id)
    jitter = noise(case_id, seed, variant)
    value = min(1.0, max(0.0, base + effect + jitter))
    return {"score": value, "base": base, "effect": float(effect), "noise": jitter}


def case_id(index: int) -> str:
    """The id of the ``index``-th case (1-based): ``case-0001``."""
    return f"case-{index:04d}"


def split_counts(cases: int) -> dict[str, int]:
    """How many cases go to each split: a quarter train, a quarter test, the rest val."""
    quarter = cases // 4
    return {"train": quarter, "val": cases - 2 * quarter, "test": quarter}


def dataset_rows(cases: int, seed: int) -> list[dict[str, object]]:
    """The dataset's rows (DESIGN §8), deterministic in ``cases`` and ``seed``."""
    if cases < 1:
        raise ValueError(f"cases must be >= 1, got {cases}")
    order = list(range(cases))
    _rng("split", seed).shuffle(order)
    counts = split_counts(cases)
    split_of: dict[int, str] = {}
    for rank, index in enumerate(order):
        if rank < counts["train"]:
            split_of[index] = "train"
        elif rank < counts["train"] + counts["val"]:
            split_of[index] = "val"
        else:
            split_of[index] = "test"
    tokens = _rng("input", seed)
    rows: list[dict[str, object]] = []
    for index in range(cases):
        number = index + 1
        rows.append(
            {
                "id": case_id(number),
                "input": {"index": number, "task": f"sleeper task {number}"},
                "split": split_of[index],
                "metadata": {
                    "workload": "sleeper",
                    "generator_seed": seed,
                    "nonce": f"{tokens.getrandbits(64):016x}",
                },
            }
        )
    return rows


def choose_effect(effects: list[float], seed: int, iteration: int) -> tuple[int, float]:
    """The optimizer's pick: index ``(seed + iteration) mod len(effects)`` and its effect."""
    if not effects:
        raise ValueError("the effect list is empty")
    index = (seed + iteration) % len(effects)
    return index, effects[index]
