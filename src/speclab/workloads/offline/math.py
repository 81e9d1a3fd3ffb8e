"""offline-math: GSM8K stand-in. Generated multi-step grade-school word problems with known integer answers.

The prompt uses the same instruction as the gsm8k study workload (step by step, final answer after "####").
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from speclab.workloads import formats
from speclab.workloads.base import Prompt, WorkloadInfo, content_id, user
from speclab.workloads.offline._common import generated_build
from speclab.workloads.registry import register_workload

NAME = "offline-math"

NAMES = [
    "Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Julia", "Kofi", "Lena",
    "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Yusuf",
]  # fmt: skip
ITEMS = [
    ("notebook", "notebooks"), ("pencil", "pencils"), ("apple", "apples"), ("muffin", "muffins"),
    ("ticket", "tickets"), ("candle", "candles"), ("sticker", "stickers"), ("plant", "plants"),
    ("book", "books"), ("shirt", "shirts"), ("cup of coffee", "cups of coffee"), ("toy car", "toy cars"),
]  # fmt: skip
THINGS = ["marbles", "stamps", "cookies", "seashells", "cards", "beads", "coins", "balloons"]

Problem = tuple[str, int]


def _shopping(r: random.Random) -> Problem:
    n = r.choice(NAMES)
    (_, i1), (_, i2) = r.sample(ITEMS, 2)
    a, b = r.randint(2, 9), r.randint(2, 9)
    p, q = r.randint(2, 15), r.randint(1, 12)
    total = a * p + b * q
    bill = next(x for x in (20, 50, 100, 200, 500) if x > total)
    return (
        f"{n} buys {a} {i1} at ${p} each and {b} {i2} at ${q} each. {n} pays with a ${bill} bill. "
        f"How much change, in dollars, does {n} get back?",
        bill - total,
    )


def _reading(r: random.Random) -> Problem:
    n = r.choice(NAMES)
    r1, d1, r2, d2 = r.randint(5, 30), r.randint(2, 7), r.randint(5, 40), r.randint(2, 7)
    read = r1 * d1 + r2 * d2
    total = read + r.randint(10, 200)
    return (
        f"A book has {total} pages. {n} reads {r1} pages a day for {d1} days, then {r2} pages a day for "
        f"{d2} more days. How many pages does {n} still have to read?",
        total - read,
    )


def _ages(r: random.Random) -> Problem:
    a, b = r.sample(NAMES, 2)
    kid, k, y = r.randint(3, 15), r.randint(2, 4), r.randint(2, 12)
    return (
        f"{a} is {k} times as old as {b}. In {y} years, {a} will be {k * kid + y} years old. "
        f"How old will {b} be in {y} years?",
        kid + y,
    )


def _discount(r: random.Random) -> Problem:
    item, _ = r.choice(ITEMS)
    pct = r.choice([10, 20, 25, 30, 40, 50])
    unit = r.randint(2, 40) * (100 // _gcd(100, pct))
    count, ship = r.randint(2, 6), r.randint(3, 15)
    total = count * unit * (100 - pct) // 100 + ship
    return (
        f"In a shop, one {item} costs ${unit}. This week everything is {pct}% off. Mia buys {count} "
        f"of them and pays ${ship} for delivery. How much does she pay in total, in dollars?",
        total,
    )


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def _sharing(r: random.Random) -> Problem:
    n = r.choice(NAMES)
    thing = r.choice(THINGS)
    k, each, more = r.randint(2, 6), r.randint(2, 9), r.randint(3, 25)
    start = k * each + r.randint(5, 60)
    return (
        f"{n} has {start} {thing}. {n} gives {each} {thing} to each of {k} friends, then buys {more} more. "
        f"How many {thing} does {n} have now?",
        start - k * each + more,
    )


def _travel(r: random.Random) -> Problem:
    v1, h1, v2, h2 = r.randint(30, 90), r.randint(1, 5), r.randint(20, 80), r.randint(1, 4)
    back = r.randint(10, v1 * h1 + v2 * h2 - 1)
    return (
        f"A train travels at {v1} km per hour for {h1} hours, then at {v2} km per hour for {h2} hours. "
        f"It then goes back {back} km towards the start. How far, in km, is it from where it started?",
        v1 * h1 + v2 * h2 - back,
    )


def _farm(r: random.Random) -> Problem:
    c, g, d = r.randint(3, 40), r.randint(2, 20), r.randint(1, 15)
    return (
        f"A farm has {c} chickens, {g} cows and {d} ducks. Each cow has 4 legs and each bird has 2 legs. "
        f"The farmer sells half of the cows, rounded down. How many legs do the farm animals have now?",
        2 * c + 4 * (g - g // 2) + 2 * d,
    )


def _savings(r: random.Random) -> Problem:
    n = r.choice(NAMES)
    wage, hours, frac = r.randint(8, 25), r.randint(5, 20), r.choice([2, 4, 5])
    weekly = wage * hours
    while weekly % frac:
        hours += 1
        weekly = wage * hours
    saved = weekly // frac
    weeks = r.randint(3, 12)
    part = {2: "half", 4: "a quarter", 5: "a fifth"}[frac]
    return (
        f"{n} earns ${wage} an hour and works {hours} hours a week. {n} saves {part} of the weekly pay. "
        f"How many dollars has {n} saved after {weeks} weeks?",
        saved * weeks,
    )


def _recipe(r: random.Random) -> Problem:
    per, batch, times = r.randint(2, 6), r.choice([12, 16, 20, 24]), r.randint(2, 9)
    extra = r.randint(1, 10)
    return (
        f"A recipe needs {per} cups of flour for {batch} cookies. Leo wants to bake {batch * times} cookies "
        f"and already has {extra} cups of flour. How many more cups of flour does he need?",
        max(per * times - extra, 0),
    )


def _school(r: random.Random) -> Problem:
    k = r.randint(2, 8)
    club = r.choice(
        ["plays in the band", "sings in the choir", "is in the chess club", "is on the robotics team"]
    )
    other = r.choice(["play a sport", "take an art class", "do drama", "volunteer at the library"])
    group = k * r.randint(3, 30)
    while (group - group // k) % 2:
        group += k
    rest = group - group // k
    return (
        f"A school trip has {group} students. One out of every {k} students {club}, and half of the other "
        f"students {other}. How many students do neither?",
        rest // 2,
    )


TEMPLATES: list[Callable[[random.Random], Problem]] = [
    _shopping, _reading, _ages, _discount, _sharing, _travel, _farm, _savings, _recipe, _school,
]  # fmt: skip


def _generate(rng: random.Random, attempts: int) -> Iterator[Prompt]:
    for i in range(attempts):
        # round-robin keeps the mix even at any limit; a duplicate moves on to the next template
        tmpl = TEMPLATES[i % len(TEMPLATES)]
        question, answer = tmpl(rng)
        content, _ = formats.math(question)
        messages = [user(content)]
        yield Prompt(
            id=content_id(NAME, messages),
            workload=NAME,
            category="math",
            messages=messages,
            reference=str(answer),
            meta={"stands_in_for": "gsm8k", "template": tmpl.__name__.lstrip("_"), "answer": answer},
        )


register_workload(
    WorkloadInfo(
        name=NAME,
        category="math",
        kind="offline",
        description="Stand-in for GSM8K: generated multi-step word problems with known integer answers.",
        notes="10 templates with random names and numbers; default 500 prompts, any number via --limit.",
    ),
    generated_build(NAME, _generate),
)
