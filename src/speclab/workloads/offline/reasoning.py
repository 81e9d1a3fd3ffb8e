"""offline-reasoning: AIME/GPQA stand-in. Competition-style problems that invite a long step-by-step answer.

Counting, number theory and probability problems generated with exact answers (computed by brute force or
closed form), in the AIME prompt format (reason step by step, answer in \\boxed{}); about a quarter are
posed as four-option multiple choice, in the GPQA format (reference = the correct letter).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterator
from fractions import Fraction

from speclab.workloads import formats
from speclab.workloads.base import Prompt, WorkloadInfo, content_id, user
from speclab.workloads.offline._common import generated_build
from speclab.workloads.registry import register_workload

NAME = "offline-reasoning"
WORDS = ["BANANA", "MISSISSIPPI", "COMMITTEE", "BALLOON", "PEPPER", "LETTER", "SUCCESS", "ADDRESS",
         "REFERENCE", "STATISTICS", "PARALLEL", "ASSESSES", "TENNESSEE", "BOOKKEEPER"]  # fmt: skip

Problem = tuple[str, int]


def _incl_excl(r: random.Random) -> Problem:
    n = r.randint(200, 3000)
    a, b, c = r.sample([2, 3, 4, 5, 6, 7, 9, 11, 13], 3)
    ans = sum(1 for x in range(1, n + 1) if (x % a == 0 or x % b == 0) and x % c)
    return f"How many integers from 1 to {n}, inclusive, are divisible by {a} or {b} but not by {c}?", ans


def _modpow(r: random.Random) -> Problem:
    a, b, m = r.randint(2, 97), r.randint(50, 5000), r.choice([7, 11, 13, 17, 19, 23, 100, 1000, 999])
    return f"Find the remainder when ${a}^{{{b}}}$ is divided by ${m}$.", pow(a, b, m)


def _lattice(r: random.Random) -> Problem:
    m, n = r.randint(4, 9), r.randint(4, 9)
    p, q = r.randint(1, m - 1), r.randint(1, n - 1)
    ans = math.comb(m + n, m) - math.comb(p + q, p) * math.comb(m - p + n - q, m - p)
    return (
        f"A path on the grid goes from $(0,0)$ to $({m},{n})$ using unit steps to the right or up. "
        f"How many such paths do not pass through the point $({p},{q})$?",
        ans,
    )


def _divisors(r: random.Random) -> Problem:
    n = r.randint(100, 5000)
    divs = [d for d in range(1, n + 1) if n % d == 0]
    if r.random() < 0.5:
        return f"Find the sum of all positive divisors of ${n}$.", sum(divs)
    n2 = n * n
    count = 1
    for e in Counter(_factor(n)).values():
        count *= 2 * e + 1
    return f"How many positive divisors does ${n}^2 = {n2}$ have?", count


def _factor(n: int) -> list[int]:
    out, d = [], 2
    while d * d <= n:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    if n > 1:
        out.append(n)
    return out


def _arrangements(r: random.Random) -> Problem:
    w = r.choice(WORDS)
    total = math.factorial(len(w))
    for c in Counter(w).values():
        total //= math.factorial(c)
    if r.random() < 0.5:
        return f"How many distinct arrangements of the letters of the word {w} are there?", total
    first = r.choice(sorted(set(w)))
    rest = Counter(w)
    rest[first] -= 1
    k = math.factorial(len(w) - 1)
    for c in rest.values():
        k //= math.factorial(c)
    return f"How many distinct arrangements of the letters of {w} begin with the letter {first}?", k


def _crt(r: random.Random) -> Problem:
    mods = r.sample([3, 4, 5, 7, 9, 11, 13], 3)
    while math.lcm(*mods) != mods[0] * mods[1] * mods[2]:
        mods = r.sample([3, 4, 5, 7, 9, 11, 13], 3)
    rems = [r.randrange(m) for m in mods]
    x = next(
        x for x in range(1, math.prod(mods) + 1) if all(x % m == a for m, a in zip(mods, rems, strict=True))
    )
    parts = ", ".join(f"remainder {a} when divided by {m}" for a, m in zip(rems, mods, strict=True))
    return f"Find the smallest positive integer that leaves {parts}.", x


def _dice(r: random.Random) -> Problem:
    k, d = r.choice([2, 3]), r.choice([3, 4, 5, 6])
    s = r.randint(5, 6 * k - 1)
    rolls = _rolls(k)
    good = 0
    while not good:  # lower the threshold until the event is possible
        good = sum(1 for t in rolls if sum(t) >= s and math.prod(t) % d == 0)
        s -= 0 if good else 1
    p = Fraction(good, len(rolls))
    return (
        f"{['Two', 'Three'][k - 2]} fair six-sided dice are rolled. The probability that the sum of the "
        f"numbers shown is at least {s} and their product is divisible by {d} is $\\frac{{m}}{{n}}$, where "
        f"$m$ and $n$ are relatively prime positive integers. Find $m+n$.",
        p.numerator + p.denominator,
    )


def _rolls(k: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for _ in range(k):
        out = [t + (v,) for t in out for v in range(1, 7)]
    return out


def _digit_sum(r: random.Random) -> Problem:
    n, s = r.choice([1000, 2000, 5000, 10000]), r.randint(5, 20)
    ans = sum(1 for x in range(1, n) if sum(map(int, str(x))) == s)
    return f"How many positive integers less than ${n}$ have digits that sum to ${s}$?", ans


def _sequence(r: random.Random) -> Problem:
    a, b, m, k = r.randint(2, 9), r.randint(1, 9), r.choice([97, 101, 1000, 211]), r.randint(20, 200)
    x = r.randint(1, 20)
    seq = [x]
    for _ in range(k - 1):
        seq.append((a * seq[-1] + b) % m)
    return (
        f"A sequence is defined by $a_1 = {x}$ and $a_{{n+1}}$ equal to the remainder when ${a}a_n + {b}$ is "
        f"divided by ${m}$. Find $a_{{{k}}}$.",
        seq[-1],
    )


TEMPLATES: list[Callable[[random.Random], Problem]] = [
    _incl_excl, _modpow, _lattice, _divisors, _arrangements, _crt, _dice, _digit_sum, _sequence,
]  # fmt: skip


def _choices(answer: int, r: random.Random) -> tuple[list[str], int]:
    wrong: set[int] = set()
    while len(wrong) < 3:
        cand = answer + r.choice([-1, 1]) * r.randint(1, max(3, abs(answer) // 5 + 1))
        if cand != answer and cand >= 0:
            wrong.add(cand)
    opts = [answer, *sorted(wrong)]
    r.shuffle(opts)
    return [str(o) for o in opts], opts.index(answer)


def _generate(rng: random.Random, attempts: int) -> Iterator[Prompt]:
    for i in range(attempts):
        tmpl = TEMPLATES[i % len(TEMPLATES)]  # round-robin; a duplicate moves on to the next template
        problem, answer = tmpl(rng)
        if rng.random() < 0.25:
            opts, idx = _choices(answer, rng)
            content, (b0, b1) = formats.multiple_choice(problem, opts)
            reference, style = "ABCD"[idx], "multiple-choice"
        else:
            content, (b0, b1) = formats.reasoning(problem)
            reference, style = str(answer), "boxed"
        messages = [user(content)]
        yield Prompt(
            id=content_id(NAME, messages),
            workload=NAME,
            category="reasoning",
            messages=messages,
            reference=reference,
            meta={
                "stands_in_for": "gpqa" if style == "multiple-choice" else "aime",
                "template": tmpl.__name__.lstrip("_"),
                "style": style,
                "answer": answer,
                "truncate": {"message": 0, "start": b0, "end": b1},
            },
        )


register_workload(
    WorkloadInfo(
        name=NAME,
        category="reasoning",
        kind="offline",
        description="Stand-in for AIME/GPQA: generated counting, number-theory and probability problems "
        "with exact answers; ~25% as four-option multiple choice.",
        notes="Default 500 prompts. Answers are checked by brute force, so outputs can be graded.",
    ),
    generated_build(NAME, _generate),
)
