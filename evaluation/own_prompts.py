"""Prompts of our own, none taken from Spec-Bench: EAGLE's training set (``scripts.train_eagle``)
and ``tree=auto``'s calibration (``evaluation.calibrate``).

Templates x topics, translations, code, and arithmetic word problems; a test checks that no
prompt is or contains a Spec-Bench question.
"""
from __future__ import annotations

import random

TOPICS = [
    "volcanoes", "the history of the bicycle", "honeybees", "solar panels", "the water cycle", "chess openings",
    "public libraries", "the human heart", "coral reefs", "electric cars", "sourdough bread", "the moon landing",
    "recycling plastic", "jazz music", "mountain hiking", "the printing press", "penguins", "cloud computing",
    "learning a second language", "urban gardening", "earthquakes", "the Roman aqueducts", "sleep and memory",
    "board games", "wind turbines", "the stock market", "photosynthesis", "marathon training", "lighthouses",
    "video game design", "tea ceremonies", "rainforests", "3D printing", "time management", "the Silk Road",
    "black holes", "vaccines", "minimalist living", "bridges", "origami",
]
TEMPLATES = [
    "Write a short blog post about {t}.", "Explain {t} to a ten-year-old.", "Give me five interesting facts about {t}.",
    "What are the advantages and disadvantages of {t}?", "Write a short poem about {t}.",
    "Describe a typical day of someone whose job involves {t}.", "Write a persuasive paragraph about why {t} matters.",
    "What are common misconceptions about {t}?", "Draft an email inviting a friend to a talk about {t}.",
    "Write a dialogue between two students discussing {t}.", "Summarize the key ideas someone should know about {t}.",
    "Create a quiz with three questions about {t}, with answers.",
]
TRANSLATE = ["Translate into French: 'The weather is lovely today, so we are going to the park.'",
             "Translate into German: 'I would like to book a table for two at seven o'clock.'",
             "Translate into Spanish: 'Reading every evening helps me relax after work.'",
             "Translate into English: 'Je voudrais apprendre à jouer du piano cet été.'",
             "Translate into English: 'Wir haben gestern einen langen Spaziergang am Fluss gemacht.'",
             "Translate into Italian: 'My brother is studying engineering at the university.'"]
CODE = ["Write a Python function that returns the n-th Fibonacci number.",
        "Write a Python function that checks whether a string is a palindrome.",
        "Write a JavaScript function that removes duplicates from an array.",
        "Explain what a hash table is and write a tiny example in Python.",
        "Write a SQL query that finds the ten most recent orders in a table called orders.",
        "Write a Python script that counts the words in a text file."]


def arithmetic(rng: random.Random, n: int) -> list[str]:
    items = ["apples", "pencils", "books", "marbles", "stickers", "coins"]
    out = []
    for _ in range(n):
        a, b, c = rng.randint(3, 60), rng.randint(2, 30), rng.randint(2, 9)
        thing = rng.choice(items)
        out.append(f"Sam has {a} {thing}. He buys {b} more and then gives away a {c}th of all of them, rounded "
                   f"down. How many {thing} does he have left? Explain step by step.")
    return out


def training_prompts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = [t.format(t=topic) for topic in TOPICS for t in TEMPLATES]
    return prompts + TRANSLATE + CODE + arithmetic(rng, 40)


def calibration_prompts(n: int = 12) -> list[str]:
    """``n`` prompts spread evenly over the whole set (every kind of prompt appears)."""
    prompts = training_prompts()
    return [prompts[i * len(prompts) // n] for i in range(n)]
