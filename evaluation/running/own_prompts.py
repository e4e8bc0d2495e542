"""Prompts of our own, none taken from Spec-Bench: EAGLE's training set (``scripts.train_eagle``)
and ``tree=auto``'s calibration (``methods.calibrate``).

Templates x topics, translations, code, and arithmetic word problems (``instruction_prompts``), and for
EAGLE's training also the other kinds of request Spec-Bench measures, written here from our own word lists:
German sentences to translate, short factual questions, and multi-step word problems
(``task_prompts``). Summaries and questions over long passages are built by ``scripts.train_eagle`` from
the target's own texts. A test checks that no prompt is or contains a Spec-Bench question.
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


# German sentences from our own word lists, tokenised the way WMT test sets are (spaces before punctuation).
DE_SUBJECTS = ["Der Bürgermeister", "Die Regierung", "Meine Schwester", "Das Unternehmen", "Die Polizei",
               "Der Trainer", "Ein Sprecher des Ministeriums", "Die Lehrerin", "Der Verein", "Die Stadt",
               "Der Minister", "Die Bank", "Unser Nachbar", "Die Schule", "Der Konzern", "Die Ärztin"]
DE_ACTIONS = [("einen neuen Plan", "vorgestellt"), ("die Entscheidung", "kritisiert"), ("das Projekt", "gestoppt"),
              ("mehr Geld für Schulen", "gefordert"), ("einen langen Bericht", "veröffentlicht"),
              ("die Preise", "erhöht"), ("ein neues Gebäude", "eröffnet"), ("den Vertrag", "unterschrieben"),
              ("die Ergebnisse", "bekannt gegeben"), ("viele Fragen", "beantwortet"), ("das Gesetz", "abgelehnt"),
              ("eine Lösung", "gefunden"), ("die Zahl der Mitarbeiter", "verdoppelt"), ("ein Konzert", "organisiert")]
DE_TIMES = ["am Montag", "gestern", "im vergangenen Jahr", "vor zwei Wochen", "am Ende des Sommers",
            "nach langen Verhandlungen", "überraschend", "in Berlin"]
DE_REASONS = ["", "", " , weil die Kosten stark gestiegen sind", " , obwohl viele Bürger dagegen protestiert haben",
              " , da die Nachfrage seit Monaten wächst", " , nachdem es heftige Kritik gegeben hatte",
              " , um die Lage in der Region zu verbessern", " , wie eine Zeitung berichtete"]

QA_PLACES = ["the eiffel tower", "the great wall of china", "the statue of liberty", "the golden gate bridge",
             "the sydney opera house", "the leaning tower of pisa", "mount rushmore", "the panama canal",
             "the hoover dam", "big ben", "the colosseum", "machu picchu", "the taj mahal", "stonehenge",
             "the empire state building"]
QA_PLACE_ASKS = ["when was {x} built?", "where is {x} located?", "who designed {x}?", "why was {x} built?"]
QA_THINGS = ["telephone", "light bulb", "printing press", "steam engine", "television", "airplane", "radio",
             "bicycle", "camera", "computer mouse", "microwave oven", "refrigerator", "typewriter", "vaccine",
             "electric guitar"]
QA_THING_ASKS = ["who invented the {x}?", "when was the {x} invented?"]
QA_COUNTRIES = ["brazil", "canada", "japan", "kenya", "norway", "peru", "egypt", "australia", "india", "mexico",
                "portugal", "vietnam", "chile", "morocco", "iceland"]
QA_COUNTRY_ASKS = ["what is the capital of {x}?", "what language do they speak in {x}?"]

NAMES = ["Maria", "Tom", "Aisha", "Carlos", "Mei", "John", "Priya", "Lena"]
WORD_PROBLEMS = [
    "{n} buys {a} notebooks at ${b} each and a backpack for ${c}. How much does {n} spend in total?",
    "A train travels at {a} miles per hour for {c} hours and then at {b} miles per hour for 2 hours. "
    "How far does it travel in total?",
    "{n} earns ${b} per hour and works {a} hours a week. How much does {n} earn in {c} weeks?",
    "A bakery makes {a} loaves of bread a day and sells them for ${c} each. If {b} loaves are left over every "
    "day, how much money does the bakery make in a week?",
    "{n} has ${a}0. {n} spends half of it on a coat and ${b} on shoes. How much money is left?",
    "A garden has {a} rows of tomato plants with {b} plants in each row. Each plant gives {c} tomatoes. "
    "How many tomatoes does the garden give?",
    "{n} reads {b} pages on Monday and twice as many on Tuesday. The book has {a}0 pages. "
    "How many pages are left to read?",
    "A school has {a} classes with {b} students each. If {c} students are absent, how many students are present?",
]


def german_sentences(rng: random.Random, n: int, subjects=DE_SUBJECTS, actions=DE_ACTIONS, times=DE_TIMES,
                     reasons=DE_REASONS) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        obj, verb = rng.choice(actions)
        out.add(f"{rng.choice(subjects)} hat {rng.choice(times)} {obj} {verb}{rng.choice(reasons)} .")
    return sorted(out)


def factual_questions() -> list[str]:
    return ([a.format(x=x) for x in QA_PLACES for a in QA_PLACE_ASKS]
            + [a.format(x=x) for x in QA_THINGS for a in QA_THING_ASKS]
            + [a.format(x=x) for x in QA_COUNTRIES for a in QA_COUNTRY_ASKS])


def word_problems(rng: random.Random, n: int, templates=WORD_PROBLEMS) -> list[str]:
    return [rng.choice(templates).format(n=rng.choice(NAMES), a=rng.randint(3, 40), b=rng.randint(2, 15),
                                             c=rng.randint(2, 9)) for _ in range(n)]


def instruction_prompts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    prompts = [t.format(t=topic) for topic in TOPICS for t in TEMPLATES]
    return prompts + TRANSLATE + CODE + arithmetic(rng, 40)


def task_prompts(seed: int = 0) -> list[str]:
    """Requests of the kinds Spec-Bench measures beyond instructions, none of them its questions."""
    rng = random.Random(seed + 1)
    return ([f"Translate German to English: {s}" for s in german_sentences(rng, 150)]
            + [q[0].upper() + q[1:] for q in factual_questions()] + word_problems(rng, 60))


def training_prompts(seed: int = 0) -> list[str]:
    """EAGLE's training prompts: instructions, then the task-like requests."""
    return instruction_prompts(seed) + task_prompts(seed)


def calibration_prompts(n: int = 12) -> list[str]:
    """``n`` instruction prompts spread evenly over that set (every kind appears); the set is kept as it
    was when tree=auto's cached calibrations were made."""
    prompts = instruction_prompts()
    return [prompts[i * len(prompts) // n] for i in range(n)]


# EAGLE's second, larger training set (more_prompts): new topics, requests shaped like MT-Bench's kinds
# (writing, roleplay, reasoning, extraction, STEM, humanities, coding), and more of the task-like requests.
# Topics of EAGLE's training only: tree=auto's calibration (calibration_prompts) never sees them.
TRAINING_ONLY_TOPICS = [
    "glaciers", "the invention of paper", "ant colonies", "nuclear fusion", "the immune system", "bird migration",
    "the Olympic Games", "coffee farming", "renewable energy subsidies", "ancient Egyptian pyramids", "submarines",
    "the theory of evolution", "remote work", "street food", "the Renaissance", "deep sea creatures", "inflation",
    "social media and teenagers", "the metric system", "desert ecosystems", "quantum computers", "fermentation",
    "the French Revolution", "smartphone batteries", "wildfires", "the Great Barrier Reef", "public transport",
    "online privacy", "classical ballet", "the periodic table", "tides", "the history of money", "robot vacuum cleaners",
    "bees and pollination", "the Amazon river", "climate change adaptation", "museums", "self-driving trucks",
    "the Viking age", "meditation", "GPS satellites", "volunteering", "the human genome", "container shipping",
    "paper airplanes", "the Industrial Revolution", "antibiotic resistance", "space telescopes", "composting",
    "the Cold War", "microplastics", "language evolution", "hot air balloons", "the blockchain", "wolves",
    "solar eclipses", "city planning", "the history of chocolate", "kindness at work", "ocean currents",
]
# Requests shaped like MT-Bench's writing, roleplay, STEM and humanities questions, about one topic each.
MT_BENCH_LIKE_TEMPLATES = [
    "Write a short story in which {t} plays an important role.", "Write a news article about a new discovery about {t}.",
    "Pretend you are a museum guide. Explain {t} to a group of visitors.",
    "Act as a university professor and give a short lecture on {t}.",
    "You are a travel blogger. Write a post that mentions {t}.", "Give a step-by-step explanation of {t}.",
    "Compare {t} today with {t} fifty years ago.", "What questions would a scientist ask about {t}, and why?",
    "Write a speech for a school assembly about {t}.", "Explain the economic impact of {t}.",
    "List the pros and cons of {t} in a table.", "Write a product description for a book about {t}.",
]
ROLES = ["a pirate captain", "a detective", "a chef", "an astronaut", "a medieval knight", "a tour guide", "a poet",
         "a sports coach", "a doctor", "a librarian", "a startup founder", "a farmer"]
ROLE_ASKS = ["What does a good day look like for you?", "What advice would you give to a young person?",
             "Describe the biggest challenge you have faced.", "What tools do you use every day, and why?"]
CODE_2 = [
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python class for a simple bank account with deposit and withdraw methods.",
    "Write a function in C that reverses a string in place.", "Implement binary search in Python and explain it.",
    "Write a Python function that counts the vowels in a string.", "Write a Python generator that yields prime numbers.",
    "Write a JavaScript function that debounces another function.", "Explain recursion with a Python example.",
    "Write a Python function that flattens a nested list.", "Write a bash script that backs up a folder to a zip file.",
    "Write a Python function that finds the longest word in a sentence.", "Explain big-O notation with examples.",
]

DE_SUBJECTS_2 = ["Die Feuerwehr", "Der Präsident", "Die Gewerkschaft", "Ein Gericht", "Die Universität",
                 "Der Flughafen", "Die Opposition", "Ein Augenzeuge", "Die Behörden", "Der Autohersteller",
                 "Die Bundesregierung", "Der Bürgermeister der Stadt", "Die Mannschaft", "Eine Studie"]
DE_ACTIONS_2 = [("neue Regeln", "eingeführt"), ("einen Streik", "angekündigt"), ("die Wahl", "gewonnen"),
                ("das Spiel", "verloren"), ("Tausende Menschen", "evakuiert"), ("den Haushalt", "verabschiedet"),
                ("eine Untersuchung", "eingeleitet"), ("die Grenze", "geschlossen"), ("den Rekord", "gebrochen"),
                ("die Verhandlungen", "abgebrochen"), ("neue Arbeitsplätze", "geschaffen"),
                ("ein Verbot", "verhängt"), ("die Pläne", "verteidigt"), ("eine Warnung", "herausgegeben")]
DE_TIMES_2 = ["am Wochenende", "in der Nacht zum Freitag", "seit Jahren", "zum ersten Mal", "im Januar",
              "trotz großer Bedenken", "in einer Erklärung", "nach Angaben der Polizei"]
DE_REASONS_2 = ["", " , sagte ein Sprecher", " , um Geld zu sparen", " , obwohl die Umfragen anders aussahen",
                " , weil das Wetter schlecht war", " , nachdem mehrere Menschen verletzt worden waren"]
QA_PEOPLE = ["albert einstein", "marie curie", "william shakespeare", "leonardo da vinci", "nelson mandela",
             "isaac newton", "charles darwin", "jane austen", "ludwig van beethoven", "frida kahlo", "galileo galilei",
             "ada lovelace", "mahatma gandhi", "pablo picasso", "nikola tesla"]
QA_PERSON_ASKS = ["when was {x} born?", "what is {x} famous for?", "where did {x} live?"]
QA_SCIENCE = ["photosynthesis", "gravity", "an atom", "dna", "a black hole", "the ozone layer", "an earthquake",
              "a rainbow", "the greenhouse effect", "electricity", "a virus", "a tsunami"]
QA_SCIENCE_ASKS = ["what is {x}?", "how is {x} formed?"]
WORD_PROBLEMS_2 = [
    "{n} runs {b} kilometers every weekday and {c} kilometers on Saturday. How many kilometers does {n} run in {a} weeks?",
    "A shop sells pens in packs of {c}. {n} needs {a}0 pens for a class. How many packs must {n} buy?",
    "A car uses {c} liters of fuel per 100 kilometers. How much fuel does it need for a trip of {a}0 kilometers?",
    "{n} saves ${b} every week. A bike costs ${a}0. How many weeks does {n} need to save to buy the bike?",
    "There are {a} red balls and {b} blue balls in a box. {n} takes out {c} red balls. What fraction of the balls "
    "left are red?",
    "A recipe needs {c} eggs for {b} cookies. How many eggs are needed for {a}0 cookies?",
    "{n} is {b} years old. {n}'s mother is {c} times as old. How old will the mother be in {a} years?",
    "A farmer has {a} cows. Each cow gives {c} liters of milk a day and milk sells for ${b} per liter. "
    "How much does the farmer earn in a week?",
]


def more_prompts(seed: int = 0) -> list[str]:
    """The second training set: MT-Bench-like kinds over new topics, and more task-like requests."""
    rng = random.Random(seed + 2)
    first = set(training_prompts(seed))
    german = [f"Translate German to English: {s}" for s in german_sentences(
        rng, 400, DE_SUBJECTS + DE_SUBJECTS_2, DE_ACTIONS + DE_ACTIONS_2, DE_TIMES + DE_TIMES_2, DE_REASONS_2)]
    qa = ([a.format(x=x) for x in QA_PEOPLE for a in QA_PERSON_ASKS]
          + [a.format(x=x) for x in QA_SCIENCE for a in QA_SCIENCE_ASKS])
    prompts = ([t.format(t=topic) for topic in TRAINING_ONLY_TOPICS for t in MT_BENCH_LIKE_TEMPLATES]
               + [f"Imagine you are {r}. {a}" for r in ROLES for a in ROLE_ASKS] + CODE_2 + german
               + [q[0].upper() + q[1:] for q in qa]
               + word_problems(rng, 150, WORD_PROBLEMS_2))
    return [p for p in dict.fromkeys(prompts) if p not in first]
