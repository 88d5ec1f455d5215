"""The study statistics on synthetic numbers with known answers: paired t, TOST, Holm, the parabola in
log-lr, and the exponent's t interval."""
import math

import pytest

from common.stats import holm, paired, parabola_optimum, slope_t_interval, three_word_verdicts


def test_paired_t_interval_and_test_by_hand():
    a = {0: 2.5, 1: 2.6, 2: 2.7}
    b = {0: 2.4, 1: 2.4, 2: 2.4, 3: 9.9}             # seed 3 has no partner: left out
    r = paired(a, b)
    assert r.n == 3 and r.diffs == pytest.approx((0.1, 0.2, 0.3))
    se = 0.1 / math.sqrt(3)
    assert r.mean == pytest.approx(0.2)
    assert (r.lo, r.hi) == pytest.approx((0.2 - 4.302653 * se, 0.2 + 4.302653 * se), rel=1e-6)  # t(2) 97.5%
    assert r.p == pytest.approx(0.0742, abs=2e-4)    # t = 3.464 on 2 dof, two-sided
    # paired is sharper than unpaired where the seeds move both sides together
    shared = {s: 2.3 + 0.1 * s for s in range(4)}
    r2 = paired({s: v + 0.01 + 0.001 * (s % 2) for s, v in shared.items()}, shared)
    assert r2.p < 1e-3 and r2.lo > 0


def test_tost_is_equivalence_at_the_stated_margin():
    same = paired({s: 2.0 + 0.001 * (s % 3) for s in range(5)}, {s: 2.0 for s in range(5)})
    assert same.p_equiv[0.02] < 0.001 and same.p_equiv[0.04] < same.p_equiv[0.02]
    # a difference of about the margin is not equivalent at it
    edge = paired({0: 2.02, 1: 2.03, 2: 2.01}, {0: 2.0, 1: 2.0, 2: 2.0})
    assert edge.p_equiv[0.02] > 0.4
    # TOST p equals the larger one-sided p: check one case by hand
    from scipy import stats
    r = paired({0: 0.01, 1: 0.0, 2: 0.005}, {0: 0.0, 1: 0.0, 2: 0.0}, margins=(0.02,))
    se = 0.005 / math.sqrt(3)
    assert r.p_equiv[0.02] == pytest.approx(stats.t(2).cdf((0.005 - 0.02) / se))


def test_holm_by_hand():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, None, 0.001]) == [pytest.approx(0.5), None, pytest.approx(0.002)]
    assert holm([0.02, 0.5]) == pytest.approx([0.04, 0.5]) and holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_three_words_and_only_three():
    ahead = paired({s: 2.30 + 0.01 * s for s in range(3)}, {s: 2.40 + 0.01 * s + 0.001 * s * s for s in range(3)})
    equal = paired({s: 2.40 + 0.001 * (s % 2) for s in range(3)}, {s: 2.40 for s in range(3)})
    noisy = paired({0: 2.3, 1: 2.5, 2: 2.4}, {0: 2.4, 1: 2.4, 2: 2.4})
    v = three_word_verdicts([ahead, equal, noisy], [("geonorm", "pre_ln")] * 3)
    assert v[0].startswith("geonorm ahead (Holm p=")
    assert v[1].startswith("equivalent within ±0.02 (Holm TOST p=")
    assert v[2].startswith("undecided (Holm p=")
    assert (v[0].word, v[0].winner, v[1].word, v[1].winner, v[2].word) == (
        "ahead", "geonorm", "equivalent", None, "undecided")
    assert v[0].p < 0.05 <= v[2].p and v[1].p_equiv < 0.05 and f"p={v[0].p:.2g})" in v[0]
    # Holm: the same comparison alone can pass where, in a family of many, it does not
    borderline = paired({0: 2.30, 1: 2.33, 2: 2.31}, {0: 2.36, 1: 2.36, 2: 2.38})
    assert three_word_verdicts([borderline], [("a", "b")])[0].startswith("a ahead")
    assert three_word_verdicts([borderline] + [noisy] * 9, [("a", "b")] * 10)[0].startswith("undecided")


def test_parabola_in_log_lr_finds_the_vertex():
    lrs = [1e-3, 3e-3, 1e-2, 3e-2]
    f = [(math.log10(v) + 2.3) ** 2 * 0.5 + 2.0 for v in lrs]
    lr, loss = parabola_optimum(lrs, f)
    assert lr == pytest.approx(10 ** -2.3, rel=1e-9) and loss == pytest.approx(2.0)
    assert parabola_optimum([1e-3, 3e-3, 1e-2], [2.0, 2.1, 2.2]) is None   # best at the edge: no vertex inside
    assert parabola_optimum([1e-3, 3e-3, 1e-2], [2.2, 2.1, 2.1 - 1e-12]) is None


def test_exponent_interval_uses_t_quantiles():
    from scipy import stats
    n = [1e5, 2e5, 4e5]
    exact = [[3.0 * x ** -0.1] * 3 for x in n]
    b, lo, hi = slope_t_interval(n, exact)
    assert b == pytest.approx(0.1) and hi - lo == pytest.approx(0, abs=1e-9)
    noisy = [[3.0 * x ** -0.1 * (1 + e) for e in (-0.01, 0.0, 0.01)] for x in n]
    b, lo, hi = slope_t_interval(n, noisy)
    fit = stats.linregress([math.log(x) for x in n for _ in range(3)], [math.log(v) for ys in noisy for v in ys])
    assert b == pytest.approx(0.1, abs=1e-3)
    assert hi - b == pytest.approx(stats.t.ppf(0.975, 7) * fit.stderr)


def test_interaction_compares_per_seed_gaps_of_two_settings():
    from common.stats import interaction
    same = paired({0: 2.41, 1: 2.45, 2: 2.40}, {0: 2.36, 1: 2.40, 2: 2.35})       # +0.05 on every seed
    flipped = paired({0: 1.70, 1: 1.76, 2: 1.72}, {0: 1.75, 1: 1.80, 2: 1.78})    # -0.05, -0.04, -0.06
    d, lo, hi, p = interaction(same, flipped)
    assert d == pytest.approx(0.1) and lo < 0.1 < hi and p < 0.01
    d, _, _, p = interaction(flipped, paired({0: 1.60, 1: 1.66, 2: 1.62}, {0: 1.65, 1: 1.70, 2: 1.68}))
    assert abs(d) < 1e-9 and p > 0.9                                             # the same gaps: no interaction


def test_the_command_line_rereads_published_per_seed_values(capsys):
    from common.stats import main
    main(["pre_ln=2.382,2.371,2.380", "mhc=2.380,2.371,2.380", "pre_derf=3.462,3.448,3.456"])
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("| mhc | -0.001 [") and "equivalent within ±0.02" in out[2]
    assert out[3].startswith("| pre_derf | +1.078 [") and "pre_ln ahead (Holm p=" in out[3]
    with pytest.raises(SystemExit, match="'mhc=2.3': expected NAME=v0,v1"):
        main(["pre_ln=2.3,2.4", "mhc=2.3"])
