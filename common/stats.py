"""The statistics of every study table: per-seed values, t-based 95% intervals and Welch's test
(scipy.stats), and a seed bootstrap of a power-law exponent fitted with scipy.optimize.curve_fit
(scipy is imported here only, and only when called).

    s = summarize([2.37, 2.38, 2.39])      # Summary(n, mean, std, lo, hi, values)
    p = welch_p(a, b)                      # two-sided Welch t-test p-value (None below 2 values a side)
    verdict(a, b, "pre_ln", "geonorm")     # 'pre_ln ahead (p=0.003)' or 'not separated (p=0.21)'
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

ALPHA = 0.05   # a difference is "separated" when Welch's p < ALPHA


@dataclass(frozen=True)
class Summary:
    n: int
    mean: Optional[float]
    std: Optional[float]          # sample std (n - 1); None below 2 values
    lo: Optional[float]           # 95% t interval of the mean; None below 2 values
    hi: Optional[float]
    values: tuple

    def ci(self, digits: int = 3) -> str:
        return "—" if self.lo is None else f"[{self.lo:.{digits}f}, {self.hi:.{digits}f}]"

    def mean_std(self, digits: int = 3) -> str:
        if self.mean is None:
            return "—"
        return f"{self.mean:.{digits}f}" + ("" if self.std is None else f" ± {self.std:.{digits}f}")

    def per_seed(self, digits: int = 3) -> str:
        return ", ".join(f"{v:.{digits}f}" for v in self.values) or "—"


def summarize(values: Sequence[float], confidence: float = 0.95) -> Summary:
    """Mean, sample std and the t-based confidence interval of the mean (scipy.stats.t)."""
    xs = tuple(float(v) for v in values)
    if not xs:
        return Summary(0, None, None, None, None, xs)
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Summary(1, mean, None, None, None, xs)
    from scipy import stats

    std = statistics.stdev(xs)
    half = stats.t.ppf(0.5 + confidence / 2, len(xs) - 1) * std / math.sqrt(len(xs))
    return Summary(len(xs), mean, std, float(mean - half), float(mean + half), xs)


def welch_p(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Two-sided p-value of Welch's unequal-variance t-test of mean(a) == mean(b); None when either
    side has fewer than 2 values. Two identical constant samples give p = 1."""
    if len(a) < 2 or len(b) < 2:
        return None
    from scipy import stats

    if statistics.pstdev(a) == 0 and statistics.pstdev(b) == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def verdict(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, alpha: float = ALPHA) -> str:
    """Lower is better (a loss). '<name> ahead (p=...)' only where Welch's test separates the two."""
    p = welch_p(a, b)
    if p is None:
        return "not tested (fewer than 2 seeds)"
    if p >= alpha:
        return f"not separated (p={p:.2g})"
    ahead = name_a if statistics.fmean(a) < statistics.fmean(b) else name_b
    return f"{ahead} ahead (p={p:.2g})"


def power_law_fit(n: Sequence[float], loss: Sequence[float]):
    """Fit loss = a * n^(-b) over model sizes n, as a line in log-log space (scipy.optimize.curve_fit).
    No irreducible term: three sizes cannot identify it. Returns (a, b); b > 0 means loss falls with n."""
    import numpy as np
    from scipy.optimize import curve_fit

    x, y = np.log(np.asarray(n, dtype=float)), np.log(np.asarray(loss, dtype=float))
    (log_a, b), _ = curve_fit(lambda t, la, bb: la - bb * t, x, y, p0=(float(y.mean()), 0.05))
    return float(math.exp(log_a)), float(b)


def bootstrap_slope(n_by_point: Sequence[float], losses_by_point: Sequence[Sequence[float]], n_resamples: int = 1000,
                    seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """The fitted exponent b of power_law_fit over points (model sizes), each with its per-seed losses,
    and its percentile bootstrap interval from resampling the seeds within every point. (b, lo, hi)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    mean = [statistics.fmean(xs) for xs in losses_by_point]
    b = power_law_fit(n_by_point, mean)[1]
    draws = []
    for _ in range(n_resamples):
        resampled = [statistics.fmean(rng.choice(xs, size=len(xs), replace=True)) for xs in losses_by_point]
        draws.append(power_law_fit(n_by_point, resampled)[1])
    q = (1 - confidence) / 2
    return b, float(np.quantile(draws, q)), float(np.quantile(draws, 1 - q))


def diff_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> tuple[float, Optional[float], Optional[float]]:
    """mean(a) - mean(b) and its Welch-Satterthwaite t interval (None below 2 values a side)."""
    d = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return d, None, None
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return d, d, d
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.5 + confidence / 2, dof) * se
    return d, float(d - half), float(d + half)


def welch_p_from_summary(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int) -> float:
    """Welch's p-value from published mean ± std over n seeds (scipy.stats.ttest_ind_from_stats), for
    tables whose per-seed values were not kept."""
    from scipy import stats

    return float(stats.ttest_ind_from_stats(mean_a, std_a, n_a, mean_b, std_b, n_b, equal_var=False).pvalue)
