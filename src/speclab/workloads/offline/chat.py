"""offline-chat: ShareGPT stand-in. Varied open questions and short multi-turn conversations.

Single-turn requests (explain, compare, advise, write) over many everyday and technical topics, and
multi-turn snippets where the user follows up on an earlier assistant answer, so the prompt ends with a
user turn as in a real chat log. Generated from templates; no answers are known (reference is None).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from speclab.workloads.base import Prompt, WorkloadInfo, assistant, content_id, user
from speclab.workloads.offline._common import generated_build
from speclab.workloads.registry import register_workload

NAME = "offline-chat"

TOPICS = [
    "photosynthesis", "compound interest", "the French Revolution", "black holes", "machine learning",
    "climate change", "the immune system", "inflation", "electric cars", "the Roman Empire",
    "sleep", "recycling", "volcanoes", "the stock market", "vaccines", "the internet", "democracy",
    "coffee", "meditation", "solar panels", "DNA", "earthquakes", "public transport", "chess",
    "the moon landing", "bees", "renewable energy", "cryptocurrency", "jazz", "the water cycle",
    "time zones", "credit scores", "the printing press", "rainbows", "antibiotics", "remote work",
    "composting", "the Olympic Games", "plate tectonics", "password security",
]  # fmt: skip
SKILLS = [
    "cook rice", "learn a new language", "start running", "write a cover letter", "save money",
    "study for an exam", "grow tomatoes", "give a presentation", "take better photos", "learn to swim",
    "plan a small wedding", "fix a flat bike tire", "start a blog", "learn Python", "keep a houseplant alive",
    "negotiate a salary", "make friends in a new city", "organize a closet", "train a puppy", "read more books",
]  # fmt: skip
AUDIENCES = ["a ten-year-old", "a beginner", "my grandmother", "a high school student", "a busy manager"]
PAIRS = [
    ("tea", "coffee"), ("cats", "dogs"), ("renting", "buying a house"), ("trains", "planes"),
    ("Python", "JavaScript"), ("paper books", "e-readers"), ("city life", "country life"),
    ("running", "swimming"), ("SQL", "NoSQL databases"), ("public schools", "homeschooling"),
    ("solar power", "wind power"), ("Linux", "Windows"), ("summer", "winter"), ("email", "chat apps"),
]  # fmt: skip
THEMES = ["the sea", "autumn", "a lost key", "friendship", "a robot who learns to paint", "the city at night",
          "a dragon who is afraid of fire", "the first day of school", "a lighthouse keeper", "rain"]  # fmt: skip
FORMS = ["a short poem", "a short story", "a haiku", "a limerick", "a two-paragraph fable"]
PLACES = ["Japan", "Italy", "Iceland", "Peru", "Canada", "Morocco", "Norway", "Vietnam", "Portugal", "Kenya"]
MONTHS = ["January", "April", "July", "October", "December"]


def _single(r: random.Random) -> list[dict]:
    kind = r.randrange(8)
    t = r.choice(TOPICS)
    if kind == 0:
        return [user(f"Can you explain {t} to {r.choice(AUDIENCES)}?")]
    if kind == 1:
        a, b = r.choice(PAIRS)
        return [user(f"What are the pros and cons of {a} compared to {b}?")]
    if kind == 2:
        return [user(f"How do I {r.choice(SKILLS)}? Give me a few practical tips.")]
    if kind == 3:
        return [user(f"Write {r.choice(FORMS)} about {r.choice(THEMES)}.")]
    if kind == 4:
        return [user(f"What are {r.randint(3, 7)} common misconceptions about {t}?")]
    if kind == 5:
        return [user(f"I have to give a {r.choice([5, 10, 15])}-minute talk about {t}. Suggest an outline.")]
    if kind == 6:
        return [user(f"Why is {t} important? Answer in one paragraph.")]
    return [user(f"Write a short email to my team explaining why we should learn more about {t}.")]


def _multi(r: random.Random) -> list[dict]:
    kind = r.randrange(4)
    if kind == 0:
        place, month, days = r.choice(PLACES), r.choice(MONTHS), r.randint(4, 14)
        return [
            user(f"I'm planning a trip to {place}. What should I pack?"),
            assistant("That depends on the season and how long you will stay. When are you going, and for how long?"),
            user(f"In {month}, for {days} days. I also want to do some hiking."),
        ]  # fmt: skip
    if kind == 1:
        t = r.choice(TOPICS)
        return [
            user(f"What is {t}?"),
            assistant(f"{t[0].upper() + t[1:]} is a broad subject. Would you like a short overview or a detailed explanation?"),
            user(f"A short overview please, and then tell me one surprising fact about {t}."),
        ]  # fmt: skip
    if kind == 2:
        skill = r.choice(SKILLS)
        weeks = r.randint(2, 12)
        return [
            user(f"I want to {skill}. Where should I start?"),
            assistant("Good goal! How much time can you spend on it each week?"),
            user(f"About {r.randint(1, 6)} hours a week. Can you make me a {weeks}-week plan?"),
        ]  # fmt: skip
    a, b = r.choice(PAIRS)
    return [
        user(f"Which is better, {a} or {b}?"),
        assistant(f"Both {a} and {b} have advantages. What matters most to you?"),
        user("Mostly cost and convenience. Which would you pick for someone like me, and why?"),
    ]  # fmt: skip


def _generate(rng: random.Random, attempts: int) -> Iterator[Prompt]:
    for _ in range(attempts):
        multi = rng.random() < 0.3
        messages = _multi(rng) if multi else _single(rng)
        yield Prompt(
            id=content_id(NAME, messages),
            workload=NAME,
            category="chat",
            messages=messages,
            reference=None,
            meta={"stands_in_for": "sharegpt", "turns": len(messages)},
        )


register_workload(
    WorkloadInfo(
        name=NAME,
        category="chat",
        kind="offline",
        description="Stand-in for ShareGPT: open questions and requests, and multi-turn snippets (~30%) "
        "ending with a user turn.",
        notes="Generated from templates; default 500 prompts (a few thousand distinct are possible).",
    ),
    generated_build(NAME, _generate),
)
