"""Generate the offline prompt sets in data/prompts: ``python scripts/make_prompts.py`` rewrites
``data/prompts/{train,heldout,hard}.jsonl`` (read back by ``draft_service.prompts.load_prompts``).

The generators below combine the hand-written templates and word lists of ``data/prompts/sources/*.json`` (one
file per category, plus ``shared.json`` and ``passages.json``) through ``random.Random``. The output is
deterministic for a seed, and the committed files are the output for seed 0.

Splits
    train    ~7,000 in-domain prompts over 19 categories (chat, science, code, math, stories, ...).
    heldout  ~400 in-domain prompts, same categories, built only from held-out (template, topic) pairs: every
             generator returns a split key naming the template and the main topic it combined, and a stable hash
             of ``category|key`` reserves about 12% of the keys for heldout. No prompt string is shared.
    hard     ~200 prompts from domains the drafter is not trained on (King James Bible passages, legal/licence
             boilerplate, SQL, shell, regular expressions, French/Spanish/German/Italian/Portuguese requests,
             CSV/JSON conversion), used as the "hard content" mix in benchmarks.

This script imports only the standard library.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path
from typing import Callable

SPLITS = ("train", "heldout", "hard")
SIZES = {"train": 7000, "heldout": 400, "hard": 200}
HELDOUT_FRACTION = 0.12    # share of (template, topic) split keys reserved for the heldout split
SYSTEM_FRACTION = 0.10     # share of records that carry an explicit system message

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "prompts"
SOURCES_DIR = DATA_DIR / "sources"


def _source(name: str) -> dict:
    """The word lists and templates of ``data/prompts/sources/{name}.json``."""
    return json.loads((SOURCES_DIR / f"{name}.json").read_text(encoding="utf-8"))


def _stable_int(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _low(s: str) -> str:
    """Lower-case the first letter unless it starts with 'I', an acronym or a proper noun marker."""
    if s.startswith(("I ", "I'", "AI", "OK")) or (len(s) > 1 and s[1].isupper()):
        return s
    return s[:1].lower() + s[1:]


def _strip_end(s: str) -> str:
    return s.rstrip(" .!?")


def _an(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" and not word.lower().startswith(("uni", "use", "eu", "one"))
            else "a ") + word


def _third_to_base(desc: str) -> str:
    """'returns the sum ...' -> 'return the sum ...' (first verb only)."""
    first, _, rest = desc.partition(" ")
    irregular = {"does": "do", "has": "have", "is": "be", "goes": "go"}
    if first in irregular:
        base = irregular[first]
    elif first.endswith("ies"):
        base = first[:-3] + "y"
    elif first.endswith(("ches", "shes", "sses", "xes", "zzes")):
        base = first[:-2]
    elif first.endswith("s"):
        base = first[:-1]
    else:
        base = first
    return base + (" " + rest if rest else "")


def _pick_n(r: random.Random, seq, k: int) -> list:
    return r.sample(list(seq), k)


def _casual(r: random.Random, text: str, context: str = "") -> str:
    """Light, realistic surface variation for plain-text prompts (never used on prompts with code or passages).

    ``context="open"`` may also put a context sentence in front of the prompt; ``context="full"`` may instead add
    a request after it (for explanatory prompts, where every closer makes sense).
    """
    if context:
        y = r.random()
        if y < 0.10:
            text = r.choice(_CONTEXT_OPENERS) + " " + text
        elif y < 0.18 and context == "full":
            text = text + " " + r.choice(_CONTEXT_CLOSERS)
    x = r.random()
    if x < 0.06 and len(text) < 220 and "\n" not in text:
        text = _strip_end(text.lower()) + ("?" if text.rstrip().endswith("?") and r.random() < 0.5 else "")
    elif x < 0.11:
        text = text + r.choice([" Thanks!", " Thank you.", " Thanks in advance!", " Thanks a lot.", " Cheers!"])
    elif x < 0.15:
        prefix = r.choice(["Hi! ", "Hello, ", "Hey there. ", "Hi there, ", "Good morning! "])
        text = prefix + (_low(text) if prefix.endswith(", ") else text)
    elif x < 0.17:
        text = text + r.choice([" Please be brief.", " Keep it short, please.", " Go into detail, please.",
                                " Explain your reasoning.", " Use simple language."])
    return text


def _fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code.strip()}\n```"


# ----------------------------------------------------------------------------------------------------------------
# Shared word lists
# ----------------------------------------------------------------------------------------------------------------

_shared = _source("shared")
_CONTEXT_OPENERS = _shared["context_openers"]
_CONTEXT_CLOSERS = _shared["context_closers"]
NAMES = _shared["names"]
PERSONAS = _shared["personas"]
SYSTEM_GENERIC = _shared["system_generic"]
_SYS_CODE = _shared["sys_code"]
_SYS_TUTOR = _shared["sys_tutor"]
_SYS_WRITING = _shared["sys_writing"]
_SYS_WORK = _shared["sys_work"]
_SYS_KNOWLEDGE = _shared["sys_knowledge"]
_SYS_LIFE = _shared["sys_life"]

SYSTEM_SPECIFIC = {
    "chat_advice": _SYS_LIFE, "howto": _SYS_LIFE, "brainstorm": _SYS_LIFE + _SYS_WRITING[:1],
    "compare": _SYS_LIFE[:1] + _SYS_KNOWLEDGE, "science": _SYS_TUTOR + _SYS_KNOWLEDGE[3:],
    "humanities": _SYS_KNOWLEDGE, "trivia": _SYS_KNOWLEDGE + _SYS_TUTOR[2:], "define": _SYS_TUTOR + _SYS_WORK[1:2],
    "code_write": _SYS_CODE, "code_explain": _SYS_CODE + _SYS_TUTOR[1:2], "math": [
        "You are a math tutor. Show your reasoning before giving the final answer."] + _SYS_TUTOR,
    "story": _SYS_WRITING, "poem": _SYS_WRITING, "email": _SYS_WORK, "rewrite": _SYS_WORK[:2] + _SYS_WRITING[2:],
    "summarize": _SYS_WORK[:2], "extract": _SYS_WORK, "followup": _SYS_TUTOR[:1], "roleplay": _SYS_WRITING[:1],
}

AUDIENCES = _shared["audiences"]
KIDS = _shared["kids"]
MONTHS = _shared["months"]
WEEKDAYS = _shared["weekdays"]
CITIES = _shared["cities"]
ANIMALS = _shared["animals"]

# ----------------------------------------------------------------------------------------------------------------
# chat_advice: everyday chat, advice and small talk
# ----------------------------------------------------------------------------------------------------------------

_chat_advice = _source("chat_advice")
SITUATIONS = _chat_advice["situations"]
CHAT_TEMPLATES = _chat_advice["chat_templates"]
JOKE_TOPICS = _chat_advice["joke_topics"]
DEBATES = _chat_advice["debates"]
BOOKS = _chat_advice["books"]
INGREDIENTS = _chat_advice["ingredients"]
SMALL_TALK = _chat_advice["small_talk"]
PETS = _chat_advice["pets"]
PET_DESCS = _chat_advice["pet_descs"]
COMPANY = _chat_advice["company"]


def gen_chat_advice(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.68:
        ti = r.randrange(len(CHAT_TEMPLATES))
        s = r.choice(SITUATIONS)
        text = CHAT_TEMPLATES[ti].format(S=s, s=_low(s), P=r.choice(PERSONAS))
        return f"t{ti}|{s}", _casual(r, text)
    ti = r.randrange(len(SMALL_TALK))
    kind, tmpl = SMALL_TALK[ti]
    fills = dict(joke=r.choice(JOKE_TOPICS), animal=r.choice(ANIMALS), book=r.choice(BOOKS),
                 debate=r.choice(DEBATES), day=r.choice(WEEKDAYS), pet=r.choice(PETS), petdesc=r.choice(PET_DESCS),
                 city=r.choice(CITIES), company=r.choice(COMPANY))
    i1, i2, i3 = _pick_n(r, INGREDIENTS, 3)
    text = tmpl.format(i1=i1, i2=i2, i3=i3, **fills)
    topic = {"joke": fills["joke"], "fact": fills["animal"], "book": fills["book"], "cook": i1,
             "debate": fills["debate"], "pet": fills["pet"], "travel": fills["city"],
             "movie": fills["company"]}.get(kind, tmpl)
    return f"s{ti}|{topic}", _casual(r, text)

# ----------------------------------------------------------------------------------------------------------------
# science: explanations of scientific topics and everyday "why" questions
# ----------------------------------------------------------------------------------------------------------------

_science = _source("science")
SCIENCE_TOPICS = _science["science_topics"]
WHY_QUESTIONS = _science["why_questions"]
SCIENCE_TEMPLATES = _science["science_templates"]
WHY_TEMPLATES = _science["why_templates"]


def gen_science(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.25:
        ti = r.randrange(len(WHY_TEMPLATES))
        q = r.choice(WHY_QUESTIONS)
        text = WHY_TEMPLATES[ti].format(q=q, lq=_low(q), kid=r.choice(KIDS))
        return f"w{ti}|{q}", _casual(r, text, context="full")
    ti = r.randrange(len(SCIENCE_TEMPLATES))
    t, subj = r.choice(SCIENCE_TOPICS)
    same = [x for x, s in SCIENCE_TOPICS if s == subj and x != t] or [x for x, _ in SCIENCE_TOPICS if x != t]
    text = SCIENCE_TEMPLATES[ti].format(t=t, T=_cap(t), t2=r.choice(same), subj=subj, asubj=_an(subj), aud=r.choice(AUDIENCES),
                                        kid=r.choice(KIDS), P=r.choice(PERSONAS))
    return f"t{ti}|{t}", _casual(r, text, context="full")

# ----------------------------------------------------------------------------------------------------------------
# humanities: history, geography and culture
# ----------------------------------------------------------------------------------------------------------------

_humanities = _source("humanities")
HIST_EVENTS = _humanities["hist_events"]
HIST_FIGURES = _humanities["hist_figures"]
PLACES = _humanities["places"]
LANDMARKS = _humanities["landmarks"]
CULTURE_ITEMS = _humanities["culture_items"]
EVENT_TEMPLATES = _humanities["event_templates"]
FIGURE_TEMPLATES = _humanities["figure_templates"]
PLACE_TEMPLATES = _humanities["place_templates"]
LANDMARK_TEMPLATES = _humanities["landmark_templates"]
CULTURE_TEMPLATES = _humanities["culture_templates"]

# "places" lists countries, then regions from "the Amazon rainforest" on; regions skip the place templates
# that only make sense for a country.
_REGIONS = set(PLACES[PLACES.index("the Amazon rainforest"):])
_COUNTRY_ONLY_TEMPLATES = {4, 8, 11}   # languages, economy, role in world history


def gen_humanities(r: random.Random) -> tuple[str, str]:
    kind = r.choices(["event", "figure", "place", "landmark", "culture"], weights=[30, 25, 22, 8, 15])[0]
    if kind == "event":
        ti, e = r.randrange(len(EVENT_TEMPLATES)), r.choice(HIST_EVENTS)
        return f"e{ti}|{e}", _casual(r, EVENT_TEMPLATES[ti].format(e=e), context="full")
    if kind == "figure":
        ti, f = r.randrange(len(FIGURE_TEMPLATES)), r.choice(HIST_FIGURES)
        return f"f{ti}|{f}", _casual(r, FIGURE_TEMPLATES[ti].format(f=f, kid=r.choice(KIDS)), context="full")
    if kind == "place":
        ti, p = r.randrange(len(PLACE_TEMPLATES)), r.choice(PLACES)
        if p in _REGIONS and ti in _COUNTRY_ONLY_TEMPLATES:
            ti = 0
        return f"p{ti}|{p}", _casual(r, PLACE_TEMPLATES[ti].format(p=p, m=r.choice(MONTHS)), context="full")
    if kind == "landmark":
        ti, lm = r.randrange(len(LANDMARK_TEMPLATES)), r.choice(LANDMARKS)
        return f"l{ti}|{lm}", _casual(r, LANDMARK_TEMPLATES[ti].format(l=lm), context="full")
    c, ck = r.choice(CULTURE_ITEMS)
    tmpls = CULTURE_TEMPLATES[ck]
    ti = r.randrange(len(tmpls))
    text = tmpls[ti].format(c=c)
    return f"c{ck}{ti}|{c}", _casual(r, _cap(text), context="full")

# ----------------------------------------------------------------------------------------------------------------
# code_write: writing functions, classes and small scripts (mostly Python, some JavaScript)
# ----------------------------------------------------------------------------------------------------------------

_code_write = _source("code_write")
FUNC_TASKS = _code_write["func_tasks"]
CLASS_TASKS = _code_write["class_tasks"]
SCRIPT_TASKS = _code_write["script_tasks"]
FUNC_TEMPLATES = _code_write["func_templates"]
FUNC_SUFFIXES = _code_write["func_suffixes"]
FUNC_ADJS = _code_write["func_adjs"]
CLASS_TEMPLATES = _code_write["class_templates"]
SCRIPT_TEMPLATES = _code_write["script_templates"]


def _snake_to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def gen_code_write(r: random.Random) -> tuple[str, str]:
    x = r.random()
    if x < 0.68:
        ti = r.randrange(len(FUNC_TEMPLATES))
        name, args, desc = r.choice(FUNC_TASKS)
        text = FUNC_TEMPLATES[ti].format(name=name, args=args, desc=desc, base=_third_to_base(desc),
                                         adj=r.choice(FUNC_ADJS), camel=_snake_to_camel(name))
        if "JavaScript" not in text and not text.startswith("python function"):
            text += r.choice(FUNC_SUFFIXES)
        return f"f{ti}|{name}", text
    if x < 0.84:
        ti = r.randrange(len(CLASS_TEMPLATES))
        cls, desc = r.choice(CLASS_TASKS)
        return f"c{ti}|{cls}", CLASS_TEMPLATES[ti].format(cls=cls, desc=desc)
    ti = r.randrange(len(SCRIPT_TEMPLATES))
    desc = r.choice(SCRIPT_TASKS)
    return f"s{ti}|{desc}", SCRIPT_TEMPLATES[ti].format(desc=desc, P=r.choice(PERSONAS))

# ----------------------------------------------------------------------------------------------------------------
# code_explain: explaining, reviewing and debugging short snippets
# Placeholders @F@, @X@, @Y@, @N@ in a snippet are replaced by one of its listed identifier choices; a snippet's
# code is stored as a list of lines.
# ----------------------------------------------------------------------------------------------------------------

_code_explain = _source("code_explain")
SNIPPETS: list[dict] = [dict(sn, code="\n".join(sn["code"])) for sn in _code_explain["snippets"]]
EXPLAIN_TEMPLATES = _code_explain["explain_templates"]
BUG_TEMPLATES = _code_explain["bug_templates"]
ERROR_TEMPLATES = _code_explain["error_templates"]


def _fill_names(r: random.Random, code: str, names: dict) -> str:
    for ph, choices in names.items():
        code = code.replace(ph, r.choice(choices))
    return code


def gen_code_explain(r: random.Random) -> tuple[str, str]:
    si = r.randrange(len(SNIPPETS))
    sn = SNIPPETS[si]
    code = _fence(_fill_names(r, sn["code"], sn["names"]), sn["lang"])
    lang = "Python" if sn["lang"] == "python" else "JavaScript"
    other = "JavaScript" if lang == "Python" else "Python"
    x = r.random()
    if sn.get("error") and x < 0.6:
        ti = r.randrange(len(ERROR_TEMPLATES))
        return f"e{ti}|{si}", ERROR_TEMPLATES[ti].format(code=code, error=sn["error"], purpose=sn["purpose"])
    if sn.get("bug") and x < 0.6:
        ti = r.randrange(len(BUG_TEMPLATES))
        return f"b{ti}|{si}", BUG_TEMPLATES[ti].format(code=code, purpose=sn["purpose"])
    ti = r.randrange(len(EXPLAIN_TEMPLATES))
    return f"x{ti}|{si}", EXPLAIN_TEMPLATES[ti].format(code=code, Lang=lang, other=other)

# ----------------------------------------------------------------------------------------------------------------
# math: word problems with randomized numbers (arithmetic, percentages, algebra, units, geometry, probability)
# ----------------------------------------------------------------------------------------------------------------

_math = _source("math")
SHOP_ITEMS = _math["shop_items"]
MATH_SUFFIXES = _math["math_suffixes"]


def _money(x: float) -> str:
    return f"${x:,.2f}" if x != int(x) else f"${int(x):,}"


def _m_shopping(r):
    name = r.choice(NAMES)
    (s1, p1), (s2, p2) = _pick_n(r, SHOP_ITEMS, 2)
    a, b = r.randint(2, 9), r.randint(2, 7)
    pa, pb = r.choice([0.75, 1.25, 2, 2.5, 3, 4.5, 6, 12, 15]), r.choice([0.5, 1.5, 3, 3.75, 5, 8, 20])
    paid = r.choice([20, 50, 100])
    t = r.randrange(3)
    text = [f"{name} buys {a} {p1} at {_money(pa)} each and {b} {p2} at {_money(pb)} each. How much does {name} spend in total?",
            f"{name} pays with a {_money(paid)} bill for {a} {p1} costing {_money(pa)} each. How much change should {name} get back?",
            f"If one {s1} costs {_money(pa)}, how many can you buy with {_money(paid)}, and how much money is left over?"][t]
    return f"shop{t}|{s1}", text


def _m_percent(r):
    name = r.choice(NAMES)
    price = r.choice([24, 36, 45, 60, 80, 120, 150, 199, 250, 480, 75, 90])
    pct = r.choice([10, 15, 20, 25, 30, 35, 40, 12, 5])
    t = r.randrange(6)
    item = r.choice(["jacket", "pair of headphones", "bicycle", "desk lamp", "backpack", "rug", "coffee maker",
                     "pair of running shoes", "board game", "tent"])
    text = [f"A {item} costs {_money(price)}. It's on sale for {pct}% off. What is the sale price?",
            f"{name} scored {r.randint(30, 48)} out of 50 on a test. What percentage is that?",
            f"A town's population grew from {price * 100:,} to {int(price * 100 * (1 + pct / 100)):,}. What was the percentage increase?",
            f"The bill at a restaurant comes to {_money(price / 2)}. If we leave a {pct}% tip, what is the total?",
            f"After a {pct}% discount, a {item} costs {_money(round(price * (1 - pct / 100), 2))}. What was the original price?",
            f"A {item} is priced at {_money(price)} before a {r.choice([5, 7, 8, 13, 20])}% sales tax. What's the final price?"][t]
    return f"pct{t}|{item if t in (0, 4, 5) else ''}", text


def _m_speed(r):
    name = r.choice(NAMES)
    v = r.choice([40, 45, 50, 60, 65, 72, 80, 90, 110])
    h = r.choice([1.5, 2, 2.5, 3, 4, 0.75])
    d = r.choice([120, 150, 180, 210, 240, 300, 360, 420])
    vehicle = r.choice(["train", "car", "bus", "ferry", "truck", "cyclist"])
    t = r.randrange(5)
    text = [f"A {vehicle} travels at {v} km/h for {h} hours. How far does it go?",
            f"{name} drives {d} miles and the trip takes {h} hours. What was the average speed?",
            f"Two {vehicle}s leave the same station at the same time, heading in opposite directions at {v} km/h and {v + r.choice([10, 15, 20])} km/h. How far apart are they after {h} hours?",
            f"{name} walks to work at 5 km/h and it takes {r.choice([24, 36, 48])} minutes. How far is the office?",
            f"A {vehicle} needs to cover {d} km. If it averages {v} km/h, how long will the trip take in hours and minutes?"][t]
    return f"spd{t}|{vehicle if t in (0, 2, 4) else ''}", text


def _m_units(r):
    t = r.randrange(9)
    n = r.choice([3, 5, 7.5, 12, 15, 26.2, 42, 100, 250, 2.5])
    text = [f"How many miles is {n} kilometers?",
            f"Convert {r.choice([-10, 0, 18, 25, 37, 100, 180])} degrees Celsius to Fahrenheit.",
            f"A recipe needs {r.choice([1.5, 2, 3, 0.75])} cups of flour. About how many grams is that?",
            f"I'm {r.randint(150, 195)} cm tall. What is that in feet and inches?",
            f"How many seconds are there in {r.choice([3, 7, 12, 30])} days?",
            f"My suitcase weighs {r.choice([18, 23, 27, 32])} kg. Is that more or less than 50 pounds?",
            f"Convert {r.choice([500, 750, 1200, 2500])} milliliters to liters and to US fluid ounces.",
            f"A room is {r.randint(3, 8)} meters by {r.randint(3, 6)} meters. What is its area in square feet?",
            f"If my car uses {r.choice([5.5, 6, 7.2, 8])} liters per 100 km, what is that in miles per gallon?"][t]
    return f"unit{t}|{t}", text


def _m_linear(r):
    a, x, b = r.randint(2, 12), r.randint(-9, 15), r.randint(-20, 30)
    c = a * x + b
    bs = f"+ {b}" if b >= 0 else f"- {-b}"
    t = r.randrange(6)
    var = r.choice(["x", "x", "y", "n", "t"])
    text = [f"Solve for {var}: {a}{var} {bs} = {c}",
            f"Solve {a}{var} {bs} = {c} and check your answer.",
            f"What value of {var} makes {a}{var} {bs} = {c} true?",
            f"A number is tripled, then {abs(b)} is added, giving {3 * x + abs(b)}. What's the number?",
            f"Solve the system: x + y = {x + b}, x - y = {x - b}.",
            f"Find {var} if {a}({var} - {abs(b) % 7 + 1}) = {a * (x - (abs(b) % 7 + 1))}."][t]
    return f"lin{t}|{a}", text


def _m_geometry(r):
    t = r.randrange(7)
    a, b = r.randint(3, 20), r.randint(3, 20)
    shape_obj = r.choice(["garden", "room", "swimming pool", "parking lot", "picture frame", "field"])
    text = [f"A rectangular {shape_obj} is {a} meters long and {b} meters wide. What are its area and perimeter?",
            f"What is the area of a circle with a radius of {a} cm?",
            f"A right triangle has legs of {a} and {b}. How long is the hypotenuse?",
            f"How much fencing do I need to go around a circular {shape_obj} with a diameter of {2 * a} feet?",
            f"A box is {a} cm by {b} cm by {r.randint(2, 12)} cm. What is its volume?",
            f"What is the sum of the interior angles of a polygon with {r.randint(5, 12)} sides?",
            f"I want to paint a wall that is {a} feet wide and {r.randint(8, 12)} feet tall. One can of paint covers 350 square feet. How many cans do I need for two coats?"][t]
    return f"geo{t}|{shape_obj if t in (0, 3) else ''}", text


def _m_age(r):
    n1, n2 = _pick_n(r, NAMES, 2)
    a, k, y = r.randint(4, 15), r.choice([2, 3, 4]), r.randint(3, 12)
    t = r.randrange(4)
    text = [f"{n1} is {k} times as old as {n2}. In {a} years, the sum of their ages will be {(k + 1) * y + 2 * a}. How old are they now?",
            f"{n1} is {a} years older than {n2}. Together their ages add up to {2 * (a + 10) + a}. How old is each of them?",
            f"In {a} years, {n1}'s age will be double what it was {a + 2} years ago. How old is {n1} now?",
            f"{n1}'s mother is {k} times as old as {n1}. The difference in their ages is {(k - 1) * (a + 6)} years. How old is {n1}?"][t]
    return f"age{t}|{k if t in (0, 3) else ''}", text


def _m_work(r):
    n1, n2 = _pick_n(r, NAMES, 2)
    h1, h2 = r.choice([2, 3, 4, 5, 6]), r.choice([3, 4, 6, 8, 12])
    job = r.choice(["paint a fence", "mow the lawn", "clean the house", "assemble the bookshelves", "fold the laundry"])
    t = r.randrange(3)
    text = [f"{n1} can {job} in {h1} hours, and {n2} can do it in {h2} hours. How long will it take if they work together?",
            f"Three printers can print 600 pages in {h1} minutes. How long would {r.choice([2, 5, 6])} printers take to print the same number of pages?",
            f"A tap fills a tank in {h2} hours and a drain empties it in {h2 + h1} hours. If both are open, how long does it take to fill the tank?"][t]
    return f"work{t}|{job if t == 0 else ''}", text


def _m_interest(r):
    p = r.choice([500, 1000, 2500, 5000, 10000, 750])
    rate = r.choice([2, 3, 3.5, 4, 5, 6, 7.5])
    y = r.choice([2, 3, 5, 10, 15])
    t = r.randrange(4)
    text = [f"If I invest {_money(p)} at {rate}% simple interest per year, how much interest will I earn in {y} years?",
            f"How much will {_money(p)} grow to in {y} years at {rate}% interest compounded annually?",
            f"I borrowed {_money(p)} and pay {rate}% interest per year. If I pay it back after {y} years with simple interest, what's the total I owe?",
            f"I save {_money(p / 10)} every month. How much will I have after {y} years, ignoring interest? And roughly how much with {rate}% yearly interest?"][t]
    return f"int{t}|{y}", text


def _m_stats(r):
    k = r.randint(5, 8)
    vals = [r.randint(50, 100) for _ in range(k)]
    subj = r.choice(["test scores", "daily step counts (in hundreds)", "weights in kilograms", "bowling scores",
                     "temperatures this week", "minutes spent reading each day"])
    t = r.randrange(4)
    if t == 1:
        subj = r.choice(["test scores", "bowling scores", "quiz results", "golf scores"])
    text = [f"Find the mean, median and mode of these {subj}: {', '.join(map(str, vals))}.",
            f"My {subj} were {', '.join(map(str, vals[:-1]))}. What do I need on the next one to average {sum(vals) // len(vals) + 2}?",
            f"What is the range and standard deviation of {', '.join(map(str, vals))}?",
            f"The average of {k} numbers is {sum(vals) // k}. If one number, {vals[0]}, is removed, what is the average of the rest?"][t]
    return f"stat{t}|{subj if t in (0, 1) else ''}", text


def _m_prob(r):
    t = r.randrange(7)
    a, b = r.randint(2, 9), r.randint(2, 9)
    text = [f"If I roll two six-sided dice, what's the probability that the total is {r.randint(2, 12)}?",
            f"A bag has {a} red marbles and {b} blue marbles. If I draw two without replacement, what's the probability both are red?",
            f"What's the probability of getting exactly {r.randint(1, 4)} heads in {r.randint(4, 6)} coin flips?",
            f"There are {a + b + 10} students in a class. In how many ways can we choose a president, a secretary and a treasurer?",
            f"How many different {r.randint(3, 5)}-letter arrangements can be made from the letters of the word {r.choice(['PLANET', 'GARDEN', 'MATHS', 'ROUTE', 'FRIEND'])}?",
            f"A spinner has {a + 2} equal sections numbered 1 to {a + 2}. What's the probability of spinning an even number twice in a row?",
            f"If it rains on {a * 10}% of days in {r.choice(MONTHS)}, what's the chance it stays dry for {b % 4 + 2} days in a row, assuming days are independent?"][t]
    return f"prob{t}|{t}", text


def _m_ratio(r):
    name = r.choice(NAMES)
    t = r.randrange(5)
    serves, want = r.choice([4, 6, 8]), r.choice([2, 3, 5, 10, 12])
    dish = r.choice(["pancakes", "lasagna", "chili", "banana bread", "lemonade", "curry", "cookies"])
    text = [f"A recipe for {dish} serves {serves} and uses {r.choice([2, 3])} cups of flour and {r.choice([1, 2, 3])} eggs. How much of each do I need for {want} people?",
            f"{name} and a friend split {_money(r.choice([120, 240, 360, 500]))} in the ratio {r.randint(2, 5)}:{r.randint(1, 4)}. How much does each get?",
            f"A map has a scale of 1:{r.choice([25000, 50000, 100000])}. If two towns are {r.randint(3, 15)} cm apart on the map, how far apart are they really?",
            f"Orange paint is made by mixing red and yellow in a {r.randint(1, 3)}:{r.randint(2, 5)} ratio. How much red do I need for {r.choice([5, 10, 12])} liters?",
            f"If {r.randint(3, 6)} workers can build a wall in {r.randint(6, 12)} days, how long would it take {r.randint(7, 10)} workers at the same rate?"][t]
    return f"rat{t}|{dish if t == 0 else ''}", text


def _m_time(r):
    name = r.choice(NAMES)
    t = r.randrange(4)
    hh, mm = r.randint(6, 11), r.choice([5, 15, 20, 40, 45, 50])
    text = [f"{name}'s flight leaves at {hh}:{mm:02d} a.m. and lands {r.randint(2, 9)} hours and {r.choice([10, 25, 35, 55])} minutes later. What time does it land?",
            f"A movie starts at {hh}:{mm:02d} p.m. and is {r.randint(95, 175)} minutes long. When does it end?",
            f"If it's {hh}:{mm:02d} in London, what time is it in Tokyo, which is 9 hours ahead?",
            f"{name} works from {hh}:{mm:02d} a.m. to {r.randint(3, 6)}:{r.choice(['00', '30'])} p.m. with a {r.choice([30, 45, 60])}-minute lunch break, five days a week. How many hours is that per week?"][t]
    return f"time{t}|{t}", text


def _m_arith(r):
    t = r.randrange(8)
    a, b, c = r.randint(12, 999), r.randint(3, 99), r.randint(2, 12)
    text = [f"What is {a} × {b}?",
            f"Calculate {a} + {b} × {c} - {c * 3} and explain the order of operations.",
            f"What's {r.randint(2, 9)}/{r.randint(10, 12)} + {r.randint(1, 5)}/{r.randint(6, 9)} as a simplified fraction?",
            f"Is {a * 7 + (r.randint(0, 1))} divisible by 7? How can I tell quickly?",
            f"What is {c}% of {a * 10}?",
            f"Round {a / 7:.5f} to two decimal places and explain the rule.",
            f"What is the square root of {r.choice([144, 169, 196, 225, 289, 324, 400, 529, 576, 625, 729])}? How could I work it out by hand?",
            f"Write {a * b} as a product of prime factors."][t]
    return f"ar{t}|{t}", text


def _m_budget(r):
    name = r.choice(NAMES)
    income = r.choice([1800, 2200, 2600, 3100, 3800, 4500])
    rent = int(income * r.choice([0.3, 0.35, 0.4, 0.45]))
    t = r.randrange(3)
    text = [f"{name} earns {_money(income)} a month. Rent is {_money(rent)}, groceries are about {_money(r.choice([250, 300, 400, 450]))}, and transport is {_money(r.choice([60, 90, 120, 150]))}. What percentage of income is left for everything else?",
            f"I want to save {_money(r.choice([1200, 3000, 5000, 8000]))} for a trip in {r.randint(5, 18)} months. How much do I need to put aside each week?",
            f"A phone costs {_money(r.choice([699, 899, 1099]))} upfront, or {_money(r.choice([32, 38, 45]))} a month for 24 months. How much more does the monthly plan cost in total?"][t]
    return f"bud{t}|{t}", text


MATH_GENERATORS: list[Callable] = [_m_shopping, _m_percent, _m_speed, _m_units, _m_linear, _m_geometry, _m_age,
                                   _m_work, _m_interest, _m_stats, _m_prob, _m_ratio, _m_time, _m_arith, _m_budget]

MATH_WRAPPERS = _math["math_wrappers"]


def gen_math(r: random.Random) -> tuple[str, str]:
    gi = r.randrange(len(MATH_GENERATORS))
    key, q = MATH_GENERATORS[gi](r)
    wi = r.randrange(len(MATH_WRAPPERS))
    text = MATH_WRAPPERS[wi].format(q=q, P=r.choice(PERSONAS), kid=r.choice(KIDS))
    if wi < 3:
        text += r.choice(MATH_SUFFIXES)
    return f"{key}|{MATH_WRAPPERS[wi]}", text

# ----------------------------------------------------------------------------------------------------------------
# story and poem: short fiction and verse
# ----------------------------------------------------------------------------------------------------------------

_story = _source("story")
CHARACTERS = _story["characters"]
SETTINGS = _story["settings"]
GENRES = _story["genres"]
STORY_CONSTRAINTS = _story["story_constraints"]
STORY_OBJECTS = _story["story_objects"]
STORY_TEMPLATES = _story["story_templates"]

_poem = _source("poem")
POEM_SUBJECTS = _poem["poem_subjects"]
POEM_FORMS = _poem["poem_forms"]
POEM_MOODS = _poem["poem_moods"]
ACROSTIC_WORDS = _poem["acrostic_words"]
POEM_TEMPLATES = _poem["poem_templates"]


def gen_story(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(STORY_TEMPLATES))
    c, c2 = _pick_n(r, CHARACTERS, 2)
    s, g, k, o = r.choice(SETTINGS), r.choice(GENRES), r.choice(STORY_CONSTRAINTS), r.choice(STORY_OBJECTS)
    text = STORY_TEMPLATES[ti].format(c=c, c2=c2, s=s, g=g, ag=_an(g), k=k, o=o, kid=r.choice(KIDS))
    topic = o if "{c}" not in STORY_TEMPLATES[ti] else c
    return f"t{ti}|{topic}", _casual(r, text)


def gen_poem(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(POEM_TEMPLATES))
    s, s2 = _pick_n(r, POEM_SUBJECTS, 2)
    _, form = r.choice(POEM_FORMS)
    title = _cap(s.replace("the ", "", 1)) if r.random() < 0.5 else _cap(s2)
    text = POEM_TEMPLATES[ti].format(form=form, Form=_cap(form), s=s, s2=s2, mood=(mood := r.choice(POEM_MOODS)), amood=_an(mood),
                                     kid=r.choice(KIDS), c=r.choice(CHARACTERS), title=title,
                                     word=r.choice(ACROSTIC_WORDS))
    topic = "acrostic" if "{word}" in POEM_TEMPLATES[ti] else s
    return f"t{ti}|{topic}", _casual(r, text)

# ----------------------------------------------------------------------------------------------------------------
# email: emails, letters and short messages
# ----------------------------------------------------------------------------------------------------------------

_email = _source("email")
EMAIL_PURPOSES = _email["email_purposes"]
LETTER_TASKS = _email["letter_tasks"]
TONES = _email["tones"]
EMAIL_TEMPLATES = _email["email_templates"]
LETTER_TEMPLATES = _email["letter_templates"]
WHEN = _email["when"]
_SLACK_OK = set(_email["slack_ok"])
_TEXT_OK = set(_email["text_ok"])


def gen_email(r: random.Random) -> tuple[str, str]:
    tone = r.choice(TONES)
    if r.random() < 0.72:
        ti = r.randrange(len(EMAIL_TEMPLATES))
        rcpt, purpose = r.choice(EMAIL_PURPOSES)
        tmpl = EMAIL_TEMPLATES[ti]
        if ("Slack" in tmpl and rcpt not in _SLACK_OK) or ("text message" in tmpl and rcpt not in _TEXT_OK):
            ti = r.randrange(10)
        text = EMAIL_TEMPLATES[ti].format(rcpt=rcpt, purpose=purpose, tone=tone, atone=_an(tone),
                                          P=r.choice(PERSONAS), when=r.choice(WHEN))
        return f"e{ti}|{purpose}", _casual(r, text)
    ti = r.randrange(len(LETTER_TEMPLATES))
    task = r.choice(LETTER_TASKS)
    text = LETTER_TEMPLATES[ti].format(task=task, tone=tone, atone=_an(tone))
    return f"l{ti}|{task}", _casual(r, text)

# ----------------------------------------------------------------------------------------------------------------
# Passages for summarize / rewrite / extract: hand-written ones (passages.json) plus procedural ones
# ----------------------------------------------------------------------------------------------------------------

_passages = _source("passages")
PASSAGES = _passages["passages"]
_TOWNS = _passages["towns"]
_NEWS_DECISIONS = _passages["news_decisions"]


def _p_news(r: random.Random) -> tuple[str, str]:
    town = r.choice(_TOWNS)
    verb, dissent, objs = r.choice(_NEWS_DECISIONS)
    obj = r.choice(objs)
    votes_for, votes_against = r.randint(5, 8), r.randint(1, 4)
    cost = r.choice(["1.2 million", "450,000", "3.5 million", "780,000", "2 million"])
    name, name2 = _pick_n(r, NAMES, 2)
    reason = r.choice(["concerns about the cost", "strong support at a public meeting", "a petition signed by 1,400 residents",
                       "worries about traffic", "a report on the town's finances", "complaints from local businesses"])
    text = (f"The {town} town council on {r.choice(WEEKDAYS)} {verb} {obj}, after {reason}. The vote was "
            f"{votes_for} to {votes_against}. The project was expected to cost about ${cost}. Council member {name} "
            f"said the decision reflected 'what people in {town} have been asking for', while {name2}, {dissent}. "
            f"A final report is due in {r.choice(MONTHS)}.")
    return f"news|{obj}", text


def _p_meeting(r: random.Random) -> tuple[str, str]:
    n = _pick_n(r, NAMES, 4)
    project = r.choice(["the website redesign", "the spring product launch", "the office move", "the customer survey",
                        "the mobile app update", "the annual conference", "the hiring plan", "the new onboarding process"])
    issue = r.choice(["the budget is 10% over", "two team members are on leave", "the vendor missed a deadline",
                      "testing found several bugs", "customer feedback was mixed", "legal review is still pending"])
    date = f"{r.choice(MONTHS)} {r.randint(2, 28)}"
    text = (f"Meeting notes - {project}. Attendees: {', '.join(n)}. {n[0]} reported that {issue}. "
            f"The group agreed to {r.choice(['push the deadline back by one week', 'cut two low-priority features', 'ask for extra budget', 'bring in a contractor', 'run a second round of testing'])}. "
            f"{n[1]} will update the timeline by {r.choice(WEEKDAYS)}. {n[2]} will contact the {r.choice(['vendor', 'design agency', 'finance team', 'legal team'])}. "
            f"{n[3]} raised concerns about {r.choice(['team workload', 'communication with customers', 'the quality of the documentation', 'the launch date'])}; "
            f"this will be discussed next time. Next meeting: {date}.")
    return f"meeting|{project}", text


def _p_product(r: random.Random) -> tuple[str, str]:
    product = r.choice(["smart water bottle", "folding e-bike", "noise-cancelling headset", "solar phone charger",
                        "robot vacuum", "reading lamp", "language-learning app", "fitness tracker", "air purifier",
                        "mechanical keyboard", "camping stove", "baby monitor"])
    brand = r.choice(["Nimbus", "Verdant", "Pulse", "Lumo", "Kestrel", "Orbit", "Tidal", "Quill", "Ember", "Arc"])
    f1, f2 = _pick_n(r, ["a battery that lasts up to two weeks", "a lighter, recycled aluminum body",
                         "a companion app with weekly reports", "voice controls", "a two-year warranty",
                         "water resistance", "fast USB-C charging", "a quieter motor", "offline mode",
                         "a choice of five colors"], 2)
    text = (f"{brand} today announced the {brand} {product.title()} 2, the second generation of its popular {product}. "
            f"The new model adds {f1} and {f2}. It will cost ${r.choice([39, 59, 79, 129, 199, 249, 349])} and goes on sale in "
            f"{r.choice(MONTHS)}. 'Our customers told us exactly what they wanted,' said CEO {r.choice(NAMES)} "
            f"{r.choice(['Park', 'Okafor', 'Silva', 'Novak', 'Haddad', 'Lindqvist', 'Moreau', 'Tanaka'])}. Owners of the first "
            f"model can trade it in for a {r.choice([15, 20, 25, 30])}% discount until the end of the year.")
    return f"product|{product}", text


def _p_bio(r: random.Random) -> tuple[str, str]:
    name = r.choice(NAMES)
    surname = r.choice(["Alvarez", "Okoye", "Brennan", "Sato", "Kowalski", "Mensah", "Duarte", "Lindgren", "Farouk",
                        "Chandra", "Whitfield", "Rossi"])
    job = r.choice(["marine biologist", "architect", "jazz pianist", "pastry chef", "wildlife photographer",
                    "children's author", "civil engineer", "mountain guide", "violin maker", "software engineer"])
    born = r.choice(CITIES)
    year = r.randint(1948, 1995)
    text = (f"{name} {surname} is {_an(job)} born in {born} in {year}. After studying at a local college, {name} spent "
            f"{r.randint(3, 12)} years working in {r.choice(CITIES)} before starting an independent practice. "
            f"{name}'s best-known project, {r.choice(['a floating classroom', 'a series of books about the sea', 'a bridge made of recycled plastic', 'an album recorded in a cave', 'a bakery that trains young refugees', 'a photo archive of disappearing glaciers'])}, "
            f"won a national award in {year + r.randint(25, 28)}. Today, {name} lives with a partner and "
            f"{r.choice(['two dogs', 'three children', 'an elderly cat', 'a large vegetable garden'])}, and teaches a workshop every summer.")
    return f"bio|{job}", text


REVIEW_PRODUCTS = _passages["review_products"]
_REVIEW_GOOD = _passages["review_good"]
_REVIEW_BAD = _passages["review_bad"]


def _p_review(r: random.Random) -> tuple[str, str]:
    product = r.choice(REVIEW_PRODUCTS)
    stars = r.randint(1, 5)
    goods, bads = _pick_n(r, _REVIEW_GOOD, 2), _pick_n(r, _REVIEW_BAD, 2)
    if stars >= 4:
        body = f"I've had this {product} for {r.choice(['a month', 'two weeks', 'six months', 'a year'])} and I'm really happy with it. {_cap(goods[0])}, and {goods[1]}. My only small complaint is that {bads[0]}."
    elif stars == 3:
        body = f"Mixed feelings about this {product}. On the plus side, {goods[0]}. But {bads[0]}, and {bads[1]}. It's okay for the price, I guess."
    else:
        body = f"Really disappointed with this {product}. {_cap(bads[0])}, and {bads[1]}. I contacted the seller {r.choice(['twice', 'three times', 'last week'])} and I'm still waiting for a reply. Would not buy again."
    return f"review|{product}", body


PASSAGE_GENERATORS = [_p_news, _p_meeting, _p_product, _p_bio, _p_review]


def _passage(r: random.Random) -> tuple[str, str]:
    """(key, passage): a hand-written passage 55% of the time, otherwise a procedural one."""
    if r.random() < 0.55:
        i = r.randrange(len(PASSAGES))
        return f"p{i}", PASSAGES[i]
    return r.choice(PASSAGE_GENERATORS)(r)

# ----------------------------------------------------------------------------------------------------------------
# summarize, rewrite, extract: operations on a given text
# ----------------------------------------------------------------------------------------------------------------

_summarize = _source("summarize")
SUMMARY_TEMPLATES = _summarize["summary_templates"]

_rewrite = _source("rewrite")
REWRITE_SOURCES = _rewrite["rewrite_sources"]
REWRITE_OPS = _rewrite["rewrite_ops"]
REWRITE_FRAMES = _rewrite["rewrite_frames"]
PARAGRAPH_REWRITE_OPS = _rewrite["paragraph_rewrite_ops"]


def gen_summarize(r: random.Random) -> tuple[str, str]:
    pk, p = _passage(r)
    ti = r.randrange(len(SUMMARY_TEMPLATES))
    return f"t{ti}|{pk}", SUMMARY_TEMPLATES[ti].format(p=p)


def gen_rewrite(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.2:
        pk, p = _passage(r)
        oi = r.randrange(len(PARAGRAPH_REWRITE_OPS))
        return f"p{oi}|{pk}", f"{PARAGRAPH_REWRITE_OPS[oi]}\n\n{p}"
    oi, fi = r.randrange(len(REWRITE_OPS)), r.randrange(len(REWRITE_FRAMES))
    t = r.choice(REWRITE_SOURCES)
    op = REWRITE_OPS[oi][1]
    op_lower = _low(op)
    if fi == 3:
        op_lower = _cap(op)[:-1] + "." if op.endswith(":") else _cap(op)
    elif fi == 4:
        op_lower = _low(op).rstrip(":")
    elif fi == 5:
        op_lower = _cap(op)
    text = REWRITE_FRAMES[fi].format(op=op, op_lower=op_lower, t=t)
    return f"o{oi}|{t}", text


_extract = _source("extract")
EXTRACT_TASKS = _extract["extract_tasks"]
SUPPORT_TICKETS = _extract["support_tickets"]
TICKET_TEMPLATES = _extract["ticket_templates"]


def gen_extract(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.22:
        ti, t = r.randrange(len(TICKET_TEMPLATES)), r.choice(SUPPORT_TICKETS)
        return f"k{ti}|{t}", TICKET_TEMPLATES[ti].format(t=t)
    pk, p = _passage(r)
    kind = pk.split("|")[0]
    pool = EXTRACT_TASKS.get(kind, []) + EXTRACT_TASKS["any"] if r.random() < 0.6 else EXTRACT_TASKS["any"]
    tmpl = r.choice(pool)
    return f"{tmpl[:40]}|{pk}", tmpl.format(p=p)

# ----------------------------------------------------------------------------------------------------------------
# brainstorm, howto, compare
# ----------------------------------------------------------------------------------------------------------------

_brainstorm = _source("brainstorm")
BRAINSTORM_THINGS = _brainstorm["brainstorm_things"]
BRAINSTORM_TEMPLATES = _brainstorm["brainstorm_templates"]

_howto = _source("howto")
HOWTO_TASKS = _howto["howto_tasks"]
HOWTO_TEMPLATES = _howto["howto_templates"]

_compare = _source("compare")
COMPARE_PAIRS = _compare["compare_pairs"]
COMPARE_TEMPLATES = _compare["compare_templates"]


def gen_brainstorm(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(BRAINSTORM_TEMPLATES))
    x = r.choice(BRAINSTORM_THINGS)
    text = BRAINSTORM_TEMPLATES[ti].format(n=r.choice([3, 5, 5, 6, 7, 8, 10, 10, 12, 15, 20]), x=x,
                                           P=r.choice(PERSONAS))
    return f"t{ti}|{x}", _casual(r, text, context="open")


def gen_howto(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(HOWTO_TEMPLATES))
    t = r.choice(HOWTO_TASKS)
    tmpl = HOWTO_TEMPLATES[ti]
    if "{kid}" in tmpl:
        t_fill = re.sub(r"\bmy\b", "their", re.sub(r"\bI\b", "they", t))
    else:
        t_fill = t
    text = tmpl.format(t=t_fill, P=r.choice(PERSONAS), kid=r.choice(KIDS))
    return f"t{ti}|{t}", _casual(r, text, context="full")


def gen_compare(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(COMPARE_TEMPLATES))
    a, b, ctx = r.choice(COMPARE_PAIRS)
    if r.random() < 0.5:
        a, b = b, a
    ctx = f" {ctx}" if ctx else ""
    text = COMPARE_TEMPLATES[ti].format(a=a, b=b, A=_cap(a), ctx=ctx, P=r.choice(PERSONAS))
    return f"t{ti}|{min(a, b)}|{max(a, b)}", _casual(r, text, context="full")

# ----------------------------------------------------------------------------------------------------------------
# define: vocabulary, idioms, commonly confused words, jargon; trivia: factual quiz questions
# ----------------------------------------------------------------------------------------------------------------

_define = _source("define")
VOCAB_WORDS = _define["vocab_words"]
IDIOMS = _define["idioms"]
CONFUSED_PAIRS = _define["confused_pairs"]
DEFINE_TEMPLATES = _define["define_templates"]
IDIOM_TEMPLATES = _define["idiom_templates"]
CONFUSED_TEMPLATES = _define["confused_templates"]

_trivia = _source("trivia")
CAPITALS = _trivia["capitals"]
AUTHORED = _trivia["authored"]
INVENTIONS = _trivia["inventions"]
TRIVIA_QUESTIONS = _trivia["trivia_questions"]
TRIVIA_TOPICS = _trivia["trivia_topics"]
TRIVIA_WRAPPERS = _trivia["trivia_wrappers"]
TRIVIA_GENERATED = _trivia["trivia_generated"]


def gen_define(r: random.Random) -> tuple[str, str]:
    x = r.random()
    if x < 0.6:
        ti, w = r.randrange(len(DEFINE_TEMPLATES)), r.choice(VOCAB_WORDS)
        text = DEFINE_TEMPLATES[ti].format(w=w, aud=r.choice(AUDIENCES), kid=r.choice(KIDS))
        return f"w{ti}|{w}", _casual(r, _cap(text), context="open")
    if x < 0.8:
        ti, i = r.randrange(len(IDIOM_TEMPLATES)), r.choice(IDIOMS)
        return f"i{ti}|{i}", _casual(r, IDIOM_TEMPLATES[ti].format(i=i), context="open")
    ti = r.randrange(len(CONFUSED_TEMPLATES))
    a, b = r.choice(CONFUSED_PAIRS)
    if r.random() < 0.5:
        a, b = b, a
    text = CONFUSED_TEMPLATES[ti].format(a=f"\"{a}\"", b=f"\"{b}\"") if r.random() < 0.6 else \
        CONFUSED_TEMPLATES[ti].format(a=a, b=b)
    return f"c{ti}|{min(a, b)}", _casual(r, _cap(text), context="open")


def gen_trivia(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.55:
        q = r.choice(TRIVIA_QUESTIONS)
        wi = r.randrange(len(TRIVIA_WRAPPERS))
        return f"{TRIVIA_WRAPPERS[wi]}|{q}", _casual(r, TRIVIA_WRAPPERS[wi].format(q=q, lq=_low(q)), context="open")
    ti = r.randrange(len(TRIVIA_GENERATED))
    kind, tmpl = TRIVIA_GENERATED[ti]
    fills = dict(c=r.choice(CAPITALS), b=r.choice(AUTHORED), inv=r.choice(INVENTIONS), t=r.choice(TRIVIA_TOPICS),
                 n=r.choice([3, 5, 5, 8, 10]))
    topic = {"cap": fills["c"], "auth": fills["b"], "inv": fills["inv"], "set": fills["t"]}[kind]
    return f"g{ti}|{topic}", _casual(r, tmpl.format(**fills), context="open")

# ----------------------------------------------------------------------------------------------------------------
# followup: single user messages that refer back to an earlier turn; roleplay: personas and scenarios
# ----------------------------------------------------------------------------------------------------------------

_followup = _source("followup")
FOLLOWUP_QUESTIONS = _followup["followup_questions"]
PAST_ADVICE = _followup["past_advice"]
CLAIMS = _followup["claims"]
FEATURES = _followup["features"]
FOLLOWUP_TEMPLATES = _followup["followup_templates"]


def gen_followup(r: random.Random) -> tuple[str, str]:
    ti = r.randrange(len(FOLLOWUP_TEMPLATES))
    kind, tmpl = FOLLOWUP_TEMPLATES[ti]
    (t, _), (t2, _) = _pick_n(r, SCIENCE_TOPICS, 2)
    q = r.choice(FOLLOWUP_QUESTIONS)
    fills = dict(t=t, t2=t2, q=q, lq=_low(q), aud=r.choice(AUDIENCES), h=r.choice(HOWTO_TASKS),
                 a=r.choice(PAST_ADVICE), c=r.choice(CLAIMS), ch=r.choice(CHARACTERS), f=r.choice(FEATURES),
                 ct=_third_to_base(r.choice(FUNC_TASKS)[2]), p=r.choice(PLACES), x=r.choice(BRAINSTORM_THINGS))
    topic = {"sci": t, "howto": fills["h"], "advice": fills["a"], "claim": fills["c"], "story": fills["ch"],
             "code": fills["ct"], "place": fills["p"], "list": fills["x"]}[kind]
    return f"t{ti}|{topic}", _casual(r, tmpl.format(**fills))


_roleplay = _source("roleplay")
ROLES = _roleplay["roles"]
ROLE_REQUESTS = _roleplay["role_requests"]
ROLE_TEMPLATES = _roleplay["role_templates"]
PRACTICE_SCENARIOS = _roleplay["practice_scenarios"]
PRACTICE_TEMPLATES = _roleplay["practice_templates"]


def gen_roleplay(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.75:
        ti, role = r.randrange(len(ROLE_TEMPLATES)), r.choice(ROLES)
        return f"r{ti}|{role}", _casual(r, ROLE_TEMPLATES[ti].format(role=role, req=r.choice(ROLE_REQUESTS)))
    ti, s = r.randrange(len(PRACTICE_TEMPLATES)), r.choice(PRACTICE_SCENARIOS)
    return f"p{ti}|{s}", _casual(r, PRACTICE_TEMPLATES[ti].format(s=s))

# ----------------------------------------------------------------------------------------------------------------
# Hard split: domains the drafter is not trained on
# ----------------------------------------------------------------------------------------------------------------

# King James Version passages (public domain), extracted once from Debian's bible-kjv-text package with
# `bible -l 5000 <ref>`; kept in kjv.json so that regeneration never depends on that package being installed.
_kjv = _source("kjv")
_KJV_PASSAGES = _kjv["kjv_passages"]
KJV_CONTINUE_TEMPLATES = _kjv["kjv_continue_templates"]
KJV_TRANSFORM_TEMPLATES = _kjv["kjv_transform_templates"]
_KJV_NARRATIVE = tuple(_kjv["kjv_narrative"])   # str.startswith takes a tuple
KJV_TOPICS = _kjv["kjv_topics"]

_legal_boilerplate = _source("legal_boilerplate")
LEGAL_PASSAGES = _legal_boilerplate["legal_passages"]
LEGAL_TEMPLATES = _legal_boilerplate["legal_templates"]

_sql = _source("sql")
SQL_SCHEMAS = _sql["sql_schemas"]
SQL_TEMPLATES = _sql["sql_templates"]
SQL_EXTRA = _sql["sql_extra"]

_shell = _source("shell")
SHELL_TASKS = _shell["shell_tasks"]
SHELL_TEMPLATES = _shell["shell_templates"]
SHELL_EXTRA = _shell["shell_extra"]

_regex = _source("regex")
REGEX_TASKS = _regex["regex_tasks"]
REGEX_TEMPLATES = _regex["regex_templates"]
REGEX_EXTRA = _regex["regex_extra"]

_non_english = _source("non_english")
NON_ENGLISH = {lang: (v["templates"], v["fills"]) for lang, v in _non_english["non_english"].items()}

_json_csv = _source("json_csv")
CSV_DATASETS = _json_csv["csv_datasets"]
CSV_TEMPLATES = _json_csv["csv_templates"]
JSON_TEMPLATES = _json_csv["json_templates"]


def _hard_kjv_continue(r: random.Random) -> tuple[str, str]:
    ref, p = r.choice(_KJV_PASSAGES)
    ti = r.randrange(len(KJV_CONTINUE_TEMPLATES))
    return f"t{ti}|{ref}", KJV_CONTINUE_TEMPLATES[ti].format(p=p, ref=ref, topic=r.choice(KJV_TOPICS))


def _hard_kjv_transform(r: random.Random) -> tuple[str, str]:
    ref, p = r.choice(_KJV_PASSAGES)
    ti = r.randrange(len(KJV_TRANSFORM_TEMPLATES))
    if "characters" in KJV_TRANSFORM_TEMPLATES[ti] and not ref.startswith(_KJV_NARRATIVE):
        ti = 0
    return f"t{ti}|{ref}", KJV_TRANSFORM_TEMPLATES[ti].format(p=p, ref=ref)


def _hard_legal(r: random.Random) -> tuple[str, str]:
    kind, p = r.choice(LEGAL_PASSAGES)
    ti = r.randrange(len(LEGAL_TEMPLATES))
    return f"t{ti}|{kind}", LEGAL_TEMPLATES[ti].format(p=p, kind=kind)


def _hard_sql(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.2:
        q = r.choice(SQL_EXTRA)
        return f"x|{q}", q
    schema, tasks = r.choice(SQL_SCHEMAS)
    ti, task = r.randrange(len(SQL_TEMPLATES)), r.choice(tasks)
    return f"t{ti}|{task}", SQL_TEMPLATES[ti].format(schema=schema, task=task)


def _hard_shell(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.25:
        q = r.choice(SHELL_EXTRA)
        return f"x|{q}", q
    ti, t = r.randrange(len(SHELL_TEMPLATES)), r.choice(SHELL_TASKS)
    t3 = re.sub(r"^(\w+)", lambda m: m.group(1) + ("es" if m.group(1).endswith(("sh", "ch", "x", "s")) else "s"), t)
    return f"t{ti}|{t}", SHELL_TEMPLATES[ti].format(t=t, t3=t3)


def _hard_regex(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.25:
        q = r.choice(REGEX_EXTRA)
        return f"x|{q}", q
    ti, t = r.randrange(len(REGEX_TEMPLATES)), r.choice(REGEX_TASKS)
    return f"t{ti}|{t}", REGEX_TEMPLATES[ti].format(t=t)


def _hard_non_english(r: random.Random) -> tuple[str, str]:
    lang = r.choice(sorted(NON_ENGLISH))
    templates, fills = NON_ENGLISH[lang]
    ti = r.randrange(len(templates))
    picked = {k: r.choice(v) for k, v in fills.items()}
    return f"{lang}{ti}", templates[ti].format(**picked)


def _hard_json_csv(r: random.Random) -> tuple[str, str]:
    n1, n2, n3 = _pick_n(r, NAMES, 3)
    c1, c2, c3 = _pick_n(r, CITIES, 3)
    if r.random() < 0.5:
        tmpl, kind = r.choice(CSV_DATASETS)
        csv = tmpl.format(n1=n1, n2=n2, n3=n3, c1=c1, c2=c2, c3=c3, a1=r.randint(18, 80), a2=r.randint(18, 80),
                          a3=r.randint(18, 80), d1=r.randint(1, 3), d2=r.randint(4, 6), d3=r.randint(7, 9),
                          b1=r.choice(["true", "false"]), b2=r.choice(["true", "false"]), b3=r.choice(["true", "false"]))
        ti = r.randrange(len(CSV_TEMPLATES))
        return f"c{ti}|{kind}", CSV_TEMPLATES[ti].format(csv=csv)
    doc = {"order_id": r.randint(1000, 9999), "customer": {"name": n1, "city": c1},
           "items": [{"sku": f"A-{r.randint(100, 999)}", "qty": r.randint(1, 5), "price": r.choice([4.99, 12.5, 20.0])},
                     {"sku": f"B-{r.randint(100, 999)}", "qty": r.randint(1, 3), "price": r.choice([2.25, 8.0, 15.75])}],
           "paid": r.choice([True, False])}
    js = json.dumps(doc, indent=2 if r.random() < 0.5 else None)
    ti = r.randrange(len(JSON_TEMPLATES))
    sentence = (f"{n2} is hosting a dinner on {r.choice(MONTHS)} {r.randint(1, 28)} in {c2} for {n1}, {n3} "
                f"and {r.choice(NAMES)}.")
    return f"j{ti}", JSON_TEMPLATES[ti].format(js=js, sentence=sentence)

# ----------------------------------------------------------------------------------------------------------------
# Assembly
# ----------------------------------------------------------------------------------------------------------------

# category -> (generator, relative weight); weights set the per-category share of train and heldout.
TRAIN_CATEGORIES: dict[str, tuple[Callable[[random.Random], tuple[str, str]], float]] = {
    "chat_advice": (gen_chat_advice, 1.2),
    "science": (gen_science, 1.1),
    "humanities": (gen_humanities, 1.0),
    "code_write": (gen_code_write, 1.3),
    "code_explain": (gen_code_explain, 1.0),
    "math": (gen_math, 1.3),
    "story": (gen_story, 1.1),
    "poem": (gen_poem, 0.8),
    "email": (gen_email, 0.9),
    "summarize": (gen_summarize, 0.8),
    "rewrite": (gen_rewrite, 0.9),
    "brainstorm": (gen_brainstorm, 0.8),
    "howto": (gen_howto, 1.0),
    "compare": (gen_compare, 0.8),
    "define": (gen_define, 0.8),
    "trivia": (gen_trivia, 0.7),
    "followup": (gen_followup, 0.8),
    "extract": (gen_extract, 0.7),
    "roleplay": (gen_roleplay, 0.6),
}

HARD_CATEGORIES: dict[str, tuple[Callable[[random.Random], tuple[str, str]], float]] = {
    "kjv_continue": (_hard_kjv_continue, 1.0),
    "kjv_transform": (_hard_kjv_transform, 1.0),
    "legal_boilerplate": (_hard_legal, 1.0),
    "sql": (_hard_sql, 1.0),
    "shell": (_hard_shell, 1.0),
    "regex": (_hard_regex, 1.0),
    "non_english": (_hard_non_english, 1.0),
    "json_csv": (_hard_json_csv, 1.0),
}


def _quotas(categories: dict, total: int) -> dict[str, int]:
    """Split `total` across categories in proportion to their weights (largest remainder, ties by name)."""
    wsum = sum(w for _, w in categories.values())
    exact = {c: total * w / wsum for c, (_, w) in categories.items()}
    out = {c: int(x) for c, x in exact.items()}
    for c in sorted(exact, key=lambda c: (-(exact[c] - out[c]), c))[: total - sum(out.values())]:
        out[c] += 1
    return out


def is_heldout_key(category: str, key: str) -> bool:
    """Whether a (category, split key) pair is reserved for the heldout split."""
    return _stable_int("heldout", category, key) % 10_000 < int(HELDOUT_FRACTION * 10_000)


def _normalize(text: str) -> str:
    """Dedupe key: case, punctuation and whitespace differences do not make a new prompt."""
    return " ".join(re.findall(r"\w+", text.lower()))


def _collect(category: str, gen: Callable, quotas: dict[str, int], seed: int, seen: set[str],
             route: Callable[[str], str]) -> dict[str, list[str]]:
    r = random.Random(_stable_int(seed, "gen", category))
    pools: dict[str, list[str]] = {split: [] for split in quotas}
    budget = 400 * sum(quotas.values()) + 1000
    while any(len(pools[s]) < q for s, q in quotas.items()):
        budget -= 1
        if budget < 0:
            got = {s: len(p) for s, p in pools.items()}
            raise RuntimeError(f"category {category!r}: could only generate {got} of {quotas} distinct prompts")
        key, text = gen(r)
        text = text.strip().replace("a.m..", "a.m.").replace("p.m..", "p.m.")
        split = route(key)
        norm = _normalize(text)
        if len(pools[split]) >= quotas[split] or norm in seen:
            continue
        seen.add(norm)
        pools[split].append(text)
    return pools


def _system_for(category: str, split: str, idx: int, seed: int) -> str | None:
    r = random.Random(_stable_int(seed, "system", split, category, idx))
    if r.random() >= SYSTEM_FRACTION:
        return None
    specific = SYSTEM_SPECIFIC.get(category, [])
    pool = SYSTEM_GENERIC + specific + specific   # category-appropriate prompts twice as likely
    return r.choice(pool)


def _records(split: str, category: str, texts: list[str], seed: int) -> list[dict]:
    out = []
    for i, text in enumerate(texts):
        messages = []
        system = _system_for(category, split, i, seed)
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": text})
        out.append({"id": f"{split}-{category}-{i:04d}", "category": category, "messages": messages, "split": split})
    return out


def build_prompts(seed: int = 0) -> list[dict]:
    """Generate every record of every split, deterministically for a given seed.

    Each record is ``{"id", "category", "messages", "split"}``; the committed jsonl files hold the same records
    without ``"split"`` (the file name is the split), each split shuffled with a seed-derived order.
    """
    seen: set[str] = set()
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    train_q = _quotas(TRAIN_CATEGORIES, SIZES["train"])
    held_q = _quotas(TRAIN_CATEGORIES, SIZES["heldout"])
    for category, (gen, _) in TRAIN_CATEGORIES.items():
        pools = _collect(category, gen, {"train": train_q[category], "heldout": held_q[category]}, seed, seen,
                         lambda key, c=category: "heldout" if is_heldout_key(c, key) else "train")
        for split, texts in pools.items():
            by_split[split] += _records(split, category, texts, seed)
    hard_q = _quotas(HARD_CATEGORIES, SIZES["hard"])
    for category, (gen, _) in HARD_CATEGORIES.items():
        pools = _collect(category, gen, {"hard": hard_q[category]}, seed, seen, lambda key: "hard")
        by_split["hard"] += _records("hard", category, pools["hard"], seed)
    out: list[dict] = []
    for split in SPLITS:
        recs = by_split[split]
        random.Random(_stable_int(seed, "order", split)).shuffle(recs)
        out += recs
    return out


def _jsonl_line(rec: dict) -> str:
    return json.dumps({k: rec[k] for k in ("id", "category", "messages")}, ensure_ascii=False)


def write_prompts(records: list[dict] | None = None, out_dir: Path | str | None = None) -> dict[str, Path]:
    """Write ``{split}.jsonl`` files (one JSON record per line, UTF-8) and return their paths."""
    records = build_prompts() if records is None else records
    out_dir = Path(out_dir) if out_dir is not None else DATA_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        path = out_dir / f"{split}.jsonl"
        lines = [_jsonl_line(rec) for rec in records if rec["split"] == split]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths[split] = path
    return paths


def category_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec["category"]] = counts.get(rec["category"], 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/make_prompts.py",
                                     description="Regenerate data/prompts/{train,heldout,hard}.jsonl")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (the committed files use 0)")
    parser.add_argument("--out-dir", default=None, help="output folder (default: data/prompts in this repo)")
    parser.add_argument("--sample", type=int, default=0, help="also print this many random prompts per split")
    args = parser.parse_args(argv)
    records = build_prompts(args.seed)
    paths = write_prompts(records, args.out_dir)
    for split, path in paths.items():
        recs = [r for r in records if r["split"] == split]
        print(f"{split}: {len(recs)} records, {path.stat().st_size / 1024:.0f} KiB -> {path}")
        print("   ", ", ".join(f"{c}={n}" for c, n in category_counts(recs).items()))
        if args.sample:
            for rec in random.Random(1).sample(recs, min(args.sample, len(recs))):
                print(f"  [{rec['category']}] {rec['messages'][-1]['content']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
