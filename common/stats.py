"""The statistics of every study table (scipy.stats; scipy is imported here only, and only when called):
per-seed values and t-based 95% intervals, Welch's test, paired t intervals and tests by seed, TOST
equivalence at a stated margin, Holm's correction over a table, the parabola in log-lr through a grid's
best, and a power-law exponent with a t interval (every per-seed value a replicate; no seed bootstrap).

    s = summarize([2.37, 2.38, 2.39])      # Summary(n, mean, std, lo, hi, values)
    d = paired({0: 2.31, 1: 2.33}, {0: 2.35, 1: 2.36})   # per-seed a - b: mean, t CI, p, TOST p per margin
    three_word_verdicts([d, ...], [("geonorm", "pre_ln"), ...])   # 'ahead', 'equivalent within ±m', 'undecided'
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


def diff_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> tuple[float, Optional[float], Optional[float]]:
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


# --- paired comparisons, equivalence, multiplicity ----------------------------------------------------
# Where two cells share the seed's data order and init (every cell of a study does: the seed fixes both),
# the per-seed differences carry the comparison: their spread is the noise, not the seeds' spread.

MARGIN = 0.02        # nats: "equivalent" means the whole difference lies within +/- MARGIN (TOST)
PAPER_MARGIN = 0.04  # nats: the GeoNorm paper's effect size, reported beside MARGIN
# bits per byte: half the smaller of the GeoNorm paper's two 125M gaps (Arxiv, 0.024 nats per token) at the 3.53
# UTF-8 bytes per GPT-2 token measured on the offline English corpus (docs/horizon16_study.md, "Units")
BPB_MARGIN = 0.005


@dataclass(frozen=True)
class Paired:
    """a - b per seed (lower is better, so a negative mean favours a)."""
    n: int
    diffs: tuple
    mean: float
    lo: Optional[float]           # 95% paired t interval of the mean difference; None below 2 seeds
    hi: Optional[float]
    p: Optional[float]            # two-sided paired t-test of mean difference 0
    p_equiv: dict                 # margin -> TOST p-value of |mean difference| >= margin (small: equivalent)

    def ci(self, digits: int = 3) -> str:
        return "—" if self.lo is None else f"[{self.lo:+.{digits}f}, {self.hi:+.{digits}f}]"


def paired(a: dict, b: dict, margins: Sequence[float] = (MARGIN, PAPER_MARGIN), confidence: float = 0.95) -> Paired:
    """Paired t analysis of `a` and `b`, each {seed: value}, over the seeds both have."""
    seeds = sorted(set(a) & set(b), key=str)
    d = tuple(float(a[s]) - float(b[s]) for s in seeds)
    n = len(d)
    if n == 0:
        return Paired(0, d, math.nan, None, None, None, {m: None for m in margins})
    mean = statistics.fmean(d)
    if n < 2:
        return Paired(1, d, mean, None, None, None, {m: None for m in margins})
    from scipy import stats

    sd = statistics.stdev(d)
    se = sd / math.sqrt(n)
    if se == 0:  # identical differences: the sign test is certain, equivalence is exact
        return Paired(n, d, mean, mean, mean, 1.0 if mean == 0 else 0.0,
                      {m: 0.0 if abs(mean) < m else 1.0 for m in margins})
    t = stats.t(n - 1)
    half = t.ppf(0.5 + confidence / 2) * se
    p = float(2 * t.sf(abs(mean) / se))
    # TOST: H0 mean <= -m (rejected when the mean is well above -m) and H0 mean >= m; p is the larger
    p_equiv = {m: float(max(t.sf((mean + m) / se), t.cdf((mean - m) / se))) for m in margins}
    return Paired(n, d, mean, float(mean - half), float(mean + half), p, p_equiv)


def holm(pvalues: Sequence[Optional[float]]) -> list:
    """Holm's step-down adjustment of a family of p-values (None stays None and is not counted)."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    out: list = [None] * len(pvalues)
    m, running = len(idx), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


class Verdict(str):
    """A comparison's verdict: the sentence a table prints, and its parts for a table that lays them out
    itself. `word`: 'ahead', 'equivalent', 'undecided' or 'not tested'; `winner`: the name ahead (or None);
    `p`: the Holm-adjusted p of the difference test; `p_equiv`: that of the TOST at `margin`."""

    word: str
    winner: Optional[str]
    p: Optional[float]
    p_equiv: Optional[float]
    margin: float

    def __new__(cls, word: str, winner: Optional[str], p: Optional[float], p_equiv: Optional[float],
                margin: float) -> "Verdict":
        if word == "not tested":
            text = "not tested (fewer than 2 paired seeds)"
        elif word == "ahead":
            text = f"{winner} ahead (Holm p={p:.2g})"
        elif word == "equivalent":
            text = f"equivalent within ±{margin:g} (Holm TOST p={p_equiv:.2g})"
        else:
            text = f"undecided (Holm p={p:.2g}; TOST ±{margin:g} p={p_equiv:.2g})"
        v = super().__new__(cls, text)
        v.word, v.winner, v.p, v.p_equiv, v.margin = word, winner, p, p_equiv, margin
        return v


def three_word_verdicts(comparisons: Sequence[Paired], names: Sequence[tuple], margin: float = MARGIN,
                        alpha: float = ALPHA) -> list:
    """One Verdict per comparison of a table, Holm-corrected over the table (the difference tests as one
    family, the equivalence tests at `margin` as another): '<a> ahead' where the adjusted paired test
    rejects 0, 'equivalent within ±m' where the adjusted TOST rejects a difference of m or more, else
    'undecided'. `names`: (name of a, name of b) per comparison."""
    p_diff = holm([c.p for c in comparisons])
    p_eq = holm([c.p_equiv.get(margin) for c in comparisons])
    out = []
    for c, (na, nb), pd, pe in zip(comparisons, names, p_diff, p_eq):
        if pd is None:
            out.append(Verdict("not tested", None, None, None, margin))
        elif pd < alpha:
            out.append(Verdict("ahead", na if c.mean < 0 else nb, pd, pe, margin))
        elif pe is not None and pe < alpha:
            out.append(Verdict("equivalent", None, pd, pe, margin))
        else:
            out.append(Verdict("undecided", None, pd, pe, margin))
    return out


def parabola_optimum(values: Sequence[float], losses: Sequence[float]) -> Optional[tuple]:
    """The interpolated optimum of a grid over a log-spaced key (the lr): a parabola in log10(value)
    through the best point and its two neighbours. (value, loss) at the vertex, or None when the best is
    at the grid's edge or the three points are not convex (no minimum between them)."""
    pts = sorted(zip(values, losses))
    i = min(range(len(pts)), key=lambda k: pts[k][1])
    if i == 0 or i == len(pts) - 1:
        return None
    (x0, y0), (x1, y1), (x2, y2) = [(math.log10(v), y) for v, y in pts[i - 1:i + 2]]
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    if a <= 0:
        return None
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    c = y1 - a * x1 * x1 - b * x1
    xv = -b / (2 * a)
    return 10 ** xv, c - b * b / (4 * a)


def slope_t_interval(n_by_point: Sequence[float], losses_by_point: Sequence[Sequence[float]],
                     confidence: float = 0.95) -> tuple:
    """The exponent b of loss = a * n^(-b), fitted by least squares in log-log space to every per-seed
    value (each point's seeds as replicates), and its t interval from the fit's standard error with
    N - 2 degrees of freedom (N values). (b, lo, hi); lo/hi None with fewer than 3 values."""
    import numpy as np
    from scipy import stats

    x = np.concatenate([[math.log(n)] * len(ys) for n, ys in zip(n_by_point, losses_by_point)])
    y = np.log(np.concatenate([np.asarray(ys, dtype=float) for ys in losses_by_point]))
    fit = stats.linregress(x, y)
    b = -float(fit.slope)
    if len(x) < 3:
        return b, None, None
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 2) * float(fit.stderr)
    return b, b - half, b + half


def interaction(first: Paired, second: Paired) -> tuple:
    """Does a method's gap depend on the setting (the block)? The per-seed gaps of two settings whose inits
    differ (so not paired across them), compared by Welch's test: (difference of mean gaps, lo, hi, p)."""
    d, lo, hi = diff_ci(first.diffs, second.diffs)
    return d, lo, hi, welch_p(first.diffs, second.diffs)


# --- re-reading published per-seed values ---------------------------------------------------------------------
# python -m common.stats pre_ln=2.382,2.371,2.380 hybridnorm=2.423,2.439,2.461 mhc=2.380,2.371,2.380
#   the first name is the reference; values are per seed, in the same seed order for every name.

def _values(arg: str) -> tuple:
    name, sep, values = arg.partition("=")
    try:
        xs = [float(v) for v in values.split(",")] if sep else []
    except ValueError:
        xs = []
    if not name or len(xs) < 2:
        raise SystemExit(f"error: {arg!r}: expected NAME=v0,v1,... (one value per seed, at least 2)")
    return name, dict(enumerate(xs))


def main(argv: Sequence[str]) -> None:
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        print("usage: python -m common.stats REF=v0,v1,... NAME=v0,v1,... [...]\n"
              "  each NAME against REF paired by seed (values in the same seed order), Holm over the NAMEs")
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    (ref, ref_values), *cells = [_values(a) for a in argv]
    comparisons = [paired(v, ref_values) for _, v in cells]
    verdicts = three_word_verdicts(comparisons, [(name, ref) for name, _ in cells])
    wide = holm([c.p_equiv.get(PAPER_MARGIN) for c in comparisons])
    print(f"| {ref} − | gap, paired [95% CI] | verdict (Holm; TOST ±{MARGIN:g}) | TOST ±{PAPER_MARGIN:g} (Holm) |")
    print("|---|---|---|---|")
    for (name, _), c, v, w in zip(cells, comparisons, verdicts, wide):
        print(f"| {name} | {c.mean:+.3f} {c.ci()} | {v} | {'equivalent' if w < ALPHA else 'not shown'} (p={w:.2g}) |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])


def ratio_se(num: Sequence[float], den: Sequence[float], num_b: Optional[Sequence[float]] = None) -> Optional[float]:
    """Standard error of the ratio sum(num) / sum(den) over clusters (documents: num their nats, den their
    bytes), by linearization: sqrt(D / (D - 1) * sum((num_d - r * den_d)^2)) / sum(den). With `num_b` (a
    second model's nats on the same clusters and bytes) it is the standard error of the difference of the
    two ratios, paired by cluster. None with fewer than two clusters."""
    import numpy as np

    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    D, total = len(num), float(den.sum())
    if D < 2 or total <= 0:
        return None
    resid = num - num.sum() / total * den
    if num_b is not None:
        nb = np.asarray(num_b, dtype=np.float64)
        resid = resid - (nb - nb.sum() / total * den)
    return math.sqrt(D / (D - 1) * float((resid ** 2).sum())) / total
