"""Does sampled speculative decoding keep the target's output distribution? A two-sample test with stated power.

Input: per prompt, output token sequences drawn WITH speculative decoding and WITHOUT it (same prompt, same
sampling settings, independent seeds). The first output token comes from prefill and is never speculative,
so the test compares the JOINT distribution of the first `positions` output tokens: each sequence's first m
tokens is one category (one that ended sooner: its tokens and an END mark).

Per prompt (METHOD below):
- categories: the first-m-token tuples seen in either sample; a category seen fewer than `min_count` times
  in both samples together is pooled with the other rare ones that share its longest prefix seen
  `min_count` times (bin "prefix, *"); a prefix bin still short of `min_count` passes its draws on to the
  next shorter prefix, the empty prefix being the "other" bin (merged into the smallest bin if still short).
  The binning depends on the two samples only through their pooled counts, so it is the same under any
  relabelling of draws between the samples, and every bin's expected count is about min_count / 2 or more;
- statistic: Pearson's chi-square test of homogeneity on the 2 x K table, df = K - 1, p from the chi-square
  distribution (pure numpy: the regularised incomplete gamma function below);
- power: under a shift of the binned distribution, the statistic is approximately noncentral chi-square
  with lambda = n_eff * sum_i d_i^2 / m_i (n_eff = n_sd * n_base / (n_sd + n_base), d = difference of the
  two distributions, m = their mixture). For any shift of total variation delta, Cauchy-Schwarz gives
  lambda >= 4 * n_eff * delta^2 (equality for the least favourable shift: mass moved between two halves of
  the distribution). `tv_detectable_80` is the smallest delta whose least favourable shift is detected with
  80% power at the Bonferroni level: solve P(ncx2(df, lambda) > crit) = 0.8 for lambda, then
  delta = sqrt(lambda / (4 * n_eff)). Every shift of at least that total variation is detected at least
  that often (to the approximation's accuracy). It is measured on the binned categories: a difference only
  inside a pooled bin, or beyond the first m tokens, is not seen.

Prompts are combined with Bonferroni: pooled p = min(1, P * min_i p_i); each prompt is tested at alpha / P.
The pooled `tv_detectable_80` is the largest prompt's (a shift of that size in any one prompt is detected
with >= 80% power). A prompt left with one bin (every draw the same sequence, or all pooled) can show no
difference: its tv_detectable_80 is 1. Verdict: "fail" when pooled p < alpha; else "underpowered" when a
prompt has fewer than `min_samples` draws per side or the pooled tv_detectable_80 exceeds `max_tv`; else
"pass".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

METHOD = (
    "chi2-homogeneity on first-m-token sequences, rare ones pooled by common prefix; bonferroni over prompts"
)
ALPHA = 0.01
POWER = 0.8
MIN_COUNT = 10  # a category needs this many draws (both samples together) to stay its own bin
MIN_SAMPLES = 20  # fewer draws per side for a prompt: the verdict is "underpowered" at best
MAX_TV = 0.25  # a check that cannot see a total-variation difference this large is "underpowered"
OTHER = ("<other>",)  # the bin of draws no common prefix holds
REST = "*"  # a prefix's bin: the draws that go on from it in ways too rare to bin one by one
END = "<end>"  # the output ended before the compared positions


# --- chi-square distributions (pure numpy) ---------------------------------------------------------------


def gammainc_lower(a: float, x: float) -> float:
    """Regularised lower incomplete gamma P(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 0.0
    log_pre = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return min(1.0, math.exp(log_pre) * total)
    # Lentz's continued fraction for Q(a, x)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return max(0.0, 1.0 - math.exp(log_pre) * h)


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X ~ chi-square(df)."""
    if df <= 0:
        return 1.0
    return 1.0 - gammainc_lower(df / 2, x / 2) if x > 0 else 1.0


def chi2_isf(p: float, df: int) -> float:
    """The x with chi2_sf(x, df) = p (bisection)."""
    lo, hi = 0.0, max(10.0, 4.0 * df)
    while chi2_sf(hi, df) > p:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if chi2_sf(mid, df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * hi:
            break
    return (lo + hi) / 2


def ncx2_sf(x: float, df: int, lam: float) -> float:
    """P(X > x) for X ~ noncentral chi-square(df, lam): the Poisson(lam / 2) mixture of central ones, with
    P(a + j, y) from P(a, y) by the recurrence P(a + 1, y) = P(a, y) - y^a e^-y / Gamma(a + 1)."""
    if lam <= 0:
        return chi2_sf(x, df)
    a, y, mu = df / 2, x / 2, lam / 2
    jmax = int(mu + 12 * math.sqrt(mu) + 30)
    j = np.arange(jmax + 1)
    log_w = -mu + j * math.log(mu) - np.array([math.lgamma(k + 1) for k in j])
    log_terms = (a + j) * math.log(y) - y - np.array([math.lgamma(a + k + 1) for k in j]) if y > 0 else None
    p = np.empty(jmax + 1)
    p[0] = gammainc_lower(a, y)
    for k in range(1, jmax + 1):
        p[k] = max(0.0, p[k - 1] - (math.exp(log_terms[k - 1]) if log_terms is not None else 0.0))
    return float(1.0 - np.sum(np.exp(log_w) * p))


@lru_cache(maxsize=256)
def noncentrality_for_power(df: int, alpha: float, power: float = POWER) -> float:
    """The lambda at which a level-alpha chi-square(df) test rejects with probability `power`."""
    crit = chi2_isf(alpha, df)
    lo, hi = 0.0, 1.0
    while ncx2_sf(crit, df, hi) < power:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if ncx2_sf(crit, df, mid) < power:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-6 * hi:
            break
    return hi


def tv_detectable(n_a: int, n_b: int, df: int, alpha: float, power: float = POWER) -> float:
    """Smallest total variation whose least favourable shift a level-alpha test with df degrees of freedom
    detects with `power`, at n_a and n_b draws (lambda >= 4 n_eff TV^2, see the module docstring)."""
    if n_a <= 0 or n_b <= 0:
        return 1.0
    n_eff = n_a * n_b / (n_a + n_b)
    lam = noncentrality_for_power(max(df, 1), alpha, power)
    return min(1.0, math.sqrt(lam / (4 * n_eff)))


# --- the test ----------------------------------------------------------------------------------------------


def categories(seqs: Sequence[Sequence[int]], positions: int) -> list[tuple[Any, ...]]:
    """Each sequence's first `positions` tokens as a category; one that ended sooner gets END after its
    tokens (ending there is not the same outcome as going on)."""
    return [tuple(int(t) for t in s[:positions]) + ((END,) if len(s) < positions else ()) for s in seqs]


def _bin_labels(total: Counter[tuple[Any, ...]], min_count: int) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """category -> its bin: the category itself when seen min_count times, else its longest prefix seen
    min_count times (label: prefix + REST); a prefix bin still short of min_count passes its draws on to
    the next shorter prefix, and the empty prefix is OTHER."""
    support: Counter[tuple[Any, ...]] = Counter()
    for c, n in total.items():
        for i in range(1, len(c) + 1):
            support[c[:i]] += n
    assigned: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for c in total:
        node = next((c[:i] for i in range(len(c), 0, -1) if support[c[:i]] >= min_count), ())
        assigned.setdefault(node, []).append(c)
    for node in sorted(assigned, key=len, reverse=True):
        members = assigned[node]
        if node and sum(total[c] for c in members) < min_count:
            assigned.setdefault(node[:-1], []).extend(assigned.pop(node))
    labels = {}
    for node, members in assigned.items():
        label = OTHER if not node else node if members == [node] else (*node, REST)
        labels.update({c: label for c in members})
    return labels


def binned_table(
    a: Sequence[tuple[Any, ...]], b: Sequence[tuple[Any, ...]], min_count: int = MIN_COUNT
) -> tuple[np.ndarray, list[tuple[Any, ...]]]:
    """The 2 x K table of counts (row 0: a, row 1: b) with rare categories pooled by their common prefix
    (module docstring), and each bin's label. Bins ordered by total count, largest first."""
    ca, cb = Counter(a), Counter(b)
    label = _bin_labels(ca + cb, min_count)
    rows: dict[tuple[Any, ...], list[int]] = {}
    for counts, side in ((ca, 0), (cb, 1)):
        for c, n in counts.items():
            rows.setdefault(label[c], [0, 0])[side] += n
    order = sorted(rows, key=lambda lb: (-sum(rows[lb]), str(lb)))
    if OTHER in rows and sum(rows[OTHER]) < min_count and len(order) > 1:
        # the pooled rest, too small to stand alone: into the smallest other bin
        small = next(lb for lb in reversed(order) if lb != OTHER)
        rows[small] = [rows[small][0] + rows[OTHER][0], rows[small][1] + rows[OTHER][1]]
        del rows[OTHER]
        order.remove(OTHER)
    table = np.array([rows[lb] for lb in order], dtype=float).T.reshape(2, -1)
    return table, order


def chi2_homogeneity(table: np.ndarray) -> tuple[float, int, float]:
    """Pearson's chi-square for a 2 x K table: (statistic, df, p). One bin: nothing to compare, p = 1."""
    table = table[:, table.sum(axis=0) > 0]
    k = table.shape[1]
    if k < 2 or table.sum(axis=1).min() == 0:
        return 0.0, 0, 1.0
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    return stat, k - 1, chi2_sf(stat, k - 1)


def prompt_test(
    sd: Sequence[Sequence[int]],
    base: Sequence[Sequence[int]],
    positions: int,
    alpha_each: float,
    min_count: int = MIN_COUNT,
) -> dict[str, Any]:
    """One prompt's test: p, df, bins, the observed TV of the binned distributions and the detectable TV."""
    table, labels = binned_table(categories(sd, positions), categories(base, positions), min_count)
    stat, df, p = chi2_homogeneity(table)
    n_sd, n_base = len(sd), len(base)
    tv_obs = 0.0
    if n_sd and n_base and table.size:
        tv_obs = float(0.5 * np.abs(table[0] / n_sd - table[1] / n_base).sum())
    return {
        "p_value": p,
        "statistic": stat,
        "df": df,
        "bins": len(labels),
        "samples_sd": n_sd,
        "samples_base": n_base,
        "tv_observed": tv_obs,
        # one bin (every draw the same sequence, or all pooled): a difference can show nowhere
        "tv_detectable_80": tv_detectable(n_sd, n_base, df, alpha_each) if df > 0 else 1.0,
        "top": [[list(lb), int(table[0, i]), int(table[1, i])] for i, lb in enumerate(labels[:5])],
    }


def distribution_check(
    sd: Mapping[str, Sequence[Sequence[int]]],
    base: Mapping[str, Sequence[Sequence[int]]],
    positions: int = 3,
    *,
    alpha: float = ALPHA,
    min_count: int = MIN_COUNT,
    min_samples: int = MIN_SAMPLES,
    max_tv: float = MAX_TV,
) -> dict[str, Any]:
    """Compare outputs with SD (`sd`) and without (`base`), prompt id -> output token sequences; the prompts
    both have are tested. Returns {verdict, p_value, tv_detectable_80, samples, positions, prompts, method,
    alpha, per_prompt}: `samples` is the fewest draws per side of any prompt, `samples_total` all draws.
    See the module docstring for the test, the power figure and the verdict."""
    if positions < 1:
        raise ValueError(f"positions must be >= 1, got {positions}")
    ids = [pid for pid in sd if pid in base]
    if not ids:
        return {
            "verdict": "underpowered",
            "p_value": None,
            "tv_detectable_80": 1.0,
            "samples": 0,
            "samples_total": 0,
            "positions": positions,
            "prompts": 0,
            "method": METHOD,
            "alpha": alpha,
            "per_prompt": {},
        }
    alpha_each = alpha / len(ids)
    per = {pid: prompt_test(sd[pid], base[pid], positions, alpha_each, min_count) for pid in ids}
    p_min = min(r["p_value"] for r in per.values())
    pooled_p = min(1.0, len(ids) * p_min)
    fewest = min(min(r["samples_sd"], r["samples_base"]) for r in per.values())
    tv80 = max(r["tv_detectable_80"] for r in per.values())
    if pooled_p < alpha:
        verdict = "fail"
    elif fewest < min_samples or tv80 > max_tv:
        verdict = "underpowered"
    else:
        verdict = "pass"
    return {
        "verdict": verdict,
        "p_value": pooled_p,
        "tv_detectable_80": tv80,
        "samples": fewest,
        "samples_total": sum(r["samples_sd"] + r["samples_base"] for r in per.values()),
        "positions": positions,
        "prompts": len(ids),
        "method": METHOD,
        "alpha": alpha,
        "per_prompt": per,
    }
