"""Offline prompt sets for training and benchmarking the DSpark drafter of SmolLM2-135M-Instruct.

The target model writes the responses itself; this module only provides the *prompts*. They come from a
deterministic generator (:func:`build_prompts`) that combines hand-written templates with hand-written word and
topic lists through ``random.Random``; the result is committed as ``data/prompts/{train,heldout,hard}.jsonl``
and read back with :func:`load_prompts`, so training and tests never need to run the generator.

Splits
    train    ~7,000 in-domain prompts over 19 categories (chat, science, code, math, stories, ...).
    heldout  ~400 in-domain prompts, same categories, built only from held-out (template, topic) pairs: every
             generator returns a split key naming the template and the main topic it combined, and a stable hash
             of ``category|key`` reserves about 12% of the keys for heldout. No prompt string is shared.
    hard     ~200 prompts from domains the drafter is not trained on (King James Bible passages, legal/licence
             boilerplate, SQL, shell, regular expressions, French/Spanish/German/Italian/Portuguese requests,
             CSV/JSON conversion), used as the "hard content" mix in benchmarks.

Regenerate the committed files with ``.venv/bin/python -m draft_service.prompts``.

This module imports only the standard library.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path
from typing import Callable

__all__ = ["SPLITS", "SIZES", "TRAIN_CATEGORIES", "HARD_CATEGORIES", "build_prompts", "load_prompts",
           "write_prompts", "data_dir", "main"]

SPLITS = ("train", "heldout", "hard")
SIZES = {"train": 7000, "heldout": 400, "hard": 200}
HELDOUT_FRACTION = 0.12    # share of (template, topic) split keys reserved for the heldout split
SYSTEM_FRACTION = 0.10     # share of records that carry an explicit system message


def data_dir() -> Path:
    """``data/prompts`` of the repository that holds this module."""
    return Path(__file__).resolve().parent.parent / "data" / "prompts"


def _stable_int(*parts: object) -> int:
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def _lines(block: str) -> list[str]:
    """Non-empty, stripped lines of a triple-quoted block (lines starting with # are comments)."""
    return [ln.strip() for ln in block.strip().splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _pairs(block: str, sep: str = "|") -> list[tuple[str, ...]]:
    return [tuple(part.strip() for part in ln.split(sep)) for ln in _lines(block)]


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


_CONTEXT_OPENERS = [
    "I've been wondering about this for a while.", "This is for a school project.",
    "I'm preparing a presentation for work.", "My friends and I were debating this last night.",
    "I'm trying to learn something new every day.", "I read something about this online and got curious.",
    "I have an exam coming up next week.", "I want to be able to explain this to my kids.",
    "I'm writing a blog post and could use some help.", "Sorry if this is a basic question.",
    "I'm completely new to this topic.", "English is not my first language, so please keep it simple.",
    "I only have a few minutes, so a quick answer is fine.", "I asked a friend about this and got a confusing answer.",
    "Okay, random question.", "This came up at dinner yesterday and nobody knew.",
]
_CONTEXT_CLOSERS = [
    "Also, is there a good book or video you'd recommend on this?", "Please avoid technical jargon.",
    "If there's a common myth about this, mention it too.", "A short summary at the end would help.",
    "Give me an example I can remember easily.", "Please organize your answer with headings.",
    "I'd appreciate it if you kept it to a couple of paragraphs.", "Feel free to use an analogy.",
    "What's one thing I could do today with this information?", "Be honest if the answer is complicated.",
]


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

NAMES = _lines("""
Maria Liam Aisha Kenji Sofia Mateo Priya Noah Fatima Lucas Chloe Omar Ingrid Diego Mei Kwame Elena Raj Hannah
Tomás Yuki Olivia Ahmed Zara Ethan Amara Lars Nadia Jamal Grace Hiroshi Isabel Felix Leila Samuel Anya Carlos Emma
Tariq Rosa Ben Ines Dmitri Chen Ava Kofi Marta Ravi Julia Arjun Sara Oscar Nora Malik Lena Pedro Aiko Daniel Freya
Hassan Clara Ivan Layla Marcus Zoe Andre Mira Paul Thandiwe Victor Rania Jonas Keiko Luis Esther Femi Greta Ali
Rebecca Sven Wei Lucia Jack Amina Tom Sakura Nikhil Beatriz Oliver Ngozi Mohammed Ellie Kai Ruth Alejandro Farah
""".replace("\n", " ").replace(" ", "\n"))

PERSONAS = _lines("""
I'm a high school teacher
I'm a nurse who works night shifts
I'm a college student studying biology
I'm a stay-at-home dad with two toddlers
I'm a software developer
I'm a retired engineer
I work in retail
I'm a freelance graphic designer
I'm a first-year university student
I'm a small business owner
I run a bakery
I'm a new manager
I'm learning English as a second language
I'm 16 years old
I'm a project manager at a construction company
I work from home full time
I'm a nursing student
I'm a musician
I'm a single mom working two jobs
I'm a PhD student
I'm a personal trainer
I'm a librarian
I'm a truck driver
I'm a chef at a busy restaurant
I'm a volunteer at an animal shelter
I'm an accountant
I just retired
I'm a middle school science teacher
I'm a junior data analyst
I'm an amateur photographer
""")

SYSTEM_GENERIC = _lines("""
You are a helpful assistant.
You are a friendly assistant who explains things clearly and concisely.
Keep your answers brief: no more than three sentences unless asked otherwise.
You are a concise assistant. Avoid unnecessary preamble.
You are a careful assistant. If you are unsure about something, say so.
You are a helpful assistant that ends each answer with a short follow-up question.
You are an assistant that writes in plain English and avoids jargon.
You are SmolLM, a small but helpful AI assistant.
You are a witty assistant. A little humour is welcome, but stay helpful.
Format your answers in Markdown.
You are a helpful assistant. Do not use more than 150 words.
You are a helpful assistant. Use bullet points when listing things.
You are a thoughtful assistant. Think about the user's underlying goal before answering.
""")

_SYS_CODE = _lines("""
You are an expert Python developer. Prefer clean, idiomatic code.
You are a senior software engineer reviewing code. Be direct and specific.
You are a helpful coding assistant. Include brief explanations with any code.
""")
_SYS_TUTOR = _lines("""
You are a patient tutor. Explain step by step and check for understanding.
You help students learn: guide them toward the answer rather than just stating it.
You are a cheerful assistant for kids aged 8 to 12. Use simple words.
""")
_SYS_WRITING = _lines("""
You are a creative writing assistant with a warm, playful voice.
You are a poet who writes vivid, imagistic verse.
You are an encouraging writing coach.
""")
_SYS_WORK = _lines("""
Answer in a professional tone suitable for a workplace.
You are an editor. Preserve the author's meaning while improving clarity.
You are an assistant for small business owners.
You are a customer support assistant for a software company. Be polite and practical.
""")
_SYS_KNOWLEDGE = _lines("""
You are a knowledgeable historian who gives balanced, factual answers.
You are a travel guide with a passion for local culture and food.
You are a librarian who loves recommending books.
You are a science communicator who loves analogies.
""")
_SYS_LIFE = _lines("""
You are a productivity coach who gives practical, actionable advice.
You are a fitness and wellness assistant. You do not give medical diagnoses.
Respond in a calm, supportive tone.
You are a friendly chatbot. Keep the conversation light and positive.
You are an assistant that answers with numbered steps whenever possible.
""")

SYSTEM_SPECIFIC = {
    "chat_advice": _SYS_LIFE, "howto": _SYS_LIFE, "brainstorm": _SYS_LIFE + _SYS_WRITING[:1],
    "compare": _SYS_LIFE[:1] + _SYS_KNOWLEDGE, "science": _SYS_TUTOR + _SYS_KNOWLEDGE[3:],
    "humanities": _SYS_KNOWLEDGE, "trivia": _SYS_KNOWLEDGE + _SYS_TUTOR[2:], "define": _SYS_TUTOR + _SYS_WORK[1:2],
    "code_write": _SYS_CODE, "code_explain": _SYS_CODE + _SYS_TUTOR[1:2], "math": [
        "You are a math tutor. Show your reasoning before giving the final answer."] + _SYS_TUTOR,
    "story": _SYS_WRITING, "poem": _SYS_WRITING, "email": _SYS_WORK, "rewrite": _SYS_WORK[:2] + _SYS_WRITING[2:],
    "summarize": _SYS_WORK[:2], "extract": _SYS_WORK, "followup": _SYS_TUTOR[:1], "roleplay": _SYS_WRITING[:1],
}

AUDIENCES = _lines("""
a five-year-old
a ten-year-old
a high school student
a first-year university student
my grandmother
a complete beginner
someone who has never studied science
a busy executive
a group of middle schoolers
a non-native English speaker
""")

KIDS = _lines("""
daughter
son
niece
nephew
little brother
little sister
grandson
granddaughter
student
""")

MONTHS = _lines("""
January February March April May June July August September October November December
""".replace(" ", "\n"))

WEEKDAYS = _lines("Monday Tuesday Wednesday Thursday Friday Saturday Sunday".replace(" ", "\n"))

CITIES = _lines("""
Lisbon
Nairobi
Kyoto
Montreal
Buenos Aires
Edinburgh
Hanoi
Cape Town
Melbourne
Oslo
Marrakech
Seoul
Vancouver
Prague
Istanbul
Mexico City
Copenhagen
Lima
Singapore
Reykjavik
Dublin
Vienna
Bangkok
Cairo
Krakow
Santiago
Tbilisi
Auckland
Chicago
Barcelona
""")

ANIMALS = _lines("""
octopuses
elephants
penguins
honeybees
crows
dolphins
sloths
axolotls
hummingbirds
wolves
tardigrades
sea otters
giraffes
bats
owls
ants
jellyfish
koalas
chameleons
cats
dogs
horses
squirrels
frogs
sharks
capybaras
flamingos
hedgehogs
whales
butterflies
""")

# ----------------------------------------------------------------------------------------------------------------
# chat_advice: everyday chat, advice and small talk
# ----------------------------------------------------------------------------------------------------------------

SITUATIONS = _lines("""
I can't fall asleep before 2 a.m. even when I'm exhausted
My roommate keeps eating my food without asking
I have a job interview tomorrow and I'm really nervous
I want to start running but I get out of breath after five minutes
My best friend forgot my birthday and I feel hurt
I keep procrastinating on my thesis
I just moved to a new city and don't know anyone
My houseplants keep dying
I spend way too much time on my phone
I want to ask for a raise but don't know how to bring it up
My dog barks at every person who walks past the window
I'm thinking about learning the guitar at 40
I feel overwhelmed by my to-do list
My teenage son barely talks to me anymore
I want to eat healthier but I hate cooking
I have a presentation next week and I get terrible stage fright
My coworker keeps taking credit for my ideas
I'm trying to save money for a trip to Japan
I'm always running late in the mornings
I can't decide whether to adopt a cat or a dog
I want to read more books this year
My neighbor plays loud music late at night
I feel lonely working from home
I'm bored with my workout routine
I'm going on a first date on Friday and I'm nervous
My parents are staying with us for a week and our apartment is tiny
I lent a friend money and they haven't paid it back
I want to switch careers from accounting to graphic design
I keep forgetting people's names right after I meet them
I get headaches when I stare at screens all day
My kids fight constantly over the tablet
I'm hosting Thanksgiving dinner for the first time
I want to learn a new language but I never stick with it
I said something rude to my sister and want to apologize
I'm retiring next month and don't know what to do with all the free time
I'm starting college in the fall and I feel anxious about it
I get distracted easily when I study
Rabbits keep eating the vegetables in my garden
I have to give a toast at my brother's wedding
I drink too much coffee and want to cut back
I have a long flight coming up and I'm scared of flying
My manager only ever gives vague feedback
I want to make new friends as an adult
I always feel tired in the middle of the afternoon
I got rejected from my dream job
My cat keeps scratching the couch
I want to start journaling but don't know what to write
I'm trying to declutter my closet
My landlord won't fix the heating
I can't stop comparing myself to people on social media
I'm moving in with my partner next month
I need to tell my team that our project is going to be late
I want to volunteer but don't know where to start
My car makes a squeaking noise when I brake
I want to get better at small talk
I have two job offers and can't choose between them
I'm learning to cook and I keep burning things
My friend group seems to be drifting apart
I have a big exam in three days and haven't started studying
I want to start waking up earlier
I'm nervous about driving on the highway
My partner and I disagree about how to spend money
I keep buying things online that I don't need
I want to run a half marathon in six months
I'm a new manager and one of my reports is twenty years older than me
My toddler refuses to eat vegetables
I want to make my small apartment feel cozier
I need to say no to extra work without upsetting my boss
I'm feeling burned out at work
I'm planning a surprise party for my mom's 60th birthday
I have too many browser tabs open at all times and it stresses me out
My sourdough bread never rises properly
I want to stop biting my nails
My elderly father refuses to use a smartphone
I get really anxious before phone calls
I keep waking up at 4 a.m. and can't get back to sleep
My group project partners aren't doing their share
I want to write a novel but I never finish anything
I feel awkward at networking events
My puppy cries every night in its crate
I moved back in with my parents and feel a bit stuck
I want to get into birdwatching
My bike chain keeps falling off
I'm the only vegetarian in my family and dinners are tense
I have to share an office with someone who talks on the phone all day
I'm trying to budget on a very tight income
I want to plan a weekend trip but I hate planning
My best friend is moving abroad
I was promoted and now I manage my former teammates
I struggle to drink enough water during the day
I'm learning to swim as an adult and I'm embarrassed
My handwriting is so messy that even I can't read it
I want to get back into drawing after ten years
I get carsick on long drives
""")

CHAT_TEMPLATES = [
    "{S}. Any advice?",
    "{S}. What should I do?",
    "Hi! {S}. Do you have any tips?",
    "{S}, and honestly I'm not sure where to begin. Could you help me think it through?",
    "Quick question: {s}. What would you suggest?",
    "{S}. Can you give me three practical things I could try this week?",
    "I need some advice. {S}. How would you handle it?",
    "{S}. Is this normal, and how can I deal with it?",
    "Hey, {s}. Any ideas?",
    "So {s}... what would you do in my position?",
    "{S}. I've already tried a few things but nothing has worked. What else could I try?",
    "My friend told me to ask an AI about this: {s}. What do you think?",
    "{S}. Please keep your answer short.",
    "{P}. {S}. Any advice for someone in my situation?",
    "Can I get your honest opinion? {S}. How should I handle it?",
    "{S}. What are some small steps I can take to make this better?",
    "What's a good way to handle this? {S}.",
    "{S}. Can you help me make a simple plan?",
    "Okay, confession time: {s}. Be honest, how do I fix this?",
    "{S}. What are the pros and cons of the different ways I could deal with it?",
    "I'm not looking for a lecture, just practical tips. {S}.",
    "{P}, and {s}. Where should I start?",
]

JOKE_TOPICS = _lines("""
programmers
cats
coffee
Mondays
math teachers
dinosaurs
the weather
vegetables
penguins
libraries
astronauts
socks that go missing in the laundry
pirates
bakers
computers
gardening
chess
elevators
""")

DEBATES = _lines("""
pineapple belongs on pizza
it's better to be an early bird than a night owl
cats are better pets than dogs
summer is the best season
people should make their bed every morning
e-books are better than paper books
it's okay to recline your seat on a plane
breakfast is the most important meal of the day
hot dogs count as sandwiches
cereal should be eaten with the milk poured first
working from home is better than working in an office
it's rude to text during dinner
everyone should learn to cook
it's better to have a few close friends than many acquaintances
board games are more fun than video games
""")

BOOKS = _lines("""
Pride and Prejudice
The Hobbit
To Kill a Mockingbird
Dune
The Martian
Little Women
The Hunger Games
Jane Eyre
The Name of the Wind
Project Hail Mary
Anne of Green Gables
The Night Circus
Sapiens
Frankenstein
The Secret Garden
Circe
Treasure Island
The Alchemist
Good Omens
A Wrinkle in Time
""")

INGREDIENTS = _lines("""
eggs
rice
spinach
chickpeas
leftover chicken
a can of tomatoes
potatoes
pasta
cheddar cheese
frozen peas
an onion
bell peppers
tofu
black beans
mushrooms
half a cabbage
tortillas
ground beef
carrots
lentils
a lemon
zucchini
canned tuna
sweet potatoes
""")

SMALL_TALK = [
    ("greet", "Hi! How's your day going?"),
    ("greet", "Hello there. What can you help me with?"),
    ("greet", "Good evening! I just wanted to chat for a bit. How are you?"),
    ("joke", "Tell me a joke about {joke}."),
    ("joke", "Do you know any good jokes about {joke}? I need a laugh."),
    ("joke", "Make up a pun about {joke}."),
    ("fact", "What's a fun fact about {animal}?"),
    ("fact", "Tell me something surprising about {animal} that most people don't know."),
    ("book", "Can you recommend a book for someone who loved {book}?"),
    ("book", "I just finished {book} and I'm sad it's over. What should I read next?"),
    ("cook", "What could I cook for dinner tonight? I have {i1}, {i2} and {i3}."),
    ("cook", "I only have {i1} and {i2} in the fridge. Any quick meal ideas?"),
    ("cook", "Help! Guests are coming in an hour and all I have is {i1}, {i2}, {i3} and some spices."),
    ("bored", "I'm bored. Suggest something fun to do on a rainy {day}."),
    ("bored", "It's a sunny {day} afternoon and I have nothing planned. Ideas?"),
    ("debate", "Do you think {debate}?"),
    ("debate", "My friend and I are arguing about whether {debate}. Who's right?"),
    ("debate", "Settle this once and for all: {debate}, yes or no?"),
    ("cheer", "I had a rough day. Can you say something to cheer me up?"),
    ("cheer", "Give me a short motivational message to start my {day} morning."),
    ("pet", "Can you help me pick a name for my new {pet}? It's {petdesc}."),
    ("travel", "If you could spend a week in {city}, what would you do?"),
    ("travel", "I have one free day in {city}. How should I spend it?"),
    ("movie", "What's a good movie to watch with {company} on a {day} night?"),
    ("would", "Would you rather be able to fly or be invisible? Explain your choice."),
    ("would", "Ask me three fun 'would you rather' questions."),
    ("would", "Let's play a word game. You give me a word and I'll give you a word that rhymes with it."),
]

PETS = _lines("""
kitten
puppy
goldfish
hamster
rabbit
parrot
tortoise
guinea pig
""")

PET_DESCS = _lines("""
tiny and very energetic
black with white paws
orange and extremely lazy
fluffy and a bit grumpy
spotted and always hungry
grey and very shy
""")

COMPANY = _lines("""
my parents
my kids
my roommates
a group of friends
my partner
my grandparents
""")


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

SCIENCE_TOPICS = _pairs("""
photosynthesis | biology
the water cycle | earth science
plate tectonics | geology
the greenhouse effect | climate science
black holes | astronomy
DNA replication | biology
natural selection | biology
the immune system | biology
vaccination | biology
antibiotic resistance | biology
quantum entanglement | physics
the Doppler effect | physics
nuclear fusion | physics
nuclear fission | physics
special relativity | physics
entropy | physics
electromagnetic induction | physics
static electricity | physics
magnetism | physics
ocean tides | earth science
the changing seasons | earth science
lunar eclipses | astronomy
volcanic eruptions | geology
earthquakes | geology
hurricane formation | earth science
lightning | physics
the ozone layer | chemistry
ocean currents | earth science
the carbon cycle | earth science
the nitrogen cycle | biology
cellular respiration | biology
mitosis | biology
meiosis | biology
enzymes | biochemistry
hormones | biology
nerve signaling | neuroscience
memory formation | neuroscience
sleep cycles | neuroscience
circadian rhythms | biology
viral replication | biology
gut bacteria | biology
the pH scale | chemistry
chemical bonds | chemistry
oxidation and reduction | chemistry
catalysts | chemistry
the periodic table | chemistry
isotopes | chemistry
radioactive decay | physics
Newton's laws of motion | physics
friction | physics
buoyancy | physics
air pressure | physics
sound waves | physics
the speed of light | physics
refraction | physics
optical lenses | physics
the Big Bang | astronomy
star formation | astronomy
supernovas | astronomy
exoplanets | astronomy
the life cycle of a star | astronomy
dark matter | astronomy
gravitational waves | physics
the Milky Way | astronomy
orbital mechanics | physics
semiconductors | physics
superconductivity | physics
lithium-ion batteries | chemistry
solar panels | physics
wind turbines | engineering
the circulatory system | biology
the respiratory system | biology
the digestive system | biology
muscle growth | biology
allergies | biology
the placebo effect | medicine
genetic mutations | biology
CRISPR gene editing | biology
stem cells | biology
the evolution of whales | biology
coral reefs | ecology
food webs | ecology
pollination | ecology
keystone species | ecology
ocean acidification | chemistry
erosion | geology
fossilization | geology
the rock cycle | geology
glaciers | geology
rainbows | physics
auroras | physics
Rayleigh scattering | physics
thermal expansion | physics
heat conduction | physics
phase changes of water | chemistry
surface tension | physics
osmosis | biology
diffusion | chemistry
the scientific method | general science
Punnett squares | biology
dominant and recessive genes | biology
bird migration | biology
echolocation in bats | biology
bioluminescence | biology
phototropism | biology
nitrogen fixation | biology
antibiotics | medicine
blood types | biology
color vision | biology
the human ear | biology
the Coriolis effect | earth science
El Niño | climate science
the jet stream | earth science
cloud formation | earth science
acid rain | chemistry
soap and surfactants | chemistry
fermentation | chemistry
the Maillard reaction in cooking | chemistry
microwave ovens | physics
GPS | engineering
internet routing | computer science
binary numbers | computer science
machine learning | computer science
encryption | computer science
""")

WHY_QUESTIONS = _lines("""
Why is the sky blue?
Why do cats purr?
Why does ice float on water?
Why do we yawn?
Why do leaves change color in the fall?
Why is the ocean salty?
Why do onions make you cry?
How do airplanes stay in the air?
How do bees make honey?
Why do we have fingerprints?
Why does the moon look bigger near the horizon?
Why do our fingers wrinkle in the bath?
How do fish breathe underwater?
Why does metal feel colder than wood at the same temperature?
Why do we get goosebumps?
How do chameleons change color?
Why can't we see stars during the day?
Why does bread go stale?
How does a refrigerator keep food cold?
Why do boats float even though they're made of steel?
Why do we dream?
Why does popcorn pop?
How do birds know where to fly in winter?
Why is Mars red?
Why do some people need glasses?
How do plants know which way is up?
Why does hot air rise?
Why do our ears pop on airplanes?
How does a compass work?
Why do stars twinkle?
Why does the same side of the moon always face Earth?
How do noise-cancelling headphones work?
Why do we get brain freeze from cold food?
Why does salt melt ice on roads?
How do spiders make silk?
Why is it colder at the top of a mountain even though it's closer to the sun?
Why do cuts eventually stop bleeding?
How do fireflies glow?
Why does a spoon look bent in a glass of water?
How does soap kill germs?
Why do tomatoes ripen faster in a paper bag?
Why do we have leap years?
How do vaccines work?
Why do apples turn brown after you cut them?
Why does thunder come after lightning?
How do geckos climb walls?
Why do we sneeze?
Why is glass transparent?
How can a plane fly upside down?
Why do kettles make noise before the water boils?
How do camels survive so long without water?
Why do some animals hibernate?
Why do we feel dizzy after spinning around?
How do touchscreens know where my finger is?
Why does the ocean look blue but water in a glass looks clear?
Why do cats always land on their feet?
How do solar panels turn sunlight into electricity?
Why is carbon dioxide a greenhouse gas but oxygen isn't?
""")

SCIENCE_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Can you explain {t} to {aud}?",
    "What is {t}, and why does it matter?",
    "I'm studying for {asubj} test. Can you give me a clear summary of {t}?",
    "Give me a short explanation of {t} using an everyday analogy.",
    "What are the most common misconceptions about {t}?",
    "Explain {t} in three short paragraphs: what it is, how it works, and a real example.",
    "My {kid} asked me about {t} and I didn't know what to say. How would you explain it?",
    "{T}: explain it like I'm five.",
    "Write a short paragraph about {t} for a school newsletter.",
    "What's the connection between {t} and {t2}?",
    "Is there a simple experiment I could do at home to understand {t} better?",
    "Break down {t} step by step.",
    "In one or two sentences, what is {t}?",
    "Why do scientists care so much about {t}?",
    "I've never really understood {t}. Could you walk me through it slowly?",
    "What is {t}? Please include one real-world example.",
    "How would {asubj} professor explain {t} to first-year students?",
    "Give me five key facts about {t} that would help me on a quiz.",
    "What questions are scientists still trying to answer about {t}?",
    "{P}. Could you explain {t} without using any jargon?",
    "Write a short dialogue between a curious kid and a scientist about {t}.",
    "Create three multiple-choice quiz questions about {t}, with the answers at the end.",
    "Compare {t} and {t2}. How are they similar, and how are they different?",
]

WHY_TEMPLATES = [
    "{q}",
    "{q} Keep it short.",
    "Quick science question: {q}",
    "{q} My {kid} asked me this and I had no idea.",
    "{q} Explain it like I'm ten.",
    "I've always wondered: {lq}",
    "{q} Please give the scientific explanation, not just the simple version.",
    "Random question, but {lq}",
    "{q} Answer in under 100 words.",
    "Here's something I've never understood. {q}",
]


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

HIST_EVENTS = _lines("""
the French Revolution
the fall of the Western Roman Empire
the Industrial Revolution
the Renaissance
the Black Death
the American Civil War
the construction of the Great Wall of China
the Apollo 11 moon landing
the fall of the Berlin Wall
the Meiji Restoration in Japan
the signing of the Magna Carta
the Protestant Reformation
the voyages of Zheng He
the Silk Road trade network
the Cuban Missile Crisis
the printing press revolution
the abolition of slavery in the British Empire
the Partition of India
the Great Depression
the Scientific Revolution
the rise of the Mongol Empire
the Norman conquest of England
the Haitian Revolution
the Aztec capital of Tenochtitlan
the building of the pyramids of Giza
the Spanish flu pandemic of 1918
the women's suffrage movement
the civil rights movement in the United States
the end of apartheid in South Africa
the Congress of Vienna
the Russian Revolution of 1917
the unification of Germany
the Columbian Exchange
the Bronze Age collapse
the Viking expansion
the Ottoman conquest of Constantinople
the Irish Potato Famine
the Dust Bowl
the invention of writing in Mesopotamia
the reign of Mansa Musa of Mali
the Space Race
the first Olympic Games in ancient Greece
the Gold Rush in California
the decolonization of Africa
the Hundred Years' War
the Inca road system
the Enlightenment
the Battle of Hastings
the creation of the United Nations
the Suez Crisis
""")

HIST_FIGURES = _lines("""
Ada Lovelace
Genghis Khan
Cleopatra
Leonardo da Vinci
Marie Curie
Nelson Mandela
Mahatma Gandhi
Frida Kahlo
Napoleon Bonaparte
Harriet Tubman
Confucius
Galileo Galilei
Queen Elizabeth I
Ibn Battuta
Hypatia of Alexandria
Nikola Tesla
Simón Bolívar
Wangari Maathai
Charles Darwin
Murasaki Shikibu
Alexander the Great
Florence Nightingale
Johannes Gutenberg
Emperor Ashoka
Rosa Parks
Isaac Newton
Catherine the Great
Frederick Douglass
Julius Caesar
Alan Turing
Joan of Arc
Sojourner Truth
Mary Seacole
Ludwig van Beethoven
William Shakespeare
Amelia Earhart
Hatshepsut
Akbar the Great
Grace Hopper
Louis Pasteur
Sitting Bull
Jane Austen
Rumi
Mansa Musa
Kublai Khan
Emmeline Pankhurst
Benjamin Franklin
Queen Victoria
Ibn Sina
Zheng He
""")

PLACES = _lines("""
Japan
Peru
Morocco
Iceland
Vietnam
Kenya
Portugal
New Zealand
Mexico
Egypt
Norway
India
Argentina
Ghana
Greece
Indonesia
Scotland
Chile
Turkey
Ethiopia
Canada
South Korea
Poland
Brazil
the Philippines
Georgia (the country)
Cuba
Nepal
Ireland
Tanzania
Sri Lanka
Colombia
Finland
Jordan
Madagascar
Mongolia
Switzerland
Senegal
Thailand
Australia
the Amazon rainforest
the Sahara Desert
the Himalayas
the Mediterranean
Siberia
Patagonia
the Caribbean
the Balkans
Scandinavia
the Andes
""")

_REGIONS = set(PLACES[PLACES.index("the Amazon rainforest"):])
_COUNTRY_ONLY_TEMPLATES = {4, 8, 11}   # languages, economy, role in world history

LANDMARKS = _lines("""
the Great Wall of China
Machu Picchu
the Taj Mahal
Stonehenge
the Colosseum
Angkor Wat
Petra
the Eiffel Tower
the Alhambra
Chichen Itza
the Acropolis
the Statue of Liberty
Great Zimbabwe
the Forbidden City
the Hagia Sophia
Easter Island's moai statues
the Parthenon
Mont-Saint-Michel
Borobudur
the Sydney Opera House
""")

CULTURE_ITEMS = _pairs("""
Diwali | festival
the Day of the Dead | festival
Lunar New Year | festival
Carnival in Rio de Janeiro | festival
Hanukkah | festival
Eid al-Fitr | festival
Holi | festival
Oktoberfest | festival
Thanksgiving | festival
the Japanese tea ceremony | tradition
Midsummer in Sweden | festival
Nowruz | festival
the Mid-Autumn Festival | festival
Impressionism | art movement
Cubism | art movement
the Harlem Renaissance | art movement
Romanticism | art movement
Surrealism | art movement
Art Deco | art movement
Baroque music | art movement
jazz | music genre
flamenco | music genre
reggae | music genre
K-pop | music genre
the blues | music genre
hip-hop | music genre
opera | music genre
haiku poetry | literary tradition
Greek tragedy | literary tradition
magical realism | literary tradition
the epic of Gilgamesh | literary tradition
Norse mythology | mythology
Greek mythology | mythology
Egyptian mythology | mythology
Hindu epics like the Ramayana | literary tradition
West African griot storytelling | tradition
sumo wrestling | tradition
the siesta | tradition
afternoon tea in Britain | tradition
origami | tradition
""")

EVENT_TEMPLATES = [
    "What caused {e}?",
    "Give me a short overview of {e}.",
    "What were the main consequences of {e}?",
    "Explain {e} as if you were a history teacher talking to a class of 14-year-olds.",
    "Why is {e} considered so important?",
    "Summarize {e} in five bullet points.",
    "What was daily life like for ordinary people during {e}?",
    "Who were the key people involved in {e}?",
    "I'm writing an essay about {e}. What are three arguments I could make about its significance?",
    "Can you make a simple timeline of {e}?",
    "How do historians disagree about {e}?",
    "What's one thing most people get wrong about {e}?",
    "How might the world be different if {e} had never happened?",
    "Tell me about {e} in under 150 words.",
]

FIGURE_TEMPLATES = [
    "Who was {f}?",
    "What is {f} best known for?",
    "Write a short biography of {f}.",
    "What can we learn today from the life of {f}?",
    "Tell me three interesting facts about {f}.",
    "Why is {f} still remembered today?",
    "If {f} could see the world today, what do you think would surprise them most?",
    "Give me a quick profile of {f}: when they lived, where, and what they did.",
    "My {kid} has a school project on {f}. Can you explain who they were in kid-friendly language?",
    "What challenges did {f} face during their life?",
    "Write an imaginary interview with {f} with five questions and answers.",
]

PLACE_TEMPLATES = [
    "What is {p} known for?",
    "Tell me about the history of {p}.",
    "I'm visiting {p} in {m}. What should I know about the local customs?",
    "What is the geography of {p} like?",
    "What languages are spoken in {p}?",
    "What are some traditional dishes from {p}?",
    "Give me a brief cultural overview of {p} for a traveler.",
    "What's the climate like in {p}, and when is the best time to visit?",
    "How has the economy of {p} changed over the last century?",
    "What are some common misconceptions people have about {p}?",
    "Describe {p} in three sentences.",
    "What role has {p} played in world history?",
]

LANDMARK_TEMPLATES = [
    "Why was {l} built?",
    "What is the history behind {l}?",
    "How old is {l}, and who built it?",
    "I'm going to see {l} next year. What should I know before I go?",
    "What are some lesser-known facts about {l}?",
    "Explain why {l} is considered an important cultural site.",
]

CULTURE_TEMPLATES = {
    "festival": ["What is {c}, and how is it celebrated?", "What are the origins of {c}?",
                 "I've been invited to celebrate {c} with a friend's family. What should I expect?",
                 "Describe the traditional foods and customs of {c}."],
    "tradition": ["What is the meaning behind {c}?", "Can you explain the history of {c}?",
                  "How has {c} changed over time?", "What should a newcomer know about {c}?"],
    "art movement": ["What are the main characteristics of {c}?", "Who were the most important figures of {c}?",
                     "How did {c} influence later art?", "Explain {c} to someone visiting a museum for the first time."],
    "music genre": ["Where did {c} come from?", "What makes {c} sound the way it does?",
                    "Recommend a way to get into {c} if I've never listened to it.",
                    "How did {c} spread around the world?"],
    "literary tradition": ["What is {c}, and why is it still read today?", "What are the key features of {c}?",
                           "Give me a beginner's guide to {c}."],
    "mythology": ["Who are the most important gods in {c}?", "Tell me a famous story from {c}.",
                  "How did {c} explain the creation of the world?", "What are some common themes in {c}?"],
}


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

FUNC_TASKS = _pairs("""
count_vowels | text: str | returns the number of vowels in a string
is_palindrome | s: str | checks whether a string reads the same forwards and backwards, ignoring case and spaces
reverse_words | sentence: str | reverses the order of the words in a sentence
fizzbuzz | n: int | returns a list of the FizzBuzz values from 1 to n
flatten | nested: list | flattens an arbitrarily nested list into a single list
merge_sorted | a: list[int], b: list[int] | merges two sorted lists into one sorted list
chunk | items: list, size: int | splits a list into chunks of a given size
word_frequencies | text: str | counts how often each word appears in a text, ignoring case and punctuation
is_prime | n: int | checks whether a number is prime
primes_up_to | limit: int | returns all prime numbers up to a limit using the Sieve of Eratosthenes
fibonacci | n: int | returns the first n Fibonacci numbers
celsius_to_fahrenheit | celsius: float | converts a temperature from Celsius to Fahrenheit
second_largest | numbers: list[int] | finds the second largest distinct number in a list
remove_duplicates | items: list | removes duplicates from a list while keeping the original order
is_anagram | a: str, b: str | checks whether two strings are anagrams of each other
caesar_cipher | text: str, shift: int | encrypts text with a Caesar cipher
validate_email | address: str | does a basic check that a string looks like an email address
gcd | a: int, b: int | computes the greatest common divisor of two integers
lcm | a: int, b: int | computes the least common multiple of two integers
binary_search | sorted_list: list[int], target: int | returns the index of a target in a sorted list, or -1 if it is missing
rotate_list | items: list, k: int | rotates a list to the right by k positions
capitalize_words | text: str | capitalizes the first letter of every word
count_words | path: str | counts the words in a text file
running_average | values: list[float] | returns the running average after each element
median | values: list[float] | returns the median of a list of numbers
mode | values: list | returns the most common element of a list
transpose | matrix: list[list[int]] | transposes a matrix given as a list of lists
matrix_multiply | a: list[list[float]], b: list[list[float]] | multiplies two matrices
roman_to_int | numeral: str | converts a Roman numeral to an integer
int_to_roman | number: int | converts an integer between 1 and 3999 to a Roman numeral
compress_string | s: str | compresses a string using counts of repeated characters, so aaabb becomes a3b2
balanced_brackets | s: str | checks whether the brackets in a string are balanced
group_by_length | words: list[str] | groups words into a dictionary keyed by word length
invert_dict | mapping: dict | swaps the keys and values of a dictionary
deep_merge | a: dict, b: dict | recursively merges two nested dictionaries
parse_duration | text: str | parses a duration like '1h30m' or '45s' into a number of seconds
format_bytes | size: int | formats a number of bytes as a human-readable string like '3.2 MB'
slugify | title: str | turns a title into a URL-friendly slug
days_between | start: str, end: str | returns the number of days between two dates given as YYYY-MM-DD strings
is_leap_year | year: int | checks whether a year is a leap year
digital_root | n: int | repeatedly sums the digits of a number until a single digit remains
sum_of_digits | n: int | returns the sum of the digits of an integer
factorial | n: int | computes the factorial of a non-negative integer
power_set | items: list | returns all subsets of a list
permutations_of | s: str | returns all permutations of a string
longest_common_prefix | words: list[str] | finds the longest common prefix of a list of strings
longest_word | sentence: str | returns the longest word in a sentence
pig_latin | word: str | translates a word into Pig Latin
title_case | text: str | converts text to title case but keeps small words like 'and' and 'of' lowercase
count_islands | grid: list[list[int]] | counts the islands of 1s in a grid of 0s and 1s
two_sum | nums: list[int], target: int | returns the indices of two numbers that add up to a target
max_subarray | nums: list[int] | returns the largest sum of any contiguous subarray
moving_window_max | nums: list[int], k: int | returns the maximum of each window of size k
dedupe_emails | emails: list[str] | removes duplicate email addresses, treating upper and lower case as the same
mask_card_number | number: str | masks all but the last four digits of a credit card number
bmi | weight_kg: float, height_m: float | calculates body mass index and returns it rounded to one decimal
compound_interest | principal: float, rate: float, years: int | computes the final balance with yearly compound interest
loan_payment | principal: float, annual_rate: float, months: int | calculates the fixed monthly payment of a loan
shuffle_deck | seed: int | returns a shuffled 52-card deck as a list of strings
roll_dice | n: int, sides: int | simulates rolling n dice and returns the total
password_strength | password: str | rates a password as weak, medium or strong
generate_password | length: int | generates a random password with letters, digits and symbols
count_lines | path: str | counts the non-empty lines in a file
read_csv_column | path: str, column: str | reads one column of a CSV file into a list
top_n | counts: dict[str, int], n: int | returns the n keys with the highest counts
histogram | values: list[int] | prints a text histogram of a list of numbers using asterisks
pascal_triangle | rows: int | returns the first rows of Pascal's triangle
spiral_order | matrix: list[list[int]] | returns the elements of a matrix in spiral order
is_valid_sudoku | board: list[list[str]] | checks whether a partially filled Sudoku board is valid
rle_decode | encoded: str | decodes a run-length encoded string like '3a2b'
camel_to_snake | name: str | converts a camelCase name to snake_case
snake_to_camel | name: str | converts a snake_case name to camelCase
hex_to_rgb | color: str | converts a hex color like '#ff8800' into an RGB tuple
clamp | value: float, low: float, high: float | clamps a value to a range
interleave | a: list, b: list | interleaves two lists, appending leftovers at the end
pairwise_differences | nums: list[int] | returns the differences between consecutive numbers
find_missing_number | nums: list[int] | finds the one missing number in a list containing 0 to n
count_substrings | text: str, sub: str | counts overlapping occurrences of a substring
most_common_letter | text: str | finds the most common letter in a text, ignoring case
vowel_positions | word: str | returns the positions of all vowels in a word
temperature_stats | readings: list[float] | returns the minimum, maximum and average of a list of temperature readings
grade_letter | score: int | converts a numeric score from 0 to 100 into a letter grade
parse_query_string | url: str | parses the query string of a URL into a dictionary
word_wrap | text: str, width: int | wraps text so that no line is longer than a given width
truncate | text: str, limit: int | shortens text to a character limit and adds an ellipsis if it was cut
normalize_whitespace | text: str | collapses runs of spaces, tabs and newlines into single spaces
unique_characters | s: str | checks whether all characters in a string are unique
kth_smallest | nums: list[int], k: int | returns the k-th smallest element of a list
distance | p: tuple[float, float], q: tuple[float, float] | computes the Euclidean distance between two points
triangle_area | a: float, b: float, c: float | computes the area of a triangle from its side lengths
time_to_minutes | clock: str | converts a time like '14:35' into minutes after midnight
add_business_days | start: str, days: int | adds a number of business days to a date, skipping weekends
age_in_years | birthdate: str | calculates someone's age in years from a birthdate string
sort_by_key | records: list[dict], key: str | sorts a list of dictionaries by a given key
filter_adults | people: list[dict] | returns the people whose 'age' field is 18 or more
sum_nested | data: dict | adds up all the numbers anywhere inside a nested dictionary
cache_fib | n: int | computes Fibonacci numbers with memoization
retry | func, attempts: int | calls a function and retries it up to a number of times if it raises an exception
timeit_decorator | func | is a decorator that prints how long the wrapped function took
is_power_of_two | n: int | checks whether a number is a power of two using bit operations
count_bits | n: int | counts the 1 bits in the binary representation of an integer
to_binary | n: int | converts a non-negative integer to its binary representation without using bin()
levenshtein | a: str, b: str | computes the edit distance between two strings
""")

CLASS_TASKS = _pairs("""
BankAccount | a bank account with deposit, withdraw and balance methods, where withdrawing more than the balance raises an error
Stack | a stack with push, pop, peek and is_empty methods
Queue | a first-in, first-out queue built on two stacks
TodoList | a to-do list where tasks can be added, completed, removed and listed
Rectangle | a rectangle with width and height, and methods for area, perimeter and scaling
Temperature | a temperature that can be read and set in Celsius, Fahrenheit or Kelvin
Inventory | a shop inventory that tracks item quantities and warns when stock is low
LRUCache | a least-recently-used cache with a fixed capacity
Matrix | a matrix that supports addition, multiplication and printing
Library | a library where books can be checked out and returned
ShoppingCart | a shopping cart that can add items, remove items and compute the total with an optional discount code
Timer | a context manager that measures how long a block of code takes
Counter | a counter of hashable items with an add method and a most_common method
Vector2D | a 2D vector with addition, subtraction, scaling and length
Student | a student with a name and a list of grades, plus a method for the average grade
ParkingLot | a parking lot with a fixed number of spaces for cars and motorcycles
Playlist | a music playlist that can shuffle, skip and repeat songs
RateLimiter | a rate limiter that allows at most N calls per second
Fraction | a fraction type that keeps itself in lowest terms and supports +, -, * and /
LinkedList | a singly linked list with append, prepend, delete and iteration
Deck | a deck of playing cards that can shuffle and deal hands
Thermostat | a thermostat with a target temperature and heating and cooling modes
EventEmitter | a simple event emitter where callbacks can subscribe to named events
Polynomial | a polynomial that can be evaluated, added and differentiated
Board | a tic-tac-toe board that knows whether someone has won
""")

SCRIPT_TASKS = _lines("""
reads a CSV file of expenses and prints the total spent in each category
renames every .jpg file in a folder to include the date it was taken
asks the user for a number and prints its multiplication table
plays a number-guessing game in the terminal
counts how many times each word appears in a text file and prints the top ten
checks a list of URLs and reports which ones return an error
finds duplicate files in a folder by comparing their hashes
converts a folder of Markdown files into one HTML page
prints a simple calendar for the current month
backs up a folder into a zip file with today's date in the name
simulates rolling two dice 10,000 times and prints how often each total appears
generates a random meal plan for the week from a list of recipes
tracks daily water intake and saves it to a JSON file
reads a log file and counts the number of ERROR and WARNING lines
implements a command-line to-do list that saves tasks to a file
draws a simple bar chart of monthly sales with matplotlib
merges several CSV files with the same columns into one
converts temperatures in a CSV column from Fahrenheit to Celsius
sorts the files in my Downloads folder into subfolders by file type
quizzes me on vocabulary words stored in a dictionary
prints the current weather description from a hard-coded sample response
splits a large text file into smaller files of 1,000 lines each
reads student scores from a file and prints the class average, highest and lowest score
plays rock, paper, scissors against the computer
monitors a folder and prints a message when a new file appears
""")

FUNC_TEMPLATES = [
    "Write a Python function `{name}({args})` that {desc}.",
    "Write a Python function called {name} that {desc}.",
    "Can you write a function that {desc}? Python, please.",
    "I need a Python function that {desc}. Please include a docstring and a few example calls.",
    "Implement `{name}` in Python. It should {base}.",
    "Write Python code to {base}.",
    "How would I write a function in Python that {desc}?",
    "Please write a {adj} Python function that {desc}.",
    "python function that {desc}",
    "Write `{name}({args})` in Python: it {desc}. Make sure it handles empty or unusual input sensibly.",
    "I'm learning Python. Could you show me how to write a function that {desc}, and explain each step?",
    "Write a function that {desc}, and then write three pytest tests for it.",
    "Give me a short Python solution that {desc}, then explain how it works in two or three sentences.",
    "Coding interview practice: write a function that {desc}. What's the time complexity of your solution?",
    "My assignment asks me to write a function named {name} that {desc}. Can you help me get started without just handing me the full answer?",
    "Write a JavaScript function `{camel}` that {desc}.",
    "In JavaScript, how can I write a function that {desc}?",
    "Could you write a function in Python that {desc}? I'd like it to be {adj}.",
    "Show me two different ways to write a Python function that {desc}, and tell me which one you prefer.",
    "Write a function with the signature `def {name}({args}):` that {desc}. Add type hints and comments.",
]

FUNC_SUFFIXES = ["", "", "", "", " Use type hints.", " Don't use any imports.", " Add comments.",
                 " Keep it under 15 lines.", " Include a docstring.", " Explain the time complexity too.",
                 " Please add a couple of example calls."]

FUNC_ADJS = ["short", "clean", "well-documented", "efficient", "readable", "beginner-friendly", "simple",
             "robust", "fast"]

CLASS_TEMPLATES = [
    "Write a Python class `{cls}` for {desc}.",
    "Create a {cls} class in Python: {desc}.",
    "Can you design a simple Python class for {desc}? Include an example of how to use it.",
    "I need a class that implements {desc}. Please write it in Python with docstrings.",
    "Write a Python dataclass or regular class (your choice) for {desc}, and explain why you chose that.",
    "Show me an object-oriented Python implementation of {desc}.",
    "Write a JavaScript class `{cls}` for {desc}.",
    "Implement {desc} as a Python class named {cls}, with a few unit tests.",
]

SCRIPT_TEMPLATES = [
    "Write a Python script that {desc}.",
    "I want a small Python program that {desc}. Could you write it?",
    "Can you help me automate something? I need a script that {desc}.",
    "Write a beginner-friendly Python script that {desc}, with comments explaining each part.",
    "{P}. I'd like a Python script that {desc}. Can you write one and tell me how to run it?",
    "Please write a short program in Python that {desc}.",
    "How would I write a Python script that {desc}? Only use the standard library if possible.",
]


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
# Placeholders @F@, @X@, @Y@, @N@ in a snippet are replaced by one of its listed identifier choices.
# ----------------------------------------------------------------------------------------------------------------

_F_SUM = ["total", "sum_list", "add_all", "compute_total", "get_sum"]
_F_AVG = ["average", "mean", "avg", "compute_average"]
_X_LIST = ["numbers", "nums", "values", "items", "data", "scores", "prices"]

SNIPPETS: list[dict] = [
    dict(lang="python", purpose="add up all the numbers in a list", bug="the loop starts at index 1, so the first element is skipped",
         code="""
def @F@(@X@):
    result = 0
    for i in range(1, len(@X@)):
        result += @X@[i]
    return result
""", names={"@F@": _F_SUM, "@X@": _X_LIST}),
    dict(lang="python", purpose="compute the average of a list", error="ZeroDivisionError: division by zero",
         code="""
def @F@(@X@):
    return sum(@X@) / len(@X@)

print(@F@([]))
""", names={"@F@": _F_AVG, "@X@": _X_LIST}),
    dict(lang="python", purpose="append an item to a list that starts out empty on every call",
         bug="the default list is created once and shared between calls",
         code="""
def @F@(item, bucket=[]):
    bucket.append(item)
    return bucket

print(@F@("a"))
print(@F@("b"))
""", names={"@F@": ["add_item", "collect", "append_to", "remember"]}),
    dict(lang="python", purpose="count how many times each word appears",
         code="""
from collections import Counter

def @F@(text):
    words = text.lower().split()
    return Counter(words).most_common(3)
""", names={"@F@": ["top_words", "common_words", "word_stats"]}),
    dict(lang="python", purpose="read numbers from a file and return their total", error="ValueError: invalid literal for int() with base 10: '\\n'",
         code="""
def @F@(path):
    total = 0
    with open(path) as f:
        for line in f:
            total += int(line)
    return total
""", names={"@F@": ["sum_file", "file_total", "read_total"]}),
    dict(lang="python", purpose="remove the even numbers from a list", bug="the list is modified while it is being iterated over, so some elements are skipped",
         code="""
def @F@(@X@):
    for n in @X@:
        if n % 2 == 0:
            @X@.remove(n)
    return @X@

print(@F@([2, 4, 5, 6, 8]))
""", names={"@F@": ["remove_evens", "drop_even", "odds_only"], "@X@": _X_LIST}),
    dict(lang="python", purpose="return a squared copy of each number",
         code="""
@X@ = [3, 1, 4, 1, 5, 9]
squares = [n ** 2 for n in @X@ if n > 2]
print(squares)
""", names={"@X@": _X_LIST}),
    dict(lang="python", purpose="check whether a number is prime", bug="it reports 1 as prime and checks far more divisors than it needs to",
         code="""
def @F@(n):
    for d in range(2, n):
        if n % d == 0:
            return False
    return True
""", names={"@F@": ["is_prime", "prime", "check_prime"]}),
    dict(lang="python", purpose="compute a factorial recursively", error="RecursionError: maximum recursion depth exceeded",
         code="""
def @F@(n):
    return n * @F@(n - 1)

print(@F@(5))
""", names={"@F@": ["factorial", "fact"]}),
    dict(lang="python", purpose="compare two floating point numbers", bug="floating point rounding makes 0.1 + 0.2 slightly different from 0.3",
         code="""
a = 0.1 + 0.2
if a == 0.3:
    print("equal")
else:
    print("not equal")
""", names={}),
    dict(lang="python", purpose="look up a user's email in a dictionary", error="KeyError: 'carol'",
         code="""
emails = {"alice": "alice@example.com", "bob": "bob@example.com"}

def @F@(name):
    return emails[name]

print(@F@("carol"))
""", names={"@F@": ["get_email", "lookup", "email_for"]}),
    dict(lang="python", purpose="print a greeting with a person's age", error="TypeError: can only concatenate str (not \"int\") to str",
         code="""
name = "Sam"
age = 30
print("Hello " + name + ", you are " + age + " years old")
""", names={}),
    dict(lang="python", purpose="build a dictionary of word lengths",
         code="""
words = ["apple", "kiwi", "banana", "fig"]
lengths = {w: len(w) for w in words}
longest = max(lengths, key=lengths.get)
print(lengths, longest)
""", names={}),
    dict(lang="python", purpose="memoize an expensive function",
         code="""
from functools import lru_cache

@lru_cache(maxsize=None)
def @F@(n):
    if n < 2:
        return n
    return @F@(n - 1) + @F@(n - 2)
""", names={"@F@": ["fib", "fibonacci"]}),
    dict(lang="python", purpose="copy a grid and change one cell", bug="the rows are the same list object repeated three times, so changing one row changes all of them",
         code="""
grid = [[0] * 3] * 3
grid[0][0] = 1
print(grid)
""", names={}),
    dict(lang="python", purpose="return the maximum value in a list", bug="starting from 0 gives the wrong answer when every number is negative",
         code="""
def @F@(@X@):
    best = 0
    for v in @X@:
        if v > best:
            best = v
    return best
""", names={"@F@": ["find_max", "largest", "biggest"], "@X@": _X_LIST}),
    dict(lang="python", purpose="collect callbacks that print their index", bug="every lambda captures the same variable i, so they all print the last value",
         code="""
callbacks = []
for i in range(3):
    callbacks.append(lambda: print(i))

for cb in callbacks:
    cb()
""", names={}),
    dict(lang="python", purpose="process items with a generator",
         code="""
def @F@(path):
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                yield line
""", names={"@F@": ["read_config", "clean_lines", "iter_lines"]}),
    dict(lang="python", purpose="run a function on many inputs in parallel",
         code="""
from concurrent.futures import ThreadPoolExecutor

def @F@(urls, fetch):
    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(fetch, urls))
""", names={"@F@": ["fetch_all", "download_all", "parallel_fetch"]}),
    dict(lang="python", purpose="define a point class",
         code="""
from dataclasses import dataclass

@dataclass(frozen=True)
class Point:
    x: float
    y: float

    def distance_to(self, other: "Point") -> float:
        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5
""", names={}),
    dict(lang="python", purpose="check if a string is a palindrome", bug="it compares case-sensitively, so 'Racecar' is not detected",
         code="""
def @F@(s):
    return s == s[::-1]

print(@F@("Racecar"))
""", names={"@F@": ["is_palindrome", "palindrome"]}),
    dict(lang="python", purpose="count down from a number", bug="the counter is never decremented, so the loop never ends",
         code="""
def @F@(n):
    while n > 0:
        print(n)
    print("Liftoff!")
""", names={"@F@": ["countdown", "launch"]}),
    dict(lang="python", purpose="split a bill evenly among friends",
         code="""
def @F@(total, people, tip=0.15):
    per_person = total * (1 + tip) / people
    return round(per_person, 2)
""", names={"@F@": ["split_bill", "share", "per_person_cost"]}),
    dict(lang="python", purpose="sort people by age", error="TypeError: '<' not supported between instances of 'dict' and 'dict'",
         code="""
people = [{"name": "Ana", "age": 31}, {"name": "Ben", "age": 25}]
people.sort()
print(people)
""", names={}),
    dict(lang="python", purpose="open and write a file",
         code="""
import json

def @F@(data, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
""", names={"@F@": ["save", "write_json", "dump_settings"]}),
    dict(lang="python", purpose="binary search for a target in a sorted list", bug="when the target is larger than the middle, lo is set to mid instead of mid + 1, so it can loop forever",
         code="""
def @F@(@X@, target):
    lo, hi = 0, len(@X@) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if @X@[mid] == target:
            return mid
        if @X@[mid] < target:
            lo = mid
        else:
            hi = mid - 1
    return -1
""", names={"@F@": ["binary_search", "find_index", "search"], "@X@": _X_LIST}),
    dict(lang="python", purpose="use a class attribute for a list of items", bug="the list is a class attribute, so all instances share it",
         code="""
class Basket:
    items = []

    def add(self, item):
        self.items.append(item)

a, b = Basket(), Basket()
a.add("apple")
print(b.items)
""", names={}),
    dict(lang="python", purpose="read user input and double it", error="TypeError: can't multiply sequence by non-int of type 'float'",
         code="""
value = input("Enter a number: ")
print(value * 2.0)
""", names={}),
    dict(lang="python", purpose="filter and transform records",
         code="""
orders = [("book", 12.5, 2), ("pen", 1.2, 10), ("lamp", 30.0, 1)]
expensive = [(name, price * qty) for name, price, qty in orders if price * qty > 20]
print(sorted(expensive, key=lambda t: t[1], reverse=True))
""", names={}),
    dict(lang="python", purpose="wrap a function with a decorator",
         code="""
import functools, time

def @F@(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = func(*args, **kwargs)
        print(f"{func.__name__} took {time.perf_counter() - start:.3f}s")
        return result
    return wrapper
""", names={"@F@": ["timed", "timer", "log_time"]}),
    dict(lang="javascript", purpose="add up the prices in a cart", bug="the prices are strings, so + concatenates them instead of adding",
         code="""
const cart = [{ price: "4.50" }, { price: "3.25" }];
let total = 0;
for (const item of cart) {
  total = total + item.price;
}
console.log(total);
""", names={}),
    dict(lang="javascript", purpose="log numbers after a delay", bug="var is function-scoped, so every callback sees the final value of i",
         code="""
for (var i = 0; i < 3; i++) {
  setTimeout(function () {
    console.log(i);
  }, 100);
}
""", names={}),
    dict(lang="javascript", purpose="fetch JSON from an API",
         code="""
async function @F@(url) {
  const response = await fetch(url);
  if (!response.ok) {
    throw new Error(`Request failed: ${response.status}`);
  }
  return response.json();
}
""", names={"@F@": ["getJson", "loadData", "fetchJson"]}),
    dict(lang="javascript", purpose="check whether two values are equal", bug="== does type coercion, so '0' == 0 is true",
         code="""
function @F@(a, b) {
  return a == b;
}
console.log(@F@("0", 0));
""", names={"@F@": ["isSame", "equals", "same"]}),
    dict(lang="javascript", purpose="transform an array of users",
         code="""
const users = [{ name: "Ada", active: true }, { name: "Bo", active: false }];
const names = users.filter(u => u.active).map(u => u.name.toUpperCase());
console.log(names.join(", "));
""", names={}),
    dict(lang="python", purpose="count the characters in a string",
         code="""
def @F@(s):
    counts = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    return counts
""", names={"@F@": ["char_counts", "count_chars", "letter_frequency"]}),
    dict(lang="python", purpose="get the last element of a list", error="IndexError: list index out of range",
         code="""
def @F@(@X@):
    return @X@[len(@X@)]
""", names={"@F@": ["last", "get_last", "final_item"], "@X@": _X_LIST}),
    dict(lang="python", purpose="convert a list of strings to integers",
         code="""
raw = ["10", "20", "x", "30"]
numbers = []
for s in raw:
    try:
        numbers.append(int(s))
    except ValueError:
        print(f"skipping {s!r}")
print(sum(numbers))
""", names={}),
    dict(lang="python", purpose="use a context manager to time code",
         code="""
from contextlib import contextmanager
import time

@contextmanager
def @F@(label):
    start = time.time()
    yield
    print(label, round(time.time() - start, 2))
""", names={"@F@": ["timer", "stopwatch", "measure"]}),
    dict(lang="python", purpose="compute the percentage of passing students", bug="integer division truncates the result to 0 in this calculation order",
         code="""
passed = 18
total = 25
percent = passed // total * 100
print(f"{percent}% passed")
""", names={}),
]

EXPLAIN_TEMPLATES = [
    "What does this code do?\n\n{code}",
    "Can you explain this {Lang} code line by line?\n\n{code}",
    "I found this in our codebase and I don't understand it. What is it doing?\n\n{code}",
    "{code}\n\nIs there a cleaner way to write this?",
    "How could I make this code more efficient or more readable?\n\n{code}",
    "Add comments to this code explaining what each part does.\n\n{code}",
    "What is the time complexity of this code?\n\n{code}",
    "Explain this to me like I'm new to programming:\n\n{code}",
    "{code}\n\nWhat would this print or return? Walk me through it.",
    "Please review this code and point out any problems or edge cases.\n\n{code}",
    "Write a docstring or short comment that describes what this does:\n\n{code}",
    "Could you rewrite this in a different style and explain the trade-offs?\n\n{code}",
    "Here's a snippet from a tutorial I'm following:\n\n{code}\n\nWhy is it written this way?",
    "Translate this {Lang} code into {other}.\n\n{code}",
    "Suggest good unit tests for this code.\n\n{code}",
]

BUG_TEMPLATES = [
    "This code is supposed to {purpose}, but it gives the wrong result. What's the bug?\n\n{code}",
    "Why doesn't this work? It should {purpose}.\n\n{code}",
    "Can you find and fix the bug in this code?\n\n{code}",
    "{code}\n\nMy teacher says there's a subtle bug in this. I can't see it. Help?",
    "I wrote this to {purpose}. It runs, but the output is wrong. What did I do wrong?\n\n{code}",
    "Debug this for me, please. It's meant to {purpose}.\n\n{code}",
    "{code}\n\nSomething is off with this code. Explain the problem and show a corrected version.",
]

ERROR_TEMPLATES = [
    "When I run this I get `{error}`. What's going wrong?\n\n{code}",
    "I'm getting this error:\n\n{error}\n\nHere's my code:\n\n{code}\n\nHow do I fix it?",
    "{code}\n\nThis crashes with {error}. Why?",
    "Help! My code is supposed to {purpose} but I keep getting an error: {error}\n\n{code}",
    "What does `{error}` mean, and how do I fix it in this code?\n\n{code}",
]


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

SHOP_ITEMS = _pairs("""
notebook | notebooks
apple | apples
pencil | pencils
concert ticket | concert tickets
bag of rice | bags of rice
loaf of bread | loaves of bread
movie ticket | movie tickets
cupcake | cupcakes
bus pass | bus passes
packet of seeds | packets of seeds
T-shirt | T-shirts
bottle of juice | bottles of juice
paperback book | paperback books
box of crayons | boxes of crayons
coffee | coffees
""")

MATH_SUFFIXES = ["", "", "", " Show your work.", " Explain each step.", " Please show the steps.",
                 " Just give me the answer.", " Can you explain how you got the answer?",
                 " I got a different answer, so please walk me through it carefully."]


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

MATH_WRAPPERS = [
    "{q}",
    "{q}",
    "{q}",
    "Can you help me with this math problem? {q}",
    "Homework question: {q}",
    "{P}, and I'm stuck on this: {q}",
    "Here's a word problem from my {kid}'s homework: {q} How would you explain the solution to a kid?",
    "Solve this step by step: {q}",
    "{q} Please check your arithmetic at the end.",
    "Math question! {q}",
]


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

CHARACTERS = _lines("""
a retired lighthouse keeper
a shy robot who collects buttons
a grumpy cat who can talk
a twelve-year-old inventor
a dragon who is afraid of fire
a night-shift nurse
a ghost who haunts a public library
a street musician in a big city
a baker who can taste emotions
an astronaut stranded on Mars
a detective who is allergic to clues
a time traveler who keeps arriving on Tuesdays
a young witch failing her exams
an old fisherman and his granddaughter
a sentient houseplant
a knight who hates horses
a penguin who wants to fly
a mail carrier in a tiny mountain village
a chess grandmaster playing her last game
a lonely lighthouse cat
a substitute teacher on her first day
a pirate captain who gets seasick
a farmer who finds a door in his field
a translator for an alien embassy
a teenage skateboarder
a bored museum guard
a dog waiting at a train station
an elderly woman learning to use a smartphone
a child who can talk to trees
a retired superhero
an apprentice clockmaker
a mischievous fox
a scientist who shrinks herself by accident
a lost delivery drone
a sous-chef with a secret recipe
a dragon librarian
a firefighter on his last shift before retirement
a bee who wants to be a butterfly
a girl who finds a map in her grandmother's attic
an AI assistant that becomes curious about the ocean
a nervous magician
a snowman who wants to see summer
a beekeeper in the city
a traveling circus strongwoman
twin brothers who run a bookshop
a squirrel planning a heist
a tired office worker who finds a portal in the printer
a deep-sea diver
a wizard who has lost his memory
a new kid at school who only speaks in questions
""")

SETTINGS = _lines("""
a floating city above the clouds
a small fishing village in winter
an abandoned amusement park
a space station orbiting Jupiter
a bustling night market
a haunted Victorian house
a desert oasis
a tiny apartment in Tokyo
a rainforest canopy
a train that never stops
an underwater research base
a medieval castle during a siege
a school for young dragons
a laundromat at 3 a.m.
a lighthouse during a storm
a crowded airport on Christmas Eve
a village where it never stops snowing
a library where books can talk
a farm at the edge of the world
a rooftop garden in New York
a sleepy seaside town
a starship's engine room
an enchanted forest
a mountain monastery
a roadside diner in the middle of nowhere
a city where everyone has forgotten how to sleep
a hospital waiting room
a ski lodge cut off by an avalanche
a boat drifting on a foggy lake
a museum after closing time
a garden at the bottom of the sea
a market on the moon
a small-town bakery
a lost island that appears once every hundred years
a post office in a ghost town
""")

GENRES = _lines("""
mystery
science fiction
fantasy
funny
fairy-tale
spooky but kid-friendly
romantic
adventure
slice-of-life
fable-style
thriller
western
cozy mystery
bedtime
dystopian
magical realist
historical
superhero
ghost
heist
""")

STORY_CONSTRAINTS = _lines("""
in exactly five sentences
in under 200 words
with a twist ending
told from the point of view of the villain
as a series of diary entries
using only dialogue
where the last line echoes the first line
that ends with a question
with a happy ending
told in the second person
that includes the word "marmalade"
for a seven-year-old
with a moral at the end
in the style of a classic fairy tale
set over a single hour
in the form of letters between two friends
with a cliffhanger ending
where the main character never speaks
that starts with the sentence "Nobody noticed the door until Tuesday."
that starts with the sentence "The rain had a smell that morning."
told backwards, from the end to the beginning
in 100 words exactly
with three short chapters
that would work as a bedtime story
that uses lots of sensory detail
with a bittersweet ending
""")

STORY_OBJECTS = _lines("""
a broken pocket watch
a red umbrella
a mysterious key
a jar of fireflies
an old photograph
a talking mirror
a paper airplane
a lost glove
a map with no names on it
a music box
a letter that was never sent
a glowing seashell
a borrowed library book
a tiny door in a tree
a compass that points to what you want most
""")

STORY_TEMPLATES = [
    "Write a short story about {c}.",
    "Write a short {g} story about {c} in {s}.",
    "Tell me a story about {c}, {k}.",
    "Can you write {ag} story set in {s}? The main character is {c}.",
    "Write a short story {k}. It should be about {c} and {o}.",
    "I need a bedtime story for my {kid}. Something about {c}, please. Keep it gentle.",
    "Write {ag} story that takes place in {s} and involves {o}.",
    "Story prompt: {c} finds {o} in {s}. Write what happens next.",
    "Write the opening paragraph of {ag} novel about {c}.",
    "Write a piece of flash fiction (under 300 words) about {c}.",
    "Make up a story about {c}. Genre: {g}. Setting: {s}.",
    "Write a short story about {c}, {k}.",
    "Could you write a funny story about {c} who gets lost in {s}?",
    "Write a story for kids in which {c} learns an important lesson about friendship.",
    "Give me {ag} story in which {c} has to make a difficult choice.",
    "Write a very short story (three paragraphs) about {o}.",
    "Once upon a time, there was {c}. Continue this story {k}.",
    "Write {ag} short story. Include {c}, {s}, and {o}.",
    "I'm writing a collection of short stories. Write one about {c} living in {s}, {k}.",
    "Tell a two-minute campfire story about {c}.",
    "Write a scene where {c} meets {c2} for the first time in {s}.",
    "Write a story about {c} and {c2} who have to work together to find {o}.",
]

POEM_SUBJECTS = _lines("""
the first snow of winter
a cup of morning coffee
the ocean at night
an old oak tree
city lights
my grandmother's kitchen
a rainy Monday
autumn leaves
the moon
friendship
a lost sock
the last day of summer
a cat sleeping in the sun
the sound of rain on a tin roof
a busy train station
homesickness
learning to ride a bike
a garden in spring
mountains at dawn
the smell of bread baking
a thunderstorm
an empty playground
stars over the desert
a long-distance friendship
the end of a school year
a lighthouse
a river running to the sea
a forgotten library book
fireflies in June
waiting for a letter
a marathon runner's final mile
a quiet Sunday morning
the hum of a refrigerator at midnight
a cherry blossom tree
the first day of a new job
a grandfather's old watch
a city bus at dawn
the Northern Lights
a broken umbrella
time passing
hope
courage
kindness
a bird building a nest
the smell of the sea
a dog waiting by the door
the color blue
a candle burning down
a bowl of soup on a cold day
a bicycle ride through the countryside
the moment before sleep
a snowman melting
old letters in a drawer
a volcano
a honeybee
a desert after rain
the internet
a computer that never sleeps
Monday mornings
a kettle coming to the boil
""")

POEM_FORMS = [
    ("haiku", "a haiku"), ("haiku", "three haiku"), ("limerick", "a limerick"), ("sonnet", "a sonnet"),
    ("free", "a free verse poem"), ("couplets", "a poem in rhyming couplets"), ("short", "a short poem"),
    ("short", "a four-line poem"), ("ballad", "a short ballad"), ("ode", "an ode"), ("tanka", "a tanka"),
    ("short", "a poem of about twelve lines"), ("kids", "a rhyming poem for children"),
    ("cinquain", "a cinquain"), ("prose", "a prose poem"),
]

POEM_MOODS = _lines("""
joyful
melancholy
peaceful
nostalgic
playful
hopeful
mysterious
angry
tender
humorous
dreamy
solemn
""")

ACROSTIC_WORDS = _lines("""
SPRING
OCEAN
FRIEND
MOTHER
COFFEE
WINTER
GARDEN
DREAM
HOPE
MUSIC
SUMMER
TEACHER
""")

POEM_TEMPLATES = [
    "Write {form} about {s}.",
    "Write {form} about {s}. Make it {mood}.",
    "Can you write me {form} about {s}?",
    "Compose {form} about {s}, in {amood} tone.",
    "I'd love {form} about {s} for my {kid}'s birthday card.",
    "Write {form} that captures the feeling of {s}.",
    "{Form} about {s}, please.",
    "Write a poem about {s} that doesn't rhyme.",
    "Write {form} about {s}, using at least one metaphor.",
    "Could you write {form} about {s} from the perspective of {c}?",
    "Write {form} comparing {s} to {s2}.",
    "Write {form} titled \"{title}\".",
    "Write an acrostic poem using the word {word}.",
    "My friend is having a hard week. Write {form} about {s} that I could send them.",
    "Write a poem about {s} in the style of a nursery rhyme.",
    "Give me {form} about {s}, then explain the imagery you used.",
]


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

EMAIL_PURPOSES = _pairs("""
my manager | asking for an extension on the quarterly report
my landlord | reporting that the kitchen sink has been leaking for a week
a professor | asking if I can join her research lab next semester
a customer | apologizing for a delayed order and offering a discount
my team | announcing that I'm leaving the company at the end of the month
a hiring manager | following up after a job interview last Thursday
a colleague | thanking them for covering my shifts while I was sick
my neighbor | politely asking them to keep their dog off my lawn
a client | explaining that the project will cost 15% more than estimated
my child's teacher | asking how my son is doing in math
a hotel | requesting a late checkout
an airline | asking for a refund for a cancelled flight
the city council | supporting a proposal for more bike lanes
a supplier | asking for a better price on a bulk order
a former coworker | asking for a LinkedIn recommendation
my book club | suggesting the next three books we could read
my team | inviting everyone to a Friday lunch to celebrate a product launch
a gym | cancelling my membership
my manager | requesting two weeks of vacation in August
a conference organizer | submitting a talk proposal
a new employee | welcoming them to the team and explaining their first week
my mentor | thanking them for their advice over the past year
the IT department | reporting that my laptop won't connect to the VPN
a restaurant | complaining about a rude waiter
a potential client | introducing my small web design business
a journalist | offering to be interviewed about urban gardening
the parents of my students | announcing a field trip to the science museum
my landlord | asking whether I can get a cat
a local bakery | ordering a birthday cake for 20 people
an old friend | reconnecting after ten years
my team | summarizing the decisions from today's meeting
a vendor | disputing an incorrect invoice
my HR department | asking about parental leave policies
a volunteer group | thanking everyone for the beach clean-up
a university admissions office | asking about the application deadline
my insurance company | filing a claim for water damage
a customer | responding to a negative review about slow shipping
my manager | proposing a four-day work week pilot
a colleague | giving feedback on their presentation
my tenants | announcing that the building's water will be shut off on Tuesday
a coworker | declining a meeting invitation politely
my doctor's office | rescheduling an appointment
a recruiter | saying I'm not interested in the role right now
a customer | confirming the details of their appointment
my students | reminding them that the essay is due Friday
a supplier | cancelling an order
the head of another department | asking for help with a shared project
my sister | planning our parents' anniversary surprise
a potential landlord | asking to view an apartment this weekend
a software company | requesting a feature in their app
""")

LETTER_TASKS = _lines("""
a cover letter for a junior data analyst position
a cover letter for a barista job at a local coffee shop
a thank-you note to my aunt for the knitted scarf she sent
a letter to my future self to open in ten years
a recommendation letter for a former intern who was excellent with customers
a resignation letter that stays positive
a letter to the editor of our local newspaper about the closing of the public library
a condolence note to a coworker whose father passed away
a letter to my grandmother telling her about my first month at university
a short note to my neighbors apologizing for the noise from our party
a wedding thank-you card for a couple who gave us a cookbook
a letter of complaint to a phone company about repeated billing errors
a letter to a pen pal in another country introducing myself
a farewell message for a colleague who is retiring
a toast for my best friend's 30th birthday
a letter from a cat to its owner complaining about the new dog
a welcome letter for new members of a hiking club
a fundraising letter for a school library
a letter asking a local business to sponsor our youth soccer team
an apology letter to a customer whose package arrived damaged
""")

TONES = _lines("""
formal
friendly
polite but firm
warm
concise
professional
apologetic
enthusiastic
casual
diplomatic
grateful
persuasive
""")

EMAIL_TEMPLATES = [
    "Write an email to {rcpt} {purpose}.",
    "Can you help me write {atone} email to {rcpt} {purpose}?",
    "Draft a short email to {rcpt} {purpose}. Keep it {tone}.",
    "I need to email {rcpt}, {purpose}. What should I say?",
    "Write a {tone} message to {rcpt} {purpose}. It should be under 120 words.",
    "Please draft an email to {rcpt} {purpose}. Include a clear subject line.",
    "{P}. I have to write to {rcpt} {purpose}, and I'm bad at this kind of thing. Can you draft something?",
    "Help me write an email {purpose}. It's going to {rcpt}, so the tone should be {tone}.",
    "Write two versions of an email to {rcpt} {purpose}: one formal and one casual.",
    "Give me a template I can reuse for emailing {rcpt} {purpose}.",
    "Write a Slack message to {rcpt} {purpose}.",
    "Write a text message to {rcpt} {purpose}. Keep it short and {tone}.",
    "Compose an email to {rcpt} {purpose}. Mention that I'm available {when}.",
]

LETTER_TEMPLATES = [
    "Write {task}.",
    "Can you help me write {task}?",
    "Write {task}. Make it {tone}.",
    "Please draft {task}, around 150 words.",
    "I need {task}. Could you write a first draft I can edit?",
    "Write {task}, in {atone} tone.",
    "Help me with {task}. I don't know how to start it.",
]

WHEN = _lines("""
any afternoon next week
on Monday or Wednesday morning
after 3 p.m. on weekdays
this Friday
at the end of the month
""")


_SLACK_OK = {"my manager", "my team", "a colleague", "a coworker", "a new employee", "the IT department",
             "the head of another department"}
_TEXT_OK = {"my neighbor", "my sister", "an old friend", "my landlord", "a coworker", "a colleague", "my book club",
            "my manager"}


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
# Passages for summarize / rewrite / extract: hand-written here (CC0 with this repository) plus procedural ones
# ----------------------------------------------------------------------------------------------------------------

PASSAGES = [
    "Honeybees communicate the location of food through a behavior known as the waggle dance. When a forager returns to the hive, she moves in a figure-eight pattern, waggling her body during the straight middle section. The angle of that straight run relative to vertical tells other bees the direction of the food relative to the sun, while the length of the waggle indicates distance. Researchers have decoded these dances well enough to map where a colony is foraging, which helps scientists study how bees respond to changes in the landscape.",
    "The city library will extend its opening hours starting next month. On weekdays, the main branch will stay open until 9 p.m. instead of 7 p.m., and on Saturdays it will open an hour earlier, at 9 a.m. Library officials said the change responds to a survey in which more than 60 percent of residents asked for evening access. The extra hours will be funded by a reallocation of the maintenance budget, and no new staff will be hired; instead, current employees will rotate through evening shifts.",
    "Sleep is not a single uniform state. Over the course of a night, the brain cycles through light sleep, deep sleep and rapid eye movement, or REM, sleep roughly every ninety minutes. Deep sleep is associated with physical recovery and the consolidation of certain memories, while REM sleep is when most vivid dreaming occurs. Cutting sleep short tends to remove the later cycles, which are richer in REM, so people who regularly sleep six hours instead of eight may lose a disproportionate amount of it.",
    "In the early nineteenth century, Britain's canals were the fastest way to move heavy goods. That changed quickly with the arrival of the railways. Trains could carry coal, cotton and passengers faster and more reliably, and by the 1850s many canal companies were struggling. Some canals were bought by railway companies and allowed to decay. A century later, volunteers began restoring many of them, and today they are popular with walkers, cyclists and people who live on narrowboats.",
    "Our team spent the last quarter migrating the billing system to the new database. The migration finished two weeks late because the old data contained thousands of duplicate customer records that had to be merged by hand. Performance has improved: monthly invoices now generate in four minutes instead of forty. However, two smaller reports still read from the old database, and we plan to move them next month before the old system is shut down in June.",
    "Composting turns kitchen scraps and garden waste into a dark, crumbly material that improves soil. The process relies on microorganisms that break down organic matter, and they work best with a balance of 'greens', such as vegetable peelings and grass clippings, and 'browns', such as dry leaves and cardboard. A compost pile should be kept about as damp as a wrung-out sponge and turned every few weeks to let in air. Meat, dairy and oily foods are usually left out because they attract pests and smell as they rot.",
    "Maria had worked at the bakery for twelve years when the owner announced he was retiring. Rather than let it close, she borrowed money from her brother, took out a small loan, and bought the business. The first year was difficult: the oven broke twice and a new café opened across the street. But Maria kept the old recipes, added a few of her own, and started selling bread to two local restaurants. By the third year, the bakery was busier than it had ever been.",
    "Electric scooters have spread rapidly through many cities, offering a quick way to travel short distances. Supporters say they reduce car trips and are cheap to use. Critics point to scooters left blocking sidewalks, riders on pavements, and injuries among both riders and pedestrians. Some cities have responded by creating designated parking zones, lowering speed limits in busy areas, and limiting the number of companies allowed to operate. The debate is less about whether scooters should exist and more about how to share limited street space.",
    "The Great Barrier Reef is the world's largest coral reef system, stretching more than 2,300 kilometers along the coast of Queensland, Australia. It is made up of thousands of individual reefs and hundreds of islands, and it supports an enormous variety of life, from tiny plankton to sea turtles and sharks. In recent decades, rising ocean temperatures have caused several mass bleaching events, in which stressed corals expel the algae that give them color and food. Corals can recover from bleaching, but repeated events leave less time for recovery.",
    "To reset your password, open the app and tap 'Forgot password' on the sign-in screen. Enter the email address linked to your account, and we'll send you a link that is valid for 30 minutes. If you don't see the email, check your spam folder. For security reasons, the new password must be at least 12 characters long and cannot match any of your last five passwords. If you no longer have access to your email address, contact support and be ready to verify your identity.",
    "Volcanoes form where molten rock, called magma, reaches the Earth's surface. Most are found along the boundaries of tectonic plates, either where plates pull apart, as in Iceland, or where one plate slides beneath another, as along the Pacific 'Ring of Fire'. Some, like those in Hawaii, sit above hot spots in the middle of plates. The style of an eruption depends largely on the magma: runny, low-silica magma produces gentle lava flows, while thick, gas-rich magma can explode violently.",
    "The museum's new exhibition brings together more than two hundred objects from ancient Egypt, many of which have never been displayed before. Highlights include a painted coffin lid, a collection of everyday tools, and children's toys made of wood and clay. Rather than focusing only on pharaohs, the curators wanted to show how ordinary people lived, worked and played. The exhibition runs until the end of March, and tickets are free for visitors under eighteen.",
    "Many people assume that multitasking helps them get more done, but research suggests otherwise. When we switch between tasks, the brain needs time to refocus, and those small delays add up. Errors also increase, especially when both tasks require attention, like writing an email while listening to a meeting. What looks like multitasking is usually rapid switching. Experts recommend grouping similar tasks together and setting aside blocks of time for focused work without notifications.",
    "The village of Harwood has voted to turn its unused railway station into a community center. The building, which has been empty since the line closed in 1968, will be repaired using a grant from the regional heritage fund and money raised by residents. Plans include a café, a small museum about the railway, and a room for classes and meetings. Work is expected to begin in the spring and take about eighteen months.",
    "A budget is simply a plan for your money. Start by writing down your monthly income after tax, then list your fixed costs, such as rent, insurance and loan payments. Next, estimate variable costs like groceries, transport and entertainment; looking at the last three months of bank statements helps. Whatever is left can go toward savings or paying off debt. Many people use the 50/30/20 rule as a rough guide: half for needs, thirty percent for wants and twenty percent for savings.",
    "Octopuses are among the most intelligent invertebrates. They can solve puzzles, open jars, and escape from tanks, and some have been observed using coconut shells as portable shelters. Unlike humans, most of an octopus's neurons are located in its arms rather than in its central brain, which allows each arm to react to its surroundings with some independence. Octopuses also have remarkable camouflage, changing the color and texture of their skin in a fraction of a second.",
    "Last Saturday's charity run raised more than $18,000 for the children's hospital, beating the organizers' goal by a third. Over 400 runners took part, from serious athletes to families pushing strollers. The fastest runner completed the 10-kilometer course in 33 minutes, but organizers said the real highlight was a group of nurses who ran the entire route in costume. Next year's event is already being planned, with a shorter route for younger children.",
    "Before the invention of the mechanical clock, people measured time in many different ways. Sundials tracked the shadow of the sun, water clocks let water drip from one container into another at a steady rate, and candles marked with lines burned down hour by hour. These methods worked reasonably well but had obvious limits: sundials were useless at night or on cloudy days, and water could freeze in winter. Mechanical clocks, which appeared in European towers in the late thirteenth century, changed how communities organized their days.",
    "Our customer satisfaction scores fell from 8.1 to 7.4 this quarter. The main complaints were longer wait times on the support line and confusing instructions in the new setup guide. Wait times rose because two experienced agents left and their replacements are still in training. We recommend rewriting the setup guide with more screenshots, adding a callback option to the phone line, and reviewing scores again at the end of next quarter.",
    "Walking is one of the simplest forms of exercise, yet it has wide-ranging benefits. Regular brisk walking can strengthen the heart, help control blood pressure, and improve mood. It requires no special equipment besides comfortable shoes, and it can be built into daily routines by walking to the shops, taking the stairs, or getting off the bus one stop early. Health guidelines commonly suggest around 150 minutes of moderate activity a week, which works out to about 30 minutes on five days.",
    "The first successful powered airplane flight took place in December 1903 near Kitty Hawk, North Carolina. Orville and Wilbur Wright, two bicycle makers from Ohio, had spent years studying birds, building gliders and testing wing shapes in a homemade wind tunnel. Their first flight lasted just 12 seconds and covered 36 meters. By the end of the day, Wilbur had flown for 59 seconds. Within a few decades, aircraft would transform travel, trade and warfare.",
    "Dear residents, please note that the annual inspection of the building's fire alarms will take place on Thursday between 9 a.m. and 1 p.m. Technicians will need brief access to every apartment to test the smoke detectors. If you will not be home, please leave a key with the building manager or let us know a better time. The alarms may sound several times during the morning; there is no need to evacuate unless you are told to by staff.",
    "Tea was first drunk in China thousands of years ago, where it was originally valued as a medicine. Over the centuries, it became an everyday drink and spread along trade routes to Japan, Central Asia and eventually Europe. In Britain, tea became fashionable in the seventeenth century and later a national habit, helped by imports from India and Sri Lanka. Today, tea is the most widely consumed drink in the world after water, prepared in countless styles, from Moroccan mint tea to Indian masala chai.",
    "Remote work offers flexibility, but it can blur the line between work and home. Without a commute, many people find themselves checking email late into the evening. Setting clear start and finish times, keeping a separate workspace if possible, and taking real breaks away from the screen can help. Managers also play a role: teams that agree on response-time expectations and avoid late-night messages tend to report less burnout.",
    "The new community garden on Elm Street opened this spring with thirty raised beds, a tool shed and a rainwater collection system. Beds are available to residents for a small yearly fee, and five are reserved for the primary school next door. Volunteers run free workshops on Saturday mornings covering topics such as seed starting, composting and pest control. The garden's organizers hope to add a greenhouse next year if they can raise enough money.",
    "Glaciers are large masses of ice that move slowly under their own weight. They form where more snow falls in winter than melts in summer, so that the snow gradually compresses into ice over many years. As they move, glaciers carve valleys, carry rocks for long distances, and leave behind features such as lakes and moraines. Because they respond to long-term changes in temperature and snowfall, glaciers are closely watched as indicators of climate change.",
    "During the meeting, the committee agreed to move the annual festival from June to September to avoid the summer heat. The budget will remain the same, but more money will go toward shaded seating and water stations. Ticket prices will increase by two dollars, with free entry kept for children under twelve. The committee will announce the new date and the lineup of performers by the end of April.",
    "Learning a musical instrument as an adult is entirely possible, although it can feel slow at first. Adults often have less free time than children and can be more self-critical, but they also tend to practice more deliberately and understand theory more quickly. Short daily practice sessions are usually more effective than long weekly ones. Many teachers recommend picking songs you genuinely enjoy, recording yourself to track progress, and playing with others as soon as you can.",
    "The printing press, developed by Johannes Gutenberg in the mid-fifteenth century, made it possible to produce books far more quickly and cheaply than copying them by hand. Within fifty years, printing shops had spread across Europe and millions of books were in circulation. The wider availability of texts helped spread new ideas during the Renaissance and the Reformation, supported the growth of literacy, and made it easier for scholars to share and check each other's work.",
    "Food waste is a problem at every stage, from farms to kitchens. In wealthier countries, a large share happens at home, where food is thrown out because it has passed a 'best before' date, was bought in excess, or was stored badly. Simple habits can help: planning meals before shopping, storing fruit and vegetables correctly, freezing leftovers, and understanding that 'best before' dates are about quality, not safety. Supermarkets and restaurants are also experimenting with discounts on surplus food.",
    "The Mars rover's latest images show layered rocks at the base of an ancient crater, suggesting that the area was once covered by a lake. Scientists think these layers formed as sediment settled at the bottom of still water over thousands of years. The rover will spend the next several months drilling samples from the layers. If the samples contain organic molecules, they could help answer whether Mars ever had conditions suitable for life.",
    "Welcome to the team! During your first week, you'll meet with your manager each morning to go over priorities. On Monday you'll set up your laptop and accounts with IT, and on Tuesday you'll join a product walkthrough. By Friday, we'd like you to have shadowed at least two customer calls. Don't worry about being productive right away; the goal of the first week is to learn how we work and who to ask for help.",
    "The Amazon rainforest covers about 5.5 million square kilometers across nine countries, with the largest share in Brazil. It is home to roughly one in ten known species on Earth and plays an important role in regulating the global climate by absorbing carbon dioxide. Deforestation for cattle ranching, farming and logging has reduced its size significantly over the last fifty years. Scientists warn that if too much forest is lost, parts of the Amazon could shift toward drier savanna.",
    "The shop will close early on Friday, December 23, at 3 p.m., and will remain closed on December 25 and 26. Online orders placed after December 18 may not arrive before the holidays. Gift cards can still be bought online at any time and are delivered instantly by email. Our regular hours resume on December 27. Thank you for shopping with us this year, and happy holidays from all of our staff.",
    "Chess is thought to have originated in India around the sixth century, in a game called chaturanga. It spread to Persia, where it became known as shatranj, and then through the Islamic world to Europe. Over time, the rules changed: the queen, once one of the weakest pieces, became the most powerful in fifteenth-century Spain, which made the game much faster. Modern chess has been shaped further by computers, which now play far better than any human.",
    "Ravi started running two years ago to manage stress at work. At first he could barely run for ten minutes without stopping. He followed a beginner plan that alternated walking and running, and within three months he completed his first five-kilometer race. Since then he has run two half marathons. He says the biggest change wasn't his fitness but his sleep: on days when he runs, he falls asleep faster and wakes up feeling rested.",
    "Bridges come in several basic designs, each suited to different situations. Beam bridges are the simplest, with a horizontal deck supported at each end, and work well for short spans. Arch bridges carry loads outward along a curve into supports on either side. Suspension bridges hang the deck from cables strung between tall towers, allowing very long spans across rivers and bays. Engineers choose a design based on the distance to cross, the ground conditions, the expected traffic and the budget.",
]

_TOWNS = _lines("""
Millbrook
Ashford
Riverton
Lakeside
Oakridge
Cedar Falls
Port Ellis
Greenvale
Stonebridge
Maple Hollow
Westfield
Brightwater
""")

_NEWS_DECISIONS = [
    ("approved plans for", "who voted against, argued that the town should first fix its existing roads", ["a new skate park", "a covered market", "wider sidewalks on Main Street", "a public swimming pool",
                            "solar panels on school roofs", "a pedestrian bridge over the river", "a dog park"]),
    ("rejected a proposal to build", "who supported the plan, warned that the town would fall behind its neighbors", ["a parking garage downtown", "a second supermarket", "a highway bypass",
                                      "luxury apartments by the lake", "a wind farm on the hills"]),
    ("postponed a decision on", "who wanted an immediate vote, said residents deserved a clear answer", ["closing the old fire station", "new parking fees", "a ban on leaf blowers",
                                 "renaming the central square", "extending bus routes to the suburbs"]),
]


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


REVIEW_PRODUCTS = _lines("""
wireless earbuds
coffee grinder
hiking boots
office chair
blender
e-reader
electric toothbrush
backpack
air fryer
desk lamp
yoga mat
bluetooth speaker
rice cooker
winter jacket
phone case
""")

_REVIEW_GOOD = ["the sound quality is excellent", "it arrived two days early", "it feels really sturdy",
                "setup took less than five minutes", "the battery lasts for days", "it's surprisingly quiet",
                "it looks even better than in the photos", "customer service replied within an hour",
                "it's very comfortable to use for long periods", "it's worth every penny"]
_REVIEW_BAD = ["the instructions were confusing", "it stopped working after three weeks", "it's louder than I expected",
               "the color was different from the picture", "the strap broke on the first day", "it's a bit overpriced",
               "the app keeps disconnecting", "it scratches easily", "delivery took almost a month",
               "it smells of plastic"]


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

SUMMARY_TEMPLATES = [
    "Summarize this in one sentence:\n\n{p}",
    "Can you summarize the following text?\n\n{p}",
    "TL;DR please:\n\n{p}",
    "Give me three bullet points that capture the main ideas of this passage.\n\n{p}",
    "{p}\n\nSummarize the text above for someone who only has ten seconds.",
    "Write a short summary of this for a newsletter:\n\n\"{p}\"",
    "What is the main point of this paragraph?\n\n{p}",
    "Please condense this into about 30 words.\n\n{p}",
    "Here's a paragraph I need to shorten for a slide:\n\n{p}\n\nCan you turn it into a headline and two bullet points?",
    "Read this and tell me the key takeaway:\n\n{p}",
    "{p}\n\nExplain what this says in simple words a child could understand.",
    "Summarize the following in the form of a tweet (under 280 characters):\n\n{p}",
    "I don't have time to read this. What's it about?\n\n{p}",
    "Write a one-paragraph abstract of this text:\n\n{p}",
    "Summarize this, then suggest a good title for it.\n\n{p}",
]

REWRITE_SOURCES = _lines("""
hey so i cant make it to the meeting tmrw, something came up. can we move it?
The meeting has been rescheduled due to unforeseen circumstances that were beyond our control.
We regret to inform you that your application was not successful on this occasion.
i think we should maybe try to like finish the project sooner if thats ok with everyone
Per my last email, the deliverables are still outstanding and need to be actioned ASAP.
Their going to the store tomorow to by some food for the party.
The cat, which was orange and fluffy and very loud, sat on the windowsill all day long looking at birds.
Our company leverages cutting-edge synergies to deliver best-in-class solutions for stakeholders.
Due to the fact that it was raining, the game was cancelled.
The report was written by the intern and was reviewed by the manager before it was sent to the client.
I am writing to complain about the terrible service I received at your store yesterday.
The new policy will take effect immediately and all employees must comply.
omg the concert last night was SO good, best night ever!!!
Please be advised that the parking lot will be closed for maintenance on Saturday.
I has been working here for three years and I enjoys it very much.
It is important to note that the results may vary depending on a number of different factors.
Thank you for reaching out. We have received your request and will respond within 2-3 business days.
Me and him went to the park yesterday and we seen a deer.
The quarterly figures indicate a significant downturn in consumer engagement across all verticals.
Can u send me the file asap? need it for the presentation.
Despite the fact that he had studied for weeks, he still felt unprepared for the exam.
Your package has been delayed. We apologize for any inconvenience this may cause.
Water boils at 100 degrees Celsius at sea level.
The committee has decided to postpone the decision until further information becomes available.
Everyone should bring their own lunch because the cafeteria is closed.
In my opinion, I personally think that this plan is a really very good idea.
The product is easy to use, affordable, and it has a long battery life.
Kindly revert back to me at your earliest convenience regarding the aforementioned matter.
We was late because the bus didnt come on time and then it started to rain.
Small businesses are the backbone of our local economy and deserve our support.
The movie was long, the plot was confusing, and the ending made no sense at all.
I'm sorry I forgot your birthday. I feel really bad about it.
Exercise improves mood, boosts energy, and helps people sleep better.
The system will be unavailable tonight from 10 p.m. to 2 a.m. while we install updates.
My dog is the best dog in the whole world and he loves to play fetch.
Applicants must submit all required documents no later than the fifteenth of the month.
The weather was nice so we decided to eat outside.
Going forward, let's circle back and touch base offline about the deliverables.
This recipe is quick, healthy, and perfect for busy weeknights.
Its been a long week and i just want to sleep all weekend lol
The old bridge, built in 1902, will be demolished next year to make way for a new one.
Climate change is one of the biggest challenges of our time.
We are pleased to announce that our store will now be open on Sundays.
He don't like vegetables but he eat them anyway because his mom say so.
The findings of the study suggest that further research is needed.
Hi team, quick reminder that timesheets are due by end of day Friday. Thanks!
The hotel room was clean, but the walls were thin and we could hear everything next door.
Smartphones have changed the way people communicate, shop, and find information.
I would like to request a refund for the item I purchased, as it arrived damaged.
The train was delayed for two hours, which made everyone miss their connections.
""")

REWRITE_OPS = [
    ("formal", "Rewrite this to sound more formal:"),
    ("formal", "Make this sound professional enough to send to a client:"),
    ("casual", "Rewrite this in a casual, friendly tone:"),
    ("casual", "Make this sound less stiff, like something you'd say to a friend:"),
    ("simple", "Rewrite this in plain English:"),
    ("simple", "Simplify this so a ten-year-old could understand it:"),
    ("short", "Make this shorter without losing the meaning:"),
    ("short", "Cut this down to as few words as possible:"),
    ("grammar", "Fix the grammar and spelling in this sentence:"),
    ("grammar", "Can you correct any mistakes in this?"),
    ("active", "Rewrite this in the active voice:"),
    ("paraphrase", "Paraphrase this:"),
    ("paraphrase", "Give me three different ways to say this:"),
    ("polite", "Make this more polite:"),
    ("polite", "Rewrite this so it sounds kinder:"),
    ("jargon", "Translate this corporate jargon into normal English:"),
    ("style", "Rewrite this as if it were said by a pirate:"),
    ("style", "Rewrite this in the style of Shakespeare:"),
    ("style", "Turn this into a dramatic movie-trailer voiceover:"),
    ("style", "Rewrite this as a short rhyming couplet:"),
    ("persuasive", "Make this more persuasive:"),
    ("exciting", "Make this sound more exciting:"),
    ("neutral", "Rewrite this in a neutral, objective tone:"),
    ("expand", "Expand this into a short paragraph with more detail:"),
    ("headline", "Turn this into a catchy headline:"),
]

REWRITE_FRAMES = [
    "{op}\n\n{t}",
    "{op} \"{t}\"",
    "{op}\n\n\"{t}\"",
    "Here's a sentence I wrote: \"{t}\"\n\n{op_lower}",
    "{t}\n\n^ {op_lower}",
    "Can you help me with this? {op_lower} {t}",
]

PARAGRAPH_REWRITE_OPS = [
    "Rewrite this paragraph for a younger audience:",
    "Rewrite this passage in a more formal, academic style:",
    "Rewrite the following as a friendly blog post introduction:",
    "Paraphrase this paragraph so it doesn't sound like the original:",
    "Rewrite this text as a list of short bullet points:",
    "Rewrite the following to be about half as long:",
    "Turn this passage into a short dialogue between two people:",
    "Rewrite this paragraph in the first person:",
]


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


EXTRACT_TASKS = {
    "review": [
        "Is this review positive, negative or mixed? Explain briefly.\n\n{p}",
        "What star rating (1 to 5) do you think this reviewer gave? Why?\n\n{p}",
        "List the good points and the bad points mentioned in this review.\n\n{p}",
        "Write a polite reply from the seller to this customer review:\n\n{p}",
        "{p}\n\nWhat is the customer's main complaint, if any?",
    ],
    "meeting": [
        "Extract the action items from these notes, with who is responsible for each.\n\n{p}",
        "{p}\n\nWho needs to do what, and by when?",
        "Turn these meeting notes into a short follow-up email to the attendees.\n\n{p}",
        "What problems were raised in this meeting?\n\n{p}",
    ],
    "news": [
        "Who are the people mentioned in this article, and what did each one say or do?\n\n{p}",
        "{p}\n\nWhat numbers appear in this text, and what do they refer to?",
        "Write three quiz questions about this news story.\n\n{p}",
        "What was decided, and what are the arguments for and against it?\n\n{p}",
    ],
    "any": [
        "List all the names, places and dates mentioned in this text.\n\n{p}",
        "What is the tone of this text? Give evidence from the wording.\n\n{p}",
        "Classify this text as one of: news, advertisement, personal story, instructions, notice, or explanation. Explain your choice.\n\n{p}",
        "Write three questions that can be answered using only this text, and answer them.\n\n{p}",
        "Pick out the five most important keywords in this passage.\n\n{p}",
        "{p}\n\nIs there anything in this text that seems like opinion rather than fact?",
        "What questions would you still have after reading this?\n\n{p}",
        "Turn the information in this text into a simple table in Markdown.\n\n{p}",
    ],
}

SUPPORT_TICKETS = _lines("""
I was charged twice for my subscription this month. Please refund the extra payment.
The app crashes every time I try to upload a photo. I'm on the latest version.
How do I change the email address on my account?
My order #4471 was supposed to arrive on Monday and it still hasn't come.
I love the new update! The dark mode looks great. Any plans for a tablet version?
I can't log in. It says my password is wrong, but I just reset it.
Can I get an invoice with my company's VAT number on it?
The product arrived damaged. The box was crushed and the screen is cracked.
Your website is very slow today. Is something wrong?
I'd like to cancel my account and delete all my data.
Is there a student discount?
The tracking link you sent me doesn't work.
""")

TICKET_TEMPLATES = [
    "Classify this support ticket as billing, technical, shipping, account or feedback:\n\n\"{t}\"",
    "What is the customer asking for here, and how urgent is it?\n\n{t}",
    "Write a helpful reply to this customer message:\n\n{t}",
    "Label the sentiment of this message (positive, neutral or negative): \"{t}\"",
]


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

BRAINSTORM_THINGS = _lines("""
ideas for a ten-year-old's birthday party
names for a small bakery
weekend activities when it's raining
ways to reuse glass jars
team-building activities that aren't cringe
blog post topics about personal finance
gifts for someone who has everything
healthy snacks to bring to work
fundraising ideas for a school trip
names for a podcast about gardening
things to do in a small town on a Sunday
ways to save money on groceries
science fair projects for a 12-year-old
icebreaker questions for a first meeting
themes for a dinner party
ways to make a long car trip fun for kids
side hustles for a college student
slogans for a neighborhood clean-up day
new features for a to-do list app
ways to reduce plastic at home
date ideas that cost less than $20
topics for a five-minute speech
hobbies to pick up in winter
ways to stay motivated while studying
names for a fantasy kingdom
plot twists for a mystery novel
costume ideas for a Halloween party
questions to ask at the end of a job interview
ways to make a small bedroom feel bigger
things to put in a time capsule
meal-prep ideas for a busy week
activities for a family reunion
themes for a board game night
ways to practice gratitude
Instagram captions for a beach trip
names for a golden retriever puppy
reasons to learn a second language
ways to welcome a new neighbor
easy houseplants for beginners
YouTube video ideas for a cooking channel
ways to make a boring meeting more productive
creative uses for leftover rice
features for a smart home for elderly people
low-cost marketing ideas for a local gym
conversation starters for a dinner with in-laws
ways to celebrate a colleague's promotion
outdoor games for a summer picnic
topics for a high school debate club
ways to reduce stress during exam week
project ideas for learning Python
names for a sci-fi spaceship
things to pack for a weekend camping trip
ways to use up overripe bananas
questions to ask a grandparent about their childhood
classroom rewards that don't involve candy
rainy-day activities for toddlers
ways to make a garden more bee-friendly
tagline ideas for an eco-friendly cleaning brand
journaling prompts for the new year
habits that make mornings less stressful
""")

BRAINSTORM_TEMPLATES = [
    "Give me {n} {x}.",
    "Brainstorm {x}. I need at least {n}.",
    "List {n} {x}.",
    "Can you come up with some {x}?",
    "I'm stuck. What are some {x}?",
    "Help me brainstorm {x}. Be creative, but keep them realistic.",
    "What are {n} unusual {x}?",
    "Quick list of {x}, please, just a few words each.",
    "I need {x}. Give me {n} options and put your favorite first.",
    "{P}. Can you suggest {n} {x}?",
    "Make a list of {x}, sorted from easiest to hardest.",
    "Give me a mix of practical and silly {x}: {n} of each.",
    "Brainstorm {n} {x} and explain each one in a sentence.",
    "Suggest some {x}. I'm on a tight budget.",
]

HOWTO_TASKS = _lines("""
change a flat tire
make a sourdough starter
set up a Python virtual environment
write a cover letter
start a vegetable garden on a balcony
clean a cast iron pan
tie a tie
get rid of fruit flies in the kitchen
back up my phone
learn to juggle
fold a fitted sheet
brew pour-over coffee
prepare for a marathon
remove a red wine stain from a carpet
train a puppy to sit
make a budget spreadsheet
negotiate a lower rent
write a good thank-you note
change a bike tire
unclog a drain without chemicals
start meditating
make homemade pasta
plan a road trip
set up a home Wi-Fi network securely
write a haiku
improve my posture at my desk
make my own candles
propagate a pothos plant
introduce two cats to each other
learn to touch type
organize my email inbox
make a simple website with HTML
hard-boil an egg perfectly
prepare for a job interview
paint a room
make cold brew coffee at home
jump-start a car
sharpen a kitchen knife
write a resume with no work experience
use Git for the first time
knit a scarf as a complete beginner
make friends in a new city
build a campfire safely
keep cut flowers fresh longer
do a basic push-up correctly
study for a test using flashcards
create a strong password I can remember
reduce my screen time
give constructive feedback to a coworker
sew a button back on a shirt
store fresh herbs
memorize a speech
cook rice on the stove
care for a succulent
start a podcast on a small budget
host a book club
teach a child to ride a bike
make a smoothie bowl
read a nutrition label
prepare a house for winter
write a short bio for a conference
defrost a freezer
take better photos with my phone
wash a wool sweater
set a goal and actually stick to it
calm down before a stressful meeting
make a paper crane
start running again after an injury
make a family tree
clean my laptop keyboard
""")

HOWTO_TEMPLATES = [
    "How do I {t}?",
    "How can I {t}?",
    "What's the best way to {t}?",
    "Can you give me step-by-step instructions to {t}?",
    "I've never done this before: how do I {t}?",
    "Explain how to {t} in five steps or fewer.",
    "What do I need, and what are the steps, to {t}?",
    "Teach me how to {t}. Assume I'm a total beginner.",
    "What are the most common mistakes people make when they try to {t}?",
    "{P}. What's the quickest way to {t}?",
    "Give me a checklist for how to {t}.",
    "Write a short beginner's guide on how to {t}.",
    "how to {t}",
    "My {kid} wants to learn how to {t}. How should I explain it?",
    "Is it hard to {t}? Walk me through it.",
    "I tried to {t} yesterday and it didn't go well. Can you explain the right way to do it?",
]

COMPARE_PAIRS = _pairs("""
cats | dogs | as pets
renting | buying a home | 
Python | JavaScript | for a first programming language
electric cars | gasoline cars | 
tea | coffee | 
working from home | working in an office | 
e-books | paper books | 
running | swimming | for fitness
a gap year | going straight to university | 
Android | iPhone | 
city life | country life | 
public schools | private schools | 
credit cards | debit cards | 
learning guitar | learning piano | 
taking the train | flying | for a 500-km trip
a Roth IRA | a traditional IRA | 
SQL databases | NoSQL databases | 
Windows | macOS | for a college student
laptops | desktop computers | for gaming
freelancing | full-time employment | 
yoga | pilates | 
camping | staying in a hotel | 
baking with butter | baking with oil | 
gas stoves | induction cooktops | 
solar power | wind power | 
nuclear energy | coal | 
Spotify | buying music | 
a cruise | a road trip | for a family vacation
studying in the morning | studying at night | 
handwriting notes | typing notes | 
fixed-rate mortgages | variable-rate mortgages | 
a dog from a shelter | a dog from a breeder | 
Marvel | DC | 
hiking boots | trail runners | 
a bachelor's degree | a coding bootcamp | for becoming a software developer
living alone | living with roommates | 
paper maps | GPS apps | 
meal kits | grocery shopping | 
a Kindle | a tablet | for reading
classical music | jazz | for studying
the Roman Republic | the Roman Empire | 
capitalism | socialism | 
introverts | extroverts | at work
Spanish | French | for an English speaker to learn
leasing a car | buying a car | 
a standing desk | a regular desk | 
spreadsheets | databases | for a small business
mountains | beaches | for a holiday
lists | tuples | in Python
TCP | UDP | 
""", sep="|")

COMPARE_TEMPLATES = [
    "What are the pros and cons of {a} versus {b}{ctx}?",
    "{A} or {b}{ctx}? Help me decide.",
    "Compare {a} and {b}{ctx}.",
    "Make a table comparing {a} and {b}{ctx}.",
    "What's the difference between {a} and {b}?",
    "Which is better{ctx}, {a} or {b}? Give me a balanced answer.",
    "{P}. Should I go with {a} or {b}{ctx}?",
    "Give me three reasons to choose {a} and three reasons to choose {b}{ctx}.",
    "I keep going back and forth between {a} and {b}{ctx}. What questions should I ask myself to decide?",
    "Explain the main differences between {a} and {b} in plain language.",
    "Is {a} really better than {b}{ctx}, or is that a myth?",
    "Write a short, fair comparison of {a} and {b}{ctx}, ending with a recommendation for a beginner.",
    "What would a fan of {a} say to convince a fan of {b}?",
    "{A} vs {b}{ctx}: give me your honest take in a few sentences.",
]


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

VOCAB_WORDS = _lines("""
ubiquitous
ephemeral
serendipity
pragmatic
ambiguous
resilience
meticulous
nostalgia
candid
benevolent
cacophony
diligent
eloquent
frugal
gregarious
hubris
juxtaposition
lethargic
mundane
nuance
obsolete
paradox
quintessential
redundant
sanguine
tenacious
verbose
whimsical
zealous
altruism
apathy
brevity
catharsis
dichotomy
empathy
facetious
gratuitous
hypothesis
innate
jargon
kinship
lucid
melancholy
nonchalant
ostracize
pedantic
quandary
reticent
stoic
tangible
utopia
vindicate
wanderlust
zenith
anecdote
bureaucracy
conundrum
deference
enigma
fortuitous
gaslighting
hindsight
irony
lackadaisical
mitigate
nefarious
onomatopoeia
placebo
querulous
rhetoric
sycophant
trepidation
unprecedented
vicarious
wistful
schadenfreude
hygge
procrastination
photosynthesis
metaphor
alliteration
hyperbole
sarcasm
satire
allegory
oxymoron
inflation
recession
dividend
mortgage
equity
liquidity
algorithm
bandwidth
encryption
latency
firmware
cache
API
cryptocurrency
ecosystem
biodiversity
sustainability
carbon footprint
gentrification
democracy
sovereignty
filibuster
gerrymandering
plagiarism
peer review
""")

IDIOMS = _lines("""
break the ice
bite the bullet
the ball is in your court
once in a blue moon
let the cat out of the bag
hit the nail on the head
under the weather
cost an arm and a leg
spill the beans
burn the midnight oil
a blessing in disguise
cut corners
get cold feet
on thin ice
the elephant in the room
barking up the wrong tree
beat around the bush
a piece of cake
pull someone's leg
jump on the bandwagon
back to square one
miss the boat
throw in the towel
when pigs fly
read between the lines
add insult to injury
call it a day
hit the sack
sit on the fence
steal someone's thunder
""")

CONFUSED_PAIRS = _pairs("""
affect | effect
then | than
their | there
complement | compliment
principal | principle
fewer | less
further | farther
lie | lay
who | whom
its | it's
stationary | stationery
discreet | discrete
ensure | insure
imply | infer
emigrate | immigrate
accept | except
loose | lose
advice | advise
i.e. | e.g.
compose | comprise
weather | whether
elicit | illicit
historic | historical
continual | continuous
sympathy | empathy
weather | climate
virus | bacteria
speed | velocity
mass | weight
hypothesis | theory
""")

DEFINE_TEMPLATES = [
    "What does \"{w}\" mean?",
    "Define {w} and use it in a sentence.",
    "What's the meaning of the word {w}? Give me two example sentences.",
    "Can you explain what {w} means in simple terms?",
    "I keep seeing the word \"{w}\" everywhere. What does it mean, exactly?",
    "What's a synonym for {w}, and is there any difference in meaning?",
    "Where does the word {w} come from?",
    "Explain {w} to {aud}.",
    "Is \"{w}\" a positive or negative word? How would I use it correctly?",
    "{w}: definition, please.",
    "Give me a short definition of {w}, plus its opposite.",
    "My {kid} asked me what {w} means. How should I explain it?",
    "Use the word {w} in three sentences with different contexts.",
    "What does {w} mean in everyday conversation versus in a textbook?",
]

IDIOM_TEMPLATES = [
    "What does \"{i}\" mean?",
    "Where does the expression \"{i}\" come from?",
    "I'm learning English. Can you explain the idiom \"{i}\" with an example?",
    "Is \"{i}\" too informal to use in a work email?",
    "Give me an example of someone using \"{i}\" in a conversation.",
    "What's the literal meaning versus the real meaning of \"{i}\"?",
]

CONFUSED_TEMPLATES = [
    "What's the difference between {a} and {b}?",
    "I always mix up {a} and {b}. Is there a trick to remember which is which?",
    "When should I use {a} instead of {b}?",
    "Explain {a} vs. {b} with examples.",
    "Can you give me a quick quiz with five sentences where I have to choose between {a} and {b}?",
]

CAPITALS = _lines("""
Australia
Canada
Brazil
Kenya
Japan
Turkey
New Zealand
Switzerland
Morocco
Vietnam
Egypt
Argentina
Norway
South Korea
Nigeria
Pakistan
Peru
Iceland
Portugal
Thailand
Mongolia
Chile
Finland
Ghana
""")

AUTHORED = _lines("""
Pride and Prejudice
One Hundred Years of Solitude
Don Quixote
The Odyssey
1984
War and Peace
The Great Gatsby
Things Fall Apart
Hamlet
The Tale of Genji
Moby-Dick
The Little Prince
Beloved
Frankenstein
Crime and Punishment
The Divine Comedy
""")

INVENTIONS = _lines("""
inventing the telephone
creating the World Wide Web
inventing the light bulb
inventing the printing press
discovering penicillin
creating the periodic table
improving the steam engine
developing the polio vaccine
proposing the theory of evolution by natural selection
formulating the laws of motion
writing the first computer program
inventing the radio
discovering radioactivity
""")

TRIVIA_QUESTIONS = _lines("""
What is the largest planet in our solar system?
How many bones are in the adult human body?
What is the longest river in Africa?
Which element has the chemical symbol Au?
How many players are on a soccer team on the field?
What is the smallest country in the world?
Which ocean is the largest?
What is the hardest natural substance?
How many hearts does an octopus have?
What is the tallest mountain in the world?
In which year did humans first land on the Moon?
What is the most spoken language in the world by number of native speakers?
How many continents are there?
What gas do plants absorb from the air?
Which planet is known as the Red Planet?
What is the freezing point of water in Fahrenheit?
Who painted the Mona Lisa?
What is the largest mammal on Earth?
How many strings does a standard guitar have?
What is the capital city of Australia?
Which country has the most islands?
What is the chemical formula for water?
How long does it take light from the Sun to reach Earth?
What is the largest desert in the world?
Which blood type is known as the universal donor?
How many keys are on a standard piano?
What is the main ingredient in guacamole?
What is the fastest land animal?
Which country gave the Statue of Liberty to the United States?
How many minutes are in a day?
What is the square root of 144?
Which planet has the most moons?
What language has the most words?
What is the national animal of Scotland?
How many sides does a hexagon have?
What's the deepest point in the ocean?
Which organ produces insulin?
Who wrote the Odyssey?
What is the currency of Japan?
What is the boiling point of water at sea level in Celsius?
Which metal is liquid at room temperature?
How many teeth does an adult human have?
What's the largest organ of the human body?
Which instrument has 88 keys?
What is the most abundant gas in Earth's atmosphere?
How many time zones does Russia have?
What is the oldest known city that is still inhabited?
Which bird can fly backwards?
What's the only letter that doesn't appear in any US state name?
Which country invented paper?
""")

TRIVIA_TOPICS = _lines("""
space
the human body
world capitals
animals
famous inventions
the Olympics
ancient Egypt
music
world geography
food and cooking
the ocean
dinosaurs
famous paintings
mathematics
the 1990s
""")

TRIVIA_WRAPPERS = [
    "{q}",
    "{q}",
    "Trivia time! {q}",
    "Quick quiz question: {q} Just the answer, please.",
    "{q} And give me one more fun fact about it.",
    "I'm making a pub quiz. Is this a good question: \"{q}\" What's the answer?",
    "Settle a debate for us: {q}",
    "{q} Explain how we know.",
    "My friend says she knows this one: {q} Do you?",
    "Here's one for you: {lq}",
]

TRIVIA_GENERATED = [
    ("cap", "What is the capital of {c}?"),
    ("cap", "What's the capital city of {c}, and roughly how many people live there?"),
    ("auth", "Who wrote {b}?"),
    ("auth", "Who is the author of {b}, and when was it written?"),
    ("inv", "Who is credited with {inv}?"),
    ("inv", "What's the story behind {inv}?"),
    ("set", "Give me {n} trivia questions about {t}, with the answers at the end."),
    ("set", "Make a {n}-question multiple-choice quiz about {t}."),
    ("set", "Quiz me on {t}. Ask one question at a time."),
    ("set", "Write {n} true-or-false statements about {t} and tell me which are true."),
]


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

FOLLOWUP_QUESTIONS = _lines("""
Can you give me a concrete example?
How does that apply in everyday life?
What's the most important thing to remember about it?
Could you explain the part you mentioned at the end in more detail?
Is there a common mistake people make with this?
Can you put that in a table?
What would be a good next step for me to learn more?
Is that still true today?
Can you give me a simpler version for a child?
How confident are you about that?
""")

PAST_ADVICE = _lines("""
keep a sleep diary
try the Pomodoro technique
write down three things I'm grateful for every night
go for a short walk after lunch
use a budgeting app
talk to my manager directly
set a timer for my phone use
join a local club to meet people
practice the speech in front of a mirror
prepare my clothes the night before
cook a big batch of food on Sundays
break the project into smaller tasks
""")

CLAIMS = _lines("""
bats are blind
we only use 10% of our brains
goldfish have a three-second memory
lightning never strikes the same place twice
the Great Wall of China is visible from space
cracking your knuckles causes arthritis
sugar makes children hyperactive
you lose most of your body heat through your head
bulls are enraged by the color red
Napoleon was unusually short
people in the Middle Ages thought the Earth was flat
chameleons change color to match their background
you should wait an hour after eating before swimming
humans have five senses
hair and nails keep growing after death
""")

FEATURES = _lines("""
error handling
type hints
a command-line interface
logging
unit tests
support for negative numbers
comments for each step
a progress bar
input validation
an option to save the results to a file
""")

FOLLOWUP_TEMPLATES = [
    ("sci", "Earlier you explained {t}. {q}"),
    ("sci", "Thanks for the explanation of {t}. One more question: {lq}"),
    ("sci", "Going back to what we discussed about {t}: how does that relate to {t2}?"),
    ("sci", "You mentioned {t} in your last answer. Can you go deeper on that?"),
    ("sci", "Can you make your previous answer about {t} shorter and simpler?"),
    ("sci", "In my last message I asked about {t}. Actually, I meant for {aud}. Can you redo the explanation?"),
    ("sci", "Sorry, I didn't understand your explanation of {t}. Can you try again with an analogy?"),
    ("howto", "Following up on your instructions for how to {h}: what if I don't have any special tools?"),
    ("howto", "I tried your steps to {h}, but I got stuck on the second one. Can you explain it differently?"),
    ("howto", "You told me how to {h}. How long should the whole thing take for a beginner?"),
    ("advice", "Last time you suggested I {a}. I tried it for a week and it didn't really help. What else could I try?"),
    ("advice", "You said I should {a}. What's the best way to start?"),
    ("advice", "Earlier you recommended that I {a}. Why does that work?"),
    ("claim", "You said that {c}. Is that actually true? I read that it's a myth."),
    ("claim", "Wait, in your last answer you said {c}. Where does that idea come from?"),
    ("story", "That story about {ch} was great. Can you write a sequel where things go wrong?"),
    ("story", "I liked the story you wrote about {ch}, but can you make the ending happier?"),
    ("story", "Can you rewrite your story about {ch} so it's suitable for a five-year-old?"),
    ("code", "The function you gave me to {ct} works, but can you add {f}?"),
    ("code", "About the code you wrote to {ct}: can you explain why you used a loop there instead of recursion?"),
    ("code", "The code you wrote to {ct} fails on empty input. Can you fix it?"),
    ("place", "We were talking about {p} earlier. What's the best time of year to visit?"),
    ("place", "You told me some things about the history of {p}. What about its food?"),
    ("list", "Before, you listed some {x}. Could you expand on the second one?"),
    ("list", "From the {x} you gave me, which one would you pick and why?"),
    ("list", "Those {x} were a bit generic. Can you give me some more original ones?"),
]


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


ROLES = _lines("""
a friendly tour guide in Rome
a medieval blacksmith
a pirate captain
a job interviewer at a software company
a patient piano teacher
a barista at a busy café
an astronaut on the International Space Station
a detective in 1920s London
a park ranger at Yellowstone
a personal trainer on my first day at the gym
a wise old wizard
a customer service agent for an airline
a librarian in a magical library
a nervous first-time pilot
a sports commentator
a Roman senator
a chef teaching a cooking class
a museum guide at a natural history museum
a motivational coach
a time traveler from the year 3000
a grumpy cat
a radio DJ doing a late-night show
a lighthouse keeper in 1890
a news reporter covering a volcano eruption
a nutritionist
a car salesperson who is very honest
a dragon guarding its treasure
a kindergarten teacher
a ship's doctor in the 1700s
an alien visiting Earth for the first time
""")

ROLE_REQUESTS = _lines("""
Introduce yourself and describe a typical day.
Tell me about the hardest part of your job.
Describe what you can see around you right now.
Give me one piece of advice you wish you'd known earlier.
I'm a newcomer. Welcome me and tell me what to expect.
Tell me a story about the strangest thing that ever happened to you.
What do you think about modern technology?
Answer my questions in character. First question: what did you have for breakfast?
Explain your job to a child.
Convince me to try something new today.
""")

ROLE_TEMPLATES = [
    "Pretend you are {role}. {req}",
    "Let's do a role-play. You're {role}. {req}",
    "Act as {role}. {req}",
    "I want you to play {role}. Stay in character. {req}",
    "Imagine you're {role}. {req} Keep it under 150 words.",
    "You are {role}, and I've just walked in. {req}",
    "For a creative writing exercise, speak as {role}. {req}",
]

PRACTICE_SCENARIOS = _lines("""
a job interview for a marketing assistant position
ordering food at a restaurant in English
a salary negotiation
returning a broken item to a store
a parent-teacher conference
a difficult conversation with a roommate about chores
a customer calling to complain about a late delivery
asking my boss for a day off
a first meeting with a new client
a debate about school uniforms
""")

PRACTICE_TEMPLATES = [
    "Let's practice {s}. You start, and ask me one question at a time.",
    "Can you role-play {s} with me? I'll play myself. Begin the conversation.",
    "I'm nervous about {s}. Play the other person so I can practice. Start with a greeting.",
    "Help me rehearse {s}. Give me your first line, then wait for my reply.",
]


def gen_roleplay(r: random.Random) -> tuple[str, str]:
    if r.random() < 0.75:
        ti, role = r.randrange(len(ROLE_TEMPLATES)), r.choice(ROLES)
        return f"r{ti}|{role}", _casual(r, ROLE_TEMPLATES[ti].format(role=role, req=r.choice(ROLE_REQUESTS)))
    ti, s = r.randrange(len(PRACTICE_TEMPLATES)), r.choice(PRACTICE_SCENARIOS)
    return f"p{ti}|{s}", _casual(r, PRACTICE_TEMPLATES[ti].format(s=s))

# King James Version passages (public domain), extracted once from Debian's bible-kjv-text package with
# `bible -l 5000 <ref>`; embedded so that regeneration never depends on that package being installed.
_KJV_PASSAGES: list[tuple[str, str]] = [
    ('Genesis 1:1-8',
     'In the beginning God created the heaven and the earth. And the earth was without form, and void; and '
     'darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God '
     'said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the '
     'light from the darkness. And God called the light Day, and the darkness he called Night. And the evening and'
     ' the morning were the first day. And God said, Let there be a firmament in the midst of the waters, and let '
     'it divide the waters from the waters. And God made the firmament, and divided the waters which were under '
     'the firmament from the waters which were above the firmament: and it was so. And God called the firmament '
     'Heaven. And the evening and the morning were the second day.'),
    ('Genesis 11:1-9',
     'And the whole earth was of one language, and of one speech. And it came to pass, as they journeyed from the '
     'east, that they found a plain in the land of Shinar; and they dwelt there. And they said one to another, Go '
     'to, let us make brick, and burn them thoroughly. And they had brick for stone, and slime had they for '
     'morter. And they said, Go to, let us build us a city and a tower, whose top may reach unto heaven; and let '
     'us make us a name, lest we be scattered abroad upon the face of the whole earth. And the LORD came down to '
     'see the city and the tower, which the children of men builded. And the LORD said, Behold, the people is one,'
     ' and they have all one language; and this they begin to do: and now nothing will be restrained from them, '
     'which they have imagined to do. Go to, let us go down, and there confound their language, that they may not '
     "understand one another's speech. So the LORD scattered them abroad from thence upon the face of all the "
     'earth: and they left off to build the city. Therefore is the name of it called Babel; because the LORD did '
     'there confound the language of all the earth: and from thence did the LORD scatter them abroad upon the face'
     ' of all the earth.'),
    ('Genesis 37:3-8',
     'Now Israel loved Joseph more than all his children, because he was the son of his old age: and he made him a'
     ' coat of many colours. And when his brethren saw that their father loved him more than all his brethren, '
     'they hated him, and could not speak peaceably unto him. And Joseph dreamed a dream, and he told it his '
     'brethren: and they hated him yet the more. And he said unto them, Hear, I pray you, this dream which I have '
     'dreamed: For, behold, we were binding sheaves in the field, and, lo, my sheaf arose, and also stood upright;'
     ' and, behold, your sheaves stood round about, and made obeisance to my sheaf. And his brethren said to him, '
     'Shalt thou indeed reign over us? or shalt thou indeed have dominion over us? And they hated him yet the more'
     ' for his dreams, and for his words.'),
    ('Exodus 3:1-6',
     'Now Moses kept the flock of Jethro his father in law, the priest of Midian: and he led the flock to the '
     'backside of the desert, and came to the mountain of God, even to Horeb. And the angel of the LORD appeared '
     'unto him in a flame of fire out of the midst of a bush: and he looked, and, behold, the bush burned with '
     'fire, and the bush was not consumed. And Moses said, I will now turn aside, and see this great sight, why '
     'the bush is not burnt. And when the LORD saw that he turned aside to see, God called unto him out of the '
     'midst of the bush, and said, Moses, Moses. And he said, Here am I. And he said, Draw not nigh hither: put '
     'off thy shoes from off thy feet, for the place whereon thou standest is holy ground. Moreover he said, I am '
     'the God of thy father, the God of Abraham, the God of Isaac, and the God of Jacob. And Moses hid his face; '
     'for he was afraid to look upon God.'),
    ('Exodus 14:21-25',
     'And Moses stretched out his hand over the sea; and the LORD caused the sea to go back by a strong east wind '
     'all that night, and made the sea dry land, and the waters were divided. And the children of Israel went into'
     ' the midst of the sea upon the dry ground: and the waters were a wall unto them on their right hand, and on '
     "their left. And the Egyptians pursued, and went in after them to the midst of the sea, even all Pharaoh's "
     'horses, his chariots, and his horsemen. And it came to pass, that in the morning watch the LORD looked unto '
     'the host of the Egyptians through the pillar of fire and of the cloud, and troubled the host of the '
     'Egyptians, And took off their chariot wheels, that they drave them heavily: so that the Egyptians said, Let '
     'us flee from the face of Israel; for the LORD fighteth for them against the Egyptians.'),
    ('Ruth 1:15-18',
     'And she said, Behold, thy sister in law is gone back unto her people, and unto her gods: return thou after '
     'thy sister in law. And Ruth said, Intreat me not to leave thee, or to return from following after thee: for '
     'whither thou goest, I will go; and where thou lodgest, I will lodge: thy people shall be my people, and thy '
     'God my God: Where thou diest, will I die, and there will I be buried: the LORD do so to me, and more also, '
     'if ought but death part thee and me. When she saw that she was stedfastly minded to go with her, then she '
     'left speaking unto her.'),
    ('1 Samuel 17:45-49',
     'Then said David to the Philistine, Thou comest to me with a sword, and with a spear, and with a shield: but '
     'I come to thee in the name of the LORD of hosts, the God of the armies of Israel, whom thou hast defied. '
     'This day will the LORD deliver thee into mine hand; and I will smite thee, and take thine head from thee; '
     'and I will give the carcases of the host of the Philistines this day unto the fowls of the air, and to the '
     'wild beasts of the earth; that all the earth may know that there is a God in Israel. And all this assembly '
     "shall know that the LORD saveth not with sword and spear: for the battle is the LORD's, and he will give you"
     ' into our hands. And it came to pass, when the Philistine arose, and came, and drew nigh to meet David, that'
     ' David hastened, and ran toward the army to meet the Philistine. And David put his hand in his bag, and took'
     ' thence a stone, and slang it, and smote the Philistine in his forehead, that the stone sunk into his '
     'forehead; and he fell upon his face to the earth.'),
    ('1 Kings 3:16-27',
     'Then came there two women, that were harlots, unto the king, and stood before him. And the one woman said, O'
     ' my lord, I and this woman dwell in one house; and I was delivered of a child with her in the house. And it '
     'came to pass the third day after that I was delivered, that this woman was delivered also: and we were '
     "together; there was no stranger with us in the house, save we two in the house. And this woman's child died "
     'in the night; because she overlaid it. And she arose at midnight, and took my son from beside me, while '
     'thine handmaid slept, and laid it in her bosom, and laid her dead child in my bosom. And when I rose in the '
     'morning to give my child suck, behold, it was dead: but when I had considered it in the morning, behold, it '
     'was not my son, which I did bear. And the other woman said, Nay; but the living is my son, and the dead is '
     'thy son. And this said, No; but the dead is thy son, and the living is my son. Thus they spake before the '
     'king. Then said the king, The one saith, This is my son that liveth, and thy son is the dead: and the other '
     'saith, Nay; but thy son is the dead, and my son is the living. And the king said, Bring me a sword. And they'
     ' brought a sword before the king. And the king said, Divide the living child in two, and give half to the '
     'one, and half to the other. Then spake the woman whose the living child was unto the king, for her bowels '
     'yearned upon her son, and she said, O my lord, give her the living child, and in no wise slay it. But the '
     'other said, Let it be neither mine nor thine, but divide it. Then the king answered and said, Give her the '
     'living child, and in no wise slay it: she is the mother thereof.'),
    ('Job 38:1-11',
     'Then the LORD answered Job out of the whirlwind, and said, Who is this that darkeneth counsel by words '
     'without knowledge? Gird up now thy loins like a man; for I will demand of thee, and answer thou me. Where '
     'wast thou when I laid the foundations of the earth? declare, if thou hast understanding. Who hath laid the '
     'measures thereof, if thou knowest? or who hath stretched the line upon it? Whereupon are the foundations '
     'thereof fastened? or who laid the corner stone thereof; When the morning stars sang together, and all the '
     'sons of God shouted for joy? Or who shut up the sea with doors, when it brake forth, as if it had issued out'
     ' of the womb? When I made the cloud the garment thereof, and thick darkness a swaddlingband for it, And '
     'brake up for it my decreed place, and set bars and doors, And said, Hitherto shalt thou come, but no '
     'further: and here shall thy proud waves be stayed?'),
    ('Psalms 1:1-6',
     'Blessed is the man that walketh not in the counsel of the ungodly, nor standeth in the way of sinners, nor '
     'sitteth in the seat of the scornful. But his delight is in the law of the LORD; and in his law doth he '
     'meditate day and night. And he shall be like a tree planted by the rivers of water, that bringeth forth his '
     'fruit in his season; his leaf also shall not wither; and whatsoever he doeth shall prosper. The ungodly are '
     'not so: but are like the chaff which the wind driveth away. Therefore the ungodly shall not stand in the '
     'judgment, nor sinners in the congregation of the righteous. For the LORD knoweth the way of the righteous: '
     'but the way of the ungodly shall perish.'),
    ('Psalms 8:1-9',
     'O LORD, our Lord, how excellent is thy name in all the earth! who hast set thy glory above the heavens. Out '
     'of the mouth of babes and sucklings hast thou ordained strength because of thine enemies, that thou mightest'
     ' still the enemy and the avenger. When I consider thy heavens, the work of thy fingers, the moon and the '
     'stars, which thou hast ordained; What is man, that thou art mindful of him? and the son of man, that thou '
     'visitest him? For thou hast made him a little lower than the angels, and hast crowned him with glory and '
     'honour. Thou madest him to have dominion over the works of thy hands; thou hast put all things under his '
     'feet: All sheep and oxen, yea, and the beasts of the field; The fowl of the air, and the fish of the sea, '
     'and whatsoever passeth through the paths of the seas. O LORD our Lord, how excellent is thy name in all the '
     'earth!'),
    ('Psalms 19:1-6',
     'The heavens declare the glory of God; and the firmament sheweth his handywork. Day unto day uttereth speech,'
     ' and night unto night sheweth knowledge. There is no speech nor language, where their voice is not heard. '
     'Their line is gone out through all the earth, and their words to the end of the world. In them hath he set a'
     ' tabernacle for the sun, Which is as a bridegroom coming out of his chamber, and rejoiceth as a strong man '
     'to run a race. His going forth is from the end of the heaven, and his circuit unto the ends of it: and there'
     ' is nothing hid from the heat thereof.'),
    ('Psalms 23:1-6',
     'The LORD is my shepherd; I shall not want. He maketh me to lie down in green pastures: he leadeth me beside '
     "the still waters. He restoreth my soul: he leadeth me in the paths of righteousness for his name's sake. "
     'Yea, though I walk through the valley of the shadow of death, I will fear no evil: for thou art with me; thy'
     ' rod and thy staff they comfort me. Thou preparest a table before me in the presence of mine enemies: thou '
     'anointest my head with oil; my cup runneth over. Surely goodness and mercy shall follow me all the days of '
     'my life: and I will dwell in the house of the LORD for ever.'),
    ('Psalms 46:1-7',
     'God is our refuge and strength, a very present help in trouble. Therefore will not we fear, though the earth'
     ' be removed, and though the mountains be carried into the midst of the sea; Though the waters thereof roar '
     'and be troubled, though the mountains shake with the swelling thereof. Selah. There is a river, the streams '
     'whereof shall make glad the city of God, the holy place of the tabernacles of the most High. God is in the '
     'midst of her; she shall not be moved: God shall help her, and that right early. The heathen raged, the '
     'kingdoms were moved: he uttered his voice, the earth melted. The LORD of hosts is with us; the God of Jacob '
     'is our refuge. Selah.'),
    ('Psalms 121:1-8',
     'I will lift up mine eyes unto the hills, from whence cometh my help. My help cometh from the LORD, which '
     'made heaven and earth. He will not suffer thy foot to be moved: he that keepeth thee will not slumber. '
     'Behold, he that keepeth Israel shall neither slumber nor sleep. The LORD is thy keeper: the LORD is thy '
     'shade upon thy right hand. The sun shall not smite thee by day, nor the moon by night. The LORD shall '
     'preserve thee from all evil: he shall preserve thy soul. The LORD shall preserve thy going out and thy '
     'coming in from this time forth, and even for evermore.'),
    ('Proverbs 3:1-8',
     'My son, forget not my law; but let thine heart keep my commandments: For length of days, and long life, and '
     'peace, shall they add to thee. Let not mercy and truth forsake thee: bind them about thy neck; write them '
     'upon the table of thine heart: So shalt thou find favour and good understanding in the sight of God and man.'
     ' Trust in the LORD with all thine heart; and lean not unto thine own understanding. In all thy ways '
     'acknowledge him, and he shall direct thy paths. Be not wise in thine own eyes: fear the LORD, and depart '
     'from evil. It shall be health to thy navel, and marrow to thy bones.'),
    ('Proverbs 6:6-11',
     'Go to the ant, thou sluggard; consider her ways, and be wise: Which having no guide, overseer, or ruler, '
     'Provideth her meat in the summer, and gathereth her food in the harvest. How long wilt thou sleep, O '
     'sluggard? when wilt thou arise out of thy sleep? Yet a little sleep, a little slumber, a little folding of '
     'the hands to sleep: So shall thy poverty come as one that travelleth, and thy want as an armed man.'),
    ('Ecclesiastes 1:2-9',
     'Vanity of vanities, saith the Preacher, vanity of vanities; all is vanity. What profit hath a man of all his'
     ' labour which he taketh under the sun? One generation passeth away, and another generation cometh: but the '
     'earth abideth for ever. The sun also ariseth, and the sun goeth down, and hasteth to his place where he '
     'arose. The wind goeth toward the south, and turneth about unto the north; it whirleth about continually, and'
     ' the wind returneth again according to his circuits. All the rivers run into the sea; yet the sea is not '
     'full; unto the place from whence the rivers come, thither they return again. All things are full of labour; '
     'man cannot utter it: the eye is not satisfied with seeing, nor the ear filled with hearing. The thing that '
     'hath been, it is that which shall be; and that which is done is that which shall be done: and there is no '
     'new thing under the sun.'),
    ('Ecclesiastes 3:1-8',
     'To every thing there is a season, and a time to every purpose under the heaven: A time to be born, and a '
     'time to die; a time to plant, and a time to pluck up that which is planted; A time to kill, and a time to '
     'heal; a time to break down, and a time to build up; A time to weep, and a time to laugh; a time to mourn, '
     'and a time to dance; A time to cast away stones, and a time to gather stones together; a time to embrace, '
     'and a time to refrain from embracing; A time to get, and a time to lose; a time to keep, and a time to cast '
     'away; A time to rend, and a time to sew; a time to keep silence, and a time to speak; A time to love, and a '
     'time to hate; a time of war, and a time of peace.'),
    ('Ecclesiastes 12:1-7',
     'Remember now thy Creator in the days of thy youth, while the evil days come not, nor the years draw nigh, '
     'when thou shalt say, I have no pleasure in them; While the sun, or the light, or the moon, or the stars, be '
     'not darkened, nor the clouds return after the rain: In the day when the keepers of the house shall tremble, '
     'and the strong men shall bow themselves, and the grinders cease because they are few, and those that look '
     'out of the windows be darkened, And the doors shall be shut in the streets, when the sound of the grinding '
     'is low, and he shall rise up at the voice of the bird, and all the daughters of musick shall be brought low;'
     ' Also when they shall be afraid of that which is high, and fears shall be in the way, and the almond tree '
     'shall flourish, and the grasshopper shall be a burden, and desire shall fail: because man goeth to his long '
     'home, and the mourners go about the streets: Or ever the silver cord be loosed, or the golden bowl be '
     'broken, or the pitcher be broken at the fountain, or the wheel broken at the cistern. Then shall the dust '
     'return to the earth as it was: and the spirit shall return unto God who gave it.'),
    ('Song of Solomon 2:10-13',
     'My beloved spake, and said unto me, Rise up, my love, my fair one, and come away. For, lo, the winter is '
     'past, the rain is over and gone; The flowers appear on the earth; the time of the singing of birds is come, '
     'and the voice of the turtle is heard in our land; The fig tree putteth forth her green figs, and the vines '
     'with the tender grape give a good smell. Arise, my love, my fair one, and come away.'),
    ('Isaiah 2:2-4',
     "And it shall come to pass in the last days, that the mountain of the LORD's house shall be established in "
     'the top of the mountains, and shall be exalted above the hills; and all nations shall flow unto it. And many'
     ' people shall go and say, Come ye, and let us go up to the mountain of the LORD, to the house of the God of '
     'Jacob; and he will teach us of his ways, and we will walk in his paths: for out of Zion shall go forth the '
     'law, and the word of the LORD from Jerusalem. And he shall judge among the nations, and shall rebuke many '
     'people: and they shall beat their swords into plowshares, and their spears into pruninghooks: nation shall '
     'not lift up sword against nation, neither shall they learn war any more.'),
    ('Isaiah 40:28-31',
     'Hast thou not known? hast thou not heard, that the everlasting God, the LORD, the Creator of the ends of the'
     ' earth, fainteth not, neither is weary? there is no searching of his understanding. He giveth power to the '
     'faint; and to them that have no might he increaseth strength. Even the youths shall faint and be weary, and '
     'the young men shall utterly fall: But they that wait upon the LORD shall renew their strength; they shall '
     'mount up with wings as eagles; they shall run, and not be weary; and they shall walk, and not faint.'),
    ('Lamentations 3:22-26',
     "It is of the LORD's mercies that we are not consumed, because his compassions fail not. They are new every "
     'morning: great is thy faithfulness. The LORD is my portion, saith my soul; therefore will I hope in him. The'
     ' LORD is good unto them that wait for him, to the soul that seeketh him. It is good that a man should both '
     'hope and quietly wait for the salvation of the LORD.'),
    ('Daniel 6:16-22',
     'Then the king commanded, and they brought Daniel, and cast him into the den of lions. Now the king spake and'
     ' said unto Daniel, Thy God whom thou servest continually, he will deliver thee. And a stone was brought, and'
     ' laid upon the mouth of the den; and the king sealed it with his own signet, and with the signet of his '
     'lords; that the purpose might not be changed concerning Daniel. Then the king went to his palace, and passed'
     ' the night fasting: neither were instruments of musick brought before him: and his sleep went from him. Then'
     ' the king arose very early in the morning, and went in haste unto the den of lions. And when he came to the '
     'den, he cried with a lamentable voice unto Daniel: and the king spake and said to Daniel, O Daniel, servant '
     'of the living God, is thy God, whom thou servest continually, able to deliver thee from the lions? Then said'
     " Daniel unto the king, O king, live for ever. My God hath sent his angel, and hath shut the lions' mouths, "
     'that they have not hurt me: forasmuch as before him innocency was found in me; and also before thee, O king,'
     ' have I done no hurt.'),
    ('Jonah 1:1-4',
     'Now the word of the LORD came unto Jonah the son of Amittai, saying, Arise, go to Nineveh, that great city, '
     'and cry against it; for their wickedness is come up before me. But Jonah rose up to flee unto Tarshish from '
     'the presence of the LORD, and went down to Joppa; and he found a ship going to Tarshish: so he paid the fare'
     ' thereof, and went down into it, to go with them unto Tarshish from the presence of the LORD. But the LORD '
     'sent out a great wind into the sea, and there was a mighty tempest in the sea, so that the ship was like to '
     'be broken.'),
    ('Jonah 1:15-17',
     'So they took up Jonah, and cast him forth into the sea: and the sea ceased from her raging. Then the men '
     'feared the LORD exceedingly, and offered a sacrifice unto the LORD, and made vows. Now the LORD had prepared'
     ' a great fish to swallow up Jonah. And Jonah was in the belly of the fish three days and three nights.'),
    ('Micah 6:6-8',
     'Wherewith shall I come before the LORD, and bow myself before the high God? shall I come before him with '
     'burnt offerings, with calves of a year old? Will the LORD be pleased with thousands of rams, or with ten '
     'thousands of rivers of oil? shall I give my firstborn for my transgression, the fruit of my body for the sin'
     ' of my soul? He hath shewed thee, O man, what is good; and what doth the LORD require of thee, but to do '
     'justly, and to love mercy, and to walk humbly with thy God?'),
    ('Amos 5:21-24',
     'I hate, I despise your feast days, and I will not smell in your solemn assemblies. Though ye offer me burnt '
     'offerings and your meat offerings, I will not accept them: neither will I regard the peace offerings of your'
     ' fat beasts. Take thou away from me the noise of thy songs; for I will not hear the melody of thy viols. But'
     ' let judgment run down as waters, and righteousness as a mighty stream.'),
    ('Matthew 5:3-10',
     'Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are they that mourn: for they '
     'shall be comforted. Blessed are the meek: for they shall inherit the earth. Blessed are they which do hunger'
     ' and thirst after righteousness: for they shall be filled. Blessed are the merciful: for they shall obtain '
     'mercy. Blessed are the pure in heart: for they shall see God. Blessed are the peacemakers: for they shall be'
     " called the children of God. Blessed are they which are persecuted for righteousness' sake: for theirs is "
     'the kingdom of heaven.'),
    ('Matthew 6:25-30',
     'Therefore I say unto you, Take no thought for your life, what ye shall eat, or what ye shall drink; nor yet '
     'for your body, what ye shall put on. Is not the life more than meat, and the body than raiment? Behold the '
     'fowls of the air: for they sow not, neither do they reap, nor gather into barns; yet your heavenly Father '
     'feedeth them. Are ye not much better than they? Which of you by taking thought can add one cubit unto his '
     'stature? And why take ye thought for raiment? Consider the lilies of the field, how they grow; they toil '
     'not, neither do they spin: And yet I say unto you, That even Solomon in all his glory was not arrayed like '
     'one of these. Wherefore, if God so clothe the grass of the field, which to day is, and to morrow is cast '
     'into the oven, shall he not much more clothe you, O ye of little faith?'),
    ('Matthew 7:24-27',
     'Therefore whosoever heareth these sayings of mine, and doeth them, I will liken him unto a wise man, which '
     'built his house upon a rock: And the rain descended, and the floods came, and the winds blew, and beat upon '
     'that house; and it fell not: for it was founded upon a rock. And every one that heareth these sayings of '
     'mine, and doeth them not, shall be likened unto a foolish man, which built his house upon the sand: And the '
     'rain descended, and the floods came, and the winds blew, and beat upon that house; and it fell: and great '
     'was the fall of it.'),
    ('Mark 4:35-41',
     'And the same day, when the even was come, he saith unto them, Let us pass over unto the other side. And when'
     ' they had sent away the multitude, they took him even as he was in the ship. And there were also with him '
     'other little ships. And there arose a great storm of wind, and the waves beat into the ship, so that it was '
     'now full. And he was in the hinder part of the ship, asleep on a pillow: and they awake him, and say unto '
     'him, Master, carest thou not that we perish? And he arose, and rebuked the wind, and said unto the sea, '
     'Peace, be still. And the wind ceased, and there was a great calm. And he said unto them, Why are ye so '
     'fearful? how is it that ye have no faith? And they feared exceedingly, and said one to another, What manner '
     'of man is this, that even the wind and the sea obey him?'),
    ('Luke 2:8-14',
     'And there were in the same country shepherds abiding in the field, keeping watch over their flock by night. '
     'And, lo, the angel of the Lord came upon them, and the glory of the Lord shone round about them: and they '
     'were sore afraid. And the angel said unto them, Fear not: for, behold, I bring you good tidings of great '
     'joy, which shall be to all people. For unto you is born this day in the city of David a Saviour, which is '
     'Christ the Lord. And this shall be a sign unto you; Ye shall find the babe wrapped in swaddling clothes, '
     'lying in a manger. And suddenly there was with the angel a multitude of the heavenly host praising God, and '
     'saying, Glory to God in the highest, and on earth peace, good will toward men.'),
    ('Luke 10:30-35',
     'And Jesus answering said, A certain man went down from Jerusalem to Jericho, and fell among thieves, which '
     'stripped him of his raiment, and wounded him, and departed, leaving him half dead. And by chance there came '
     'down a certain priest that way: and when he saw him, he passed by on the other side. And likewise a Levite, '
     'when he was at the place, came and looked on him, and passed by on the other side. But a certain Samaritan, '
     'as he journeyed, came where he was: and when he saw him, he had compassion on him, And went to him, and '
     'bound up his wounds, pouring in oil and wine, and set him on his own beast, and brought him to an inn, and '
     'took care of him. And on the morrow when he departed, he took out two pence, and gave them to the host, and '
     'said unto him, Take care of him; and whatsoever thou spendest more, when I come again, I will repay thee.'),
    ('Luke 15:11-20',
     'And he said, A certain man had two sons: And the younger of them said to his father, Father, give me the '
     'portion of goods that falleth to me. And he divided unto them his living. And not many days after the '
     'younger son gathered all together, and took his journey into a far country, and there wasted his substance '
     'with riotous living. And when he had spent all, there arose a mighty famine in that land; and he began to be'
     ' in want. And he went and joined himself to a citizen of that country; and he sent him into his fields to '
     'feed swine. And he would fain have filled his belly with the husks that the swine did eat: and no man gave '
     "unto him. And when he came to himself, he said, How many hired servants of my father's have bread enough and"
     ' to spare, and I perish with hunger! I will arise and go to my father, and will say unto him, Father, I have'
     ' sinned against heaven, and before thee, And am no more worthy to be called thy son: make me as one of thy '
     'hired servants. And he arose, and came to his father. But when he was yet a great way off, his father saw '
     'him, and had compassion, and ran, and fell on his neck, and kissed him.'),
    ('John 1:1-5',
     'In the beginning was the Word, and the Word was with God, and the Word was God. The same was in the '
     'beginning with God. All things were made by him; and without him was not any thing made that was made. In '
     'him was life; and the life was the light of men. And the light shineth in darkness; and the darkness '
     'comprehended it not.'),
    ('Acts 2:1-4',
     'And when the day of Pentecost was fully come, they were all with one accord in one place. And suddenly there'
     ' came a sound from heaven as of a rushing mighty wind, and it filled all the house where they were sitting. '
     'And there appeared unto them cloven tongues like as of fire, and it sat upon each of them. And they were all'
     ' filled with the Holy Ghost, and began to speak with other tongues, as the Spirit gave them utterance.'),
    ('Romans 12:9-16',
     'Let love be without dissimulation. Abhor that which is evil; cleave to that which is good. Be kindly '
     'affectioned one to another with brotherly love; in honour preferring one another; Not slothful in business; '
     'fervent in spirit; serving the Lord; Rejoicing in hope; patient in tribulation; continuing instant in '
     'prayer; Distributing to the necessity of saints; given to hospitality. Bless them which persecute you: '
     'bless, and curse not. Rejoice with them that do rejoice, and weep with them that weep. Be of the same mind '
     'one toward another. Mind not high things, but condescend to men of low estate. Be not wise in your own '
     'conceits.'),
    ('1 Corinthians 13:1-7',
     'Though I speak with the tongues of men and of angels, and have not charity, I am become as sounding brass, '
     'or a tinkling cymbal. And though I have the gift of prophecy, and understand all mysteries, and all '
     'knowledge; and though I have all faith, so that I could remove mountains, and have not charity, I am '
     'nothing. And though I bestow all my goods to feed the poor, and though I give my body to be burned, and have'
     ' not charity, it profiteth me nothing. Charity suffereth long, and is kind; charity envieth not; charity '
     'vaunteth not itself, is not puffed up, Doth not behave itself unseemly, seeketh not her own, is not easily '
     'provoked, thinketh no evil; Rejoiceth not in iniquity, but rejoiceth in the truth; Beareth all things, '
     'believeth all things, hopeth all things, endureth all things.'),
    ('James 3:3-8',
     "Behold, we put bits in the horses' mouths, that they may obey us; and we turn about their whole body. Behold"
     ' also the ships, which though they be so great, and are driven of fierce winds, yet are they turned about '
     'with a very small helm, whithersoever the governor listeth. Even so the tongue is a little member, and '
     'boasteth great things. Behold, how great a matter a little fire kindleth! And the tongue is a fire, a world '
     'of iniquity: so is the tongue among our members, that it defileth the whole body, and setteth on fire the '
     'course of nature; and it is set on fire of hell. For every kind of beasts, and of birds, and of serpents, '
     'and of things in the sea, is tamed, and hath been tamed of mankind: But the tongue can no man tame; it is an'
     ' unruly evil, full of deadly poison.'),
    ('Revelation 21:1-4',
     'And I saw a new heaven and a new earth: for the first heaven and the first earth were passed away; and there'
     ' was no more sea. And I John saw the holy city, new Jerusalem, coming down from God out of heaven, prepared '
     'as a bride adorned for her husband. And I heard a great voice out of heaven saying, Behold, the tabernacle '
     'of God is with men, and he will dwell with them, and they shall be his people, and God himself shall be with'
     ' them, and be their God. And God shall wipe away all tears from their eyes; and there shall be no more '
     'death, neither sorrow, nor crying, neither shall there be any more pain: for the former things are passed '
     'away.'),
    ('Joshua 6:15-20',
     'And it came to pass on the seventh day, that they rose early about the dawning of the day, and compassed the'
     ' city after the same manner seven times: only on that day they compassed the city seven times. And it came '
     'to pass at the seventh time, when the priests blew with the trumpets, Joshua said unto the people, Shout; '
     'for the LORD hath given you the city. And the city shall be accursed, even it, and all that are therein, to '
     'the LORD: only Rahab the harlot shall live, she and all that are with her in the house, because she hid the '
     'messengers that we sent. And ye, in any wise keep yourselves from the accursed thing, lest ye make '
     'yourselves accursed, when ye take of the accursed thing, and make the camp of Israel a curse, and trouble '
     'it. But all the silver, and gold, and vessels of brass and iron, are consecrated unto the LORD: they shall '
     'come into the treasury of the LORD. So the people shouted when the priests blew with the trumpets: and it '
     'came to pass, when the people heard the sound of the trumpet, and the people shouted with a great shout, '
     'that the wall fell down flat, so that the people went up into the city, every man straight before him, and '
     'they took the city.'),
    ('Genesis 6:13-18',
     'And God said unto Noah, The end of all flesh is come before me; for the earth is filled with violence '
     'through them; and, behold, I will destroy them with the earth. Make thee an ark of gopher wood; rooms shalt '
     'thou make in the ark, and shalt pitch it within and without with pitch. And this is the fashion which thou '
     'shalt make it of: The length of the ark shall be three hundred cubits, the breadth of it fifty cubits, and '
     'the height of it thirty cubits. A window shalt thou make to the ark, and in a cubit shalt thou finish it '
     'above; and the door of the ark shalt thou set in the side thereof; with lower, second, and third stories '
     'shalt thou make it. And, behold, I, even I, do bring a flood of waters upon the earth, to destroy all flesh,'
     ' wherein is the breath of life, from under heaven; and every thing that is in the earth shall die. But with '
     'thee will I establish my covenant; and thou shalt come into the ark, thou, and thy sons, and thy wife, and '
     "thy sons' wives with thee."),
    ('Psalms 104:10-16',
     'He sendeth the springs into the valleys, which run among the hills. They give drink to every beast of the '
     'field: the wild asses quench their thirst. By them shall the fowls of the heaven have their habitation, '
     'which sing among the branches. He watereth the hills from his chambers: the earth is satisfied with the '
     'fruit of thy works. He causeth the grass to grow for the cattle, and herb for the service of man: that he '
     'may bring forth food out of the earth; And wine that maketh glad the heart of man, and oil to make his face '
     "to shine, and bread which strengtheneth man's heart. The trees of the LORD are full of sap; the cedars of "
     'Lebanon, which he hath planted;'),
    ('Proverbs 31:10-17',
     'Who can find a virtuous woman? for her price is far above rubies. The heart of her husband doth safely trust'
     ' in her, so that he shall have no need of spoil. She will do him good and not evil all the days of her life.'
     " She seeketh wool, and flax, and worketh willingly with her hands. She is like the merchants' ships; she "
     'bringeth her food from afar. She riseth also while it is yet night, and giveth meat to her household, and a '
     'portion to her maidens. She considereth a field, and buyeth it: with the fruit of her hands she planteth a '
     'vineyard. She girdeth her loins with strength, and strengtheneth her arms.'),
    ('Isaiah 55:8-12',
     'For my thoughts are not your thoughts, neither are your ways my ways, saith the LORD. For as the heavens are'
     ' higher than the earth, so are my ways higher than your ways, and my thoughts than your thoughts. For as the'
     ' rain cometh down, and the snow from heaven, and returneth not thither, but watereth the earth, and maketh '
     'it bring forth and bud, that it may give seed to the sower, and bread to the eater: So shall my word be that'
     ' goeth forth out of my mouth: it shall not return unto me void, but it shall accomplish that which I please,'
     ' and it shall prosper in the thing whereto I sent it. For ye shall go out with joy, and be led forth with '
     'peace: the mountains and the hills shall break forth before you into singing, and all the trees of the field'
     ' shall clap their hands.'),
    ('Ecclesiastes 9:7-11',
     'Go thy way, eat thy bread with joy, and drink thy wine with a merry heart; for God now accepteth thy works. '
     'Let thy garments be always white; and let thy head lack no ointment. Live joyfully with the wife whom thou '
     'lovest all the days of the life of thy vanity, which he hath given thee under the sun, all the days of thy '
     'vanity: for that is thy portion in this life, and in thy labour which thou takest under the sun. Whatsoever '
     'thy hand findeth to do, do it with thy might; for there is no work, nor device, nor knowledge, nor wisdom, '
     'in the grave, whither thou goest. I returned, and saw under the sun, that the race is not to the swift, nor '
     'the battle to the strong, neither yet bread to the wise, nor yet riches to men of understanding, nor yet '
     'favour to men of skill; but time and chance happeneth to them all.'),
]

# ----------------------------------------------------------------------------------------------------------------
# Hard split: domains the drafter is not trained on
# ----------------------------------------------------------------------------------------------------------------

KJV_CONTINUE_TEMPLATES = [
    "Continue this passage in the same style for another paragraph:\n\n{p}",
    "{p}\n\nWhat comes next? Continue the text in the language of the King James Version.",
    "Here is a passage from the King James Bible ({ref}):\n\n{p}\n\nWrite the next few verses in the same style.",
    "Write a new passage in the style of the King James Version about {topic}, modelled on this one:\n\n{p}",
    "Copy out the following text exactly, then continue it with three more sentences in the same archaic English:\n\n{p}",
]

KJV_TRANSFORM_TEMPLATES = [
    "Rewrite this passage from {ref} in modern everyday English:\n\n{p}",
    "Summarize this passage in two sentences:\n\n{p}",
    "Explain the meaning of this passage ({ref}) verse by verse:\n\n{p}",
    "List every archaic word in this passage (like 'thee' or 'hath') and give its modern meaning:\n\n{p}",
    "{p}\n\nWhat literary devices are used in this text? Quote examples.",
    "Translate this King James text into simple English for a child:\n\n{p}",
    "Turn this passage into a short poem with rhyming lines:\n\n{p}",
    "Who are the characters in this passage, and what happens to each of them?\n\n{p}",
]

_KJV_NARRATIVE = ("Genesis", "Exodus", "Ruth", "1 Samuel", "1 Kings", "Daniel", "Jonah", "Mark", "Luke", "Acts",
                  "Joshua")

KJV_TOPICS = ["the sea", "a harvest", "a long journey", "a city on a hill", "the stars", "a wise king",
              "a great flood", "the coming of spring", "a shepherd", "a storm"]

LEGAL_PASSAGES = [
    ("confidentiality clause",
     "Each party (the \"Receiving Party\") shall hold in strict confidence all Confidential Information disclosed by the other party (the \"Disclosing Party\") and shall not disclose such Confidential Information to any third party without the prior written consent of the Disclosing Party, except to those of its employees, agents and professional advisers who need to know such information for the purposes of this Agreement and who are bound by obligations of confidentiality no less protective than those set out herein. The obligations in this clause shall survive termination of this Agreement for a period of five (5) years."),
    ("limitation of liability clause",
     "TO THE MAXIMUM EXTENT PERMITTED BY APPLICABLE LAW, IN NO EVENT SHALL THE SUPPLIER BE LIABLE FOR ANY INDIRECT, INCIDENTAL, SPECIAL, CONSEQUENTIAL OR PUNITIVE DAMAGES, OR ANY LOSS OF PROFITS OR REVENUES, WHETHER INCURRED DIRECTLY OR INDIRECTLY, OR ANY LOSS OF DATA, USE, GOODWILL OR OTHER INTANGIBLE LOSSES, RESULTING FROM (A) THE CUSTOMER'S USE OF OR INABILITY TO USE THE SERVICES; OR (B) ANY UNAUTHORIZED ACCESS TO OR USE OF THE CUSTOMER'S DATA. THE SUPPLIER'S AGGREGATE LIABILITY SHALL NOT EXCEED THE FEES PAID BY THE CUSTOMER IN THE TWELVE (12) MONTHS PRECEDING THE CLAIM."),
    ("indemnification clause",
     "The Licensee shall indemnify, defend and hold harmless the Licensor and its officers, directors, employees and agents from and against any and all claims, liabilities, damages, losses, costs and expenses (including reasonable attorneys' fees) arising out of or in connection with (i) any breach by the Licensee of its representations, warranties or obligations under this Agreement, or (ii) any negligent or wilful act or omission of the Licensee in connection with its use of the Licensed Materials."),
    ("governing law clause",
     "This Agreement and any dispute or claim arising out of or in connection with it or its subject matter or formation (including non-contractual disputes or claims) shall be governed by and construed in accordance with the laws of the State of Delaware, without regard to its conflict of laws principles. The parties irrevocably agree that the courts located in Wilmington, Delaware shall have exclusive jurisdiction to settle any such dispute or claim."),
    ("force majeure clause",
     "Neither party shall be in breach of this Agreement nor liable for delay in performing, or failure to perform, any of its obligations under this Agreement if such delay or failure results from events, circumstances or causes beyond its reasonable control, including acts of God, flood, drought, earthquake or other natural disaster, epidemic or pandemic, terrorist attack, war, riot, governmental action, or interruption or failure of utility service. In such circumstances the affected party shall be entitled to a reasonable extension of the time for performing such obligations."),
    ("software warranty disclaimer",
     "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE."),
    ("termination clause",
     "Either party may terminate this Agreement with immediate effect by giving written notice to the other party if: (a) the other party commits a material breach of any term of this Agreement which breach is irremediable or, if such breach is remediable, fails to remedy that breach within a period of thirty (30) days after being notified in writing to do so; or (b) the other party suspends, or threatens to suspend, payment of its debts or is unable to pay its debts as they fall due. Upon termination, all licences granted hereunder shall immediately cease."),
    ("privacy notice excerpt",
     "We collect personal data that you provide to us directly, such as your name, email address and billing information, as well as data collected automatically when you use the Service, including IP address, device identifiers, browser type and usage logs. We process this data on the basis of contractual necessity, our legitimate interests in operating and improving the Service, and, where required, your consent. You may request access to, rectification or erasure of your personal data at any time by contacting our Data Protection Officer."),
    ("lease agreement excerpt",
     "The Tenant shall pay the Landlord the monthly rent of one thousand four hundred dollars ($1,400.00) in advance on the first day of each calendar month. Rent received after the fifth (5th) day of the month shall incur a late fee of fifty dollars ($50.00). The Tenant shall not sublet the Premises or any part thereof, nor assign this Lease, without the prior written consent of the Landlord, which consent shall not be unreasonably withheld. The Tenant shall keep the Premises in a clean and sanitary condition."),
    ("terms of service excerpt",
     "By accessing or using the Service you agree to be bound by these Terms. If you disagree with any part of the Terms then you may not access the Service. We reserve the right, at our sole discretion, to modify or replace these Terms at any time. If a revision is material we will try to provide at least thirty (30) days' notice prior to any new terms taking effect. What constitutes a material change will be determined at our sole discretion. Your continued use of the Service after any such changes constitutes acceptance of the new Terms."),
    ("API rate limit documentation",
     "Requests to the v2 REST API are rate limited per access token. Unauthenticated requests are limited to 60 requests per hour per originating IP address; authenticated requests are limited to 5,000 requests per hour. Every response includes the headers X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, the last of which is expressed as a UTC epoch timestamp. Clients that exceed the limit receive HTTP 429 Too Many Requests and SHOULD retry only after the time indicated by the Retry-After header. Repeated violations MAY result in temporary suspension of the token."),
    ("RFC-style requirements text",
     "The key words \"MUST\", \"MUST NOT\", \"REQUIRED\", \"SHALL\", \"SHALL NOT\", \"SHOULD\", \"SHOULD NOT\", \"RECOMMENDED\", \"MAY\", and \"OPTIONAL\" in this document are to be interpreted as described in RFC 2119. A conforming server MUST reject any message whose Content-Length header does not match the length of the body. A client SHOULD NOT send more than one request on a connection before receiving the response, unless pipelining has been explicitly negotiated. Implementations MAY log malformed messages for diagnostic purposes."),
    ("safety data sheet excerpt",
     "Section 4: First-aid measures. If inhaled: remove person to fresh air and keep comfortable for breathing. If on skin: wash with plenty of soap and water; take off contaminated clothing and wash it before reuse. If in eyes: rinse cautiously with water for several minutes; remove contact lenses, if present and easy to do, and continue rinsing. If swallowed: rinse mouth; do NOT induce vomiting. Call a poison center or doctor if you feel unwell. Section 5: Fire-fighting measures. Suitable extinguishing media: dry chemical, CO2, alcohol-resistant foam."),
    ("open-source licence header",
     "Licensed under the Apache License, Version 2.0 (the \"License\"); you may not use this file except in compliance with the License. You may obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0. Unless required by applicable law or agreed to in writing, software distributed under the License is distributed on an \"AS IS\" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the License for the specific language governing permissions and limitations under the License."),
]

LEGAL_TEMPLATES = [
    "Explain this {kind} in plain English:\n\n{p}",
    "What are my obligations under this text?\n\n{p}",
    "Continue drafting this contract with the next clause:\n\n{p}",
    "Summarize the key points of this {kind} as a bulleted list:\n\n{p}",
    "{p}\n\nIs there anything in this that a small business should worry about?",
    "Rewrite the following so a teenager could understand it:\n\n{p}",
    "Identify every defined term and every time period or amount in this text:\n\n{p}",
    "Draft a similar {kind} for a small freelance design business, using this as a model:\n\n{p}",
]

SQL_SCHEMAS = [
    ("customers(id, name, email, country, created_at) and orders(id, customer_id, total, status, ordered_at)",
     ["the ten customers who spent the most in 2023", "the number of orders per country",
      "customers who have never placed an order", "the average order total per month",
      "customers whose most recent order was cancelled"]),
    ("employees(id, name, department_id, salary, hire_date, manager_id) and departments(id, name, location)",
     ["the highest-paid employee in each department", "departments with more than five employees",
      "employees who earn more than their manager", "the average salary by location",
      "employees hired in the last 90 days"]),
    ("books(id, title, author_id, published_year, genre), authors(id, name, country) and loans(id, book_id, member_id, loaned_at, returned_at)",
     ["books that are currently on loan", "the most borrowed genre", "authors with at least three books",
      "members who have an overdue loan older than 30 days", "the number of loans per year"]),
    ("products(sku, name, category, price), stores(id, city) and sales(id, sku, store_id, quantity, sold_at)",
     ["total revenue per store for last month", "the best-selling product in each category",
      "products that have not sold at all this year", "a running total of daily sales for one store",
      "cities where revenue grew compared with the previous month"]),
    ("students(id, name, grade_level), courses(id, title, teacher) and enrollments(student_id, course_id, score)",
     ["each student's average score", "courses where the average score is below 60",
      "the top three students in each course", "students enrolled in more than four courses",
      "teachers ranked by their students' average score"]),
]

SQL_TEMPLATES = [
    "Given tables {schema}, write a SQL query that returns {task}.",
    "Write a PostgreSQL query to find {task}. Tables: {schema}.",
    "I have a database with {schema}. How do I get {task}? Please explain the query.",
    "SQL question: with {schema}, select {task}. Use a CTE if it helps.",
    "Write the SQL for {task}, given {schema}. Then explain which indexes would make it faster.",
]

SQL_EXTRA = [
    "Explain the difference between INNER JOIN, LEFT JOIN and FULL OUTER JOIN with small example tables.",
    "Rewrite this query without a subquery: SELECT name FROM users WHERE id IN (SELECT user_id FROM logins WHERE day = CURRENT_DATE);",
    "What does this query do? SELECT dept, COUNT(*) AS n FROM staff GROUP BY dept HAVING COUNT(*) > 3 ORDER BY n DESC;",
    "Write a CREATE TABLE statement for a table of blog posts with an id, title, body, author, tags and timestamps.",
    "Why is this query slow, and how would you fix it? SELECT * FROM events WHERE DATE(created_at) = '2024-05-01';",
    "Write a SQL query using a window function to rank salespeople by revenue within each region.",
]

SHELL_TASKS = [
    "find all .log files older than 7 days under /var/log/myapp and delete them",
    "count the number of lines in every .py file in a directory tree and print the total",
    "rename all files ending in .jpeg to .jpg in the current folder",
    "show the 10 largest files under my home directory",
    "watch a log file and print only the lines that contain ERROR",
    "replace the word 'foo' with 'bar' in every .txt file in place",
    "download a list of URLs from urls.txt in parallel with curl",
    "print the 5 most common IP addresses in an nginx access log",
    "create a compressed tar archive of a folder with today's date in the filename",
    "kill every process listening on port 8080",
    "extract the second column of a CSV file and sort it uniquely",
    "check disk usage and send a warning if any partition is over 90% full",
    "loop over all subdirectories and run git pull in each one",
    "convert all .wav files in a folder to .mp3 with ffmpeg",
    "find which files changed in the last 24 hours",
    "back up a PostgreSQL database every night at 2 a.m. with cron",
]

SHELL_TEMPLATES = [
    "Write a bash one-liner to {t}.",
    "How do I {t} from the Linux command line?",
    "Write a shell script that {t3}. Add error handling with set -euo pipefail.",
    "What's the command to {t}? Please explain each flag.",
    "I'm on macOS. How can I {t} in zsh?",
]

SHELL_EXTRA = [
    "Explain what this command does: find . -name '*.tmp' -mtime +3 -print0 | xargs -0 rm -f",
    "What does `awk -F, 'NR>1 {sum += $3} END {print sum/(NR-1)}' data.csv` compute?",
    "Explain this: tar -czvf backup.tar.gz --exclude='*.log' ./project",
    "Why does `cd` inside a bash script not change my terminal's directory?",
    "What's the difference between `>` and `>>` and `2>&1` in bash?",
    "Explain: ps aux | grep python | grep -v grep | awk '{print $2}' | xargs kill",
]

REGEX_TASKS = [
    "matches a valid US ZIP code, with or without the four-digit extension",
    "matches dates in the format YYYY-MM-DD",
    "extracts all hashtags from a tweet",
    "matches a hex color code like #fff or #a1b2c3",
    "validates a strong password with at least 8 characters, one digit, one uppercase letter and one symbol",
    "matches IPv4 addresses",
    "finds repeated words like 'the the' in a text",
    "matches time in 24-hour format like 23:59",
    "captures the domain name from a URL",
    "matches UK postcodes",
    "extracts numbers with optional decimals and thousands separators",
    "matches lines that start with TODO or FIXME",
    "matches a semantic version number like 1.4.2 or 2.0.0-beta.1",
    "finds email addresses in a block of text",
]

REGEX_TEMPLATES = [
    "Write a regular expression that {t}.",
    "I need a regex that {t}. Can you explain each part of it?",
    "Give me a Python re pattern that {t}, with a few test strings.",
    "What's a JavaScript regex that {t}?",
]

REGEX_EXTRA = [
    "Explain this regex piece by piece: ^(?=.*\\d)(?=.*[a-z])(?=.*[A-Z]).{8,}$",
    "What does this regular expression match? \\b(\\w+)\\s+\\1\\b",
    "Why does the regex a.*b match more than I expect in 'a1b2b3b'? How do I make it lazy?",
    "Explain the difference between re.match, re.search and re.fullmatch in Python.",
    "What does this pattern do: ^\\s*#.*$|^\\s*$",
]

NON_ENGLISH = {
    "fr": (["Explique-moi comment fonctionne {t}, s'il te plaît.",
            "Peux-tu m'écrire un court poème sur {p} ?",
            "Quels sont les avantages et les inconvénients {c} ?",
            "Écris un e-mail poli à mon propriétaire pour lui signaler que {prob}.",
            "Donne-moi cinq idées {i}.",
            "Raconte-moi une petite histoire sur {ch}.",
            "Comment est-ce qu'on prépare {d} ?",
            "Résume en trois phrases l'histoire de {h}."],
           dict(t=["la photosynthèse", "un moteur électrique", "le système immunitaire", "l'inflation", "internet"],
                p=["la mer", "l'automne", "une vieille maison", "la pluie", "l'amitié"],
                c=["du télétravail", "de la vie en ville", "d'avoir un chien", "de prendre le train tous les jours"],
                prob=["le chauffage ne marche plus", "il y a une fuite d'eau dans la salle de bain", "la fenêtre de la cuisine est cassée"],
                i=["de cadeaux pour ma mère", "de sorties en famille", "de noms pour un café", "d'activités pour un jour de pluie"],
                ch=["un chat qui voulait voler", "une petite fille et un dragon", "un boulanger très distrait"],
                d=["une ratatouille", "des crêpes", "une quiche lorraine", "une soupe à l'oignon"],
                h=["la Révolution française", "la construction de la tour Eiffel", "l'empire romain"])),
    "es": (["¿Me puedes explicar qué es {t}?",
            "Escribe un poema corto sobre {p}.",
            "¿Cuáles son las ventajas y desventajas de {c}?",
            "Ayúdame a escribir un correo a mi jefe para pedirle {prob}.",
            "Dame cinco ideas para {i}.",
            "Cuéntame un cuento corto sobre {ch}.",
            "¿Cómo se prepara {d}?",
            "Resume en pocas palabras la historia {h}."],
           dict(t=["la fotosíntesis", "el cambio climático", "la inteligencia artificial", "un agujero negro", "la democracia"],
                p=["el mar", "la luna", "mi abuela", "una tarde de lluvia", "la primavera"],
                c=["estudiar en el extranjero", "comprar un coche eléctrico", "trabajar desde casa", "vivir en el campo"],
                prob=["un día libre el viernes", "un aumento de sueldo", "más tiempo para terminar el informe"],
                i=["una fiesta de cumpleaños infantil", "ahorrar dinero", "aprender inglés más rápido", "un fin de semana en Madrid"],
                ch=["un perro que aprendió a leer", "un pirata que tenía miedo al agua", "una niña que hablaba con los árboles"],
                d=["una tortilla de patatas", "un gazpacho", "una paella", "unos tacos al pastor"],
                h=["de la civilización maya", "de la Guerra Civil española", "del descubrimiento de América"])),
    "de": (["Kannst du mir erklären, wie {t} funktioniert?",
            "Schreib ein kurzes Gedicht über {p}.",
            "Was sind die Vor- und Nachteile von {c}?",
            "Hilf mir, eine höfliche E-Mail an meinen Vermieter zu schreiben, weil {prob}.",
            "Gib mir fünf Ideen für {i}.",
            "Erzähl mir eine kurze Geschichte über {ch}.",
            "Wie macht man {d}?",
            "Fass die Geschichte {h} in drei Sätzen zusammen."],
           dict(t=["die Photosynthese", "ein Kühlschrank", "das Immunsystem", "die Inflation", "ein Elektroauto"],
                p=["den Winter", "das Meer", "einen alten Baum", "die Stadt bei Nacht", "die Freundschaft"],
                c=["Homeoffice", "einem Leben auf dem Land", "einem Gap Year", "E-Books"],
                prob=["die Heizung kaputt ist", "die Waschmaschine im Keller nicht funktioniert", "es im Badezimmer schimmelt"],
                i=["einen Kindergeburtstag", "ein Wochenende in Berlin", "gesunde Snacks fürs Büro", "ein Hobby im Winter"],
                ch=["einen Fuchs, der Bäcker werden wollte", "einen Roboter, der Angst vor Regen hat", "zwei Geschwister im Wald"],
                d=["Apfelstrudel", "Kartoffelsalat", "Spätzle", "einen Käsekuchen"],
                h=["der Berliner Mauer", "des Buchdrucks", "der deutschen Wiedervereinigung"])),
    "it": (["Mi spieghi cos'è {t}?",
            "Scrivi una breve poesia {p}.",
            "Quali sono i pro e i contro di {c}?",
            "Dammi cinque idee per {i}.",
            "Come si prepara {d}?"],
           dict(t=["la fotosintesi", "l'inflazione", "un vulcano", "l'intelligenza artificiale"],
                p=["sul mare d'inverno", "su Venezia", "sulla nonna", "su un temporale"],
                c=["lavorare da casa", "vivere in città", "studiare all'estero"],
                i=["una cena tra amici", "un weekend a Roma", "regali di Natale"],
                d=["il risotto alla milanese", "la carbonara", "il tiramisù"])),
    "pt": (["Você pode me explicar o que é {t}?",
            "Escreva um poema curto sobre {p}.",
            "Quais são as vantagens e desvantagens de {c}?",
            "Me dê cinco ideias para {i}.",
            "Como se faz {d}?"],
           dict(t=["a fotossíntese", "a inflação", "um buraco negro", "a democracia"],
                p=["o mar", "a saudade", "uma tarde de chuva", "Lisboa"],
                c=["trabalhar em casa", "morar sozinho", "ter um gato"],
                i=["uma festa de aniversário", "economizar dinheiro", "um fim de semana no Rio"],
                d=["pão de queijo", "feijoada", "pastel de nata"])),
}

CSV_DATASETS = [
    ("name,age,city\n{n1},{a1},{c1}\n{n2},{a2},{c2}\n{n3},{a3},{c3}", "people"),
    ("date,product,units,price\n2024-03-0{d1},Widget,{a1},4.99\n2024-03-0{d2},Gadget,{a2},12.50\n2024-03-0{d3},Widget,{a3},4.99", "sales"),
    ("id,title,done\n1,Buy milk,{b1}\n2,Call {n1},{b2}\n3,Book flights to {c1},{b3}", "tasks"),
]

CSV_TEMPLATES = [
    "Convert this CSV to JSON (an array of objects):\n\n{csv}",
    "Turn this CSV into a Markdown table:\n\n{csv}",
    "Here is some CSV data:\n\n{csv}\n\nWrite Python code using the csv module to load it and compute a summary.",
    "Convert this CSV into a YAML list:\n\n{csv}",
    "Add a new column to this CSV that is computed from the others, and show the result:\n\n{csv}",
]

JSON_TEMPLATES = [
    "Convert this JSON into a CSV with a header row:\n\n{js}",
    "Pretty-print and validate this JSON. Is anything wrong with it?\n\n{js}",
    "Write a JSON Schema that this document would satisfy:\n\n{js}",
    "Extract the fields into a flat table:\n\n{js}",
    "Rewrite this JSON as XML:\n\n{js}",
    "Turn this sentence into JSON with the keys name, date, place and guests: \"{sentence}\"",
]


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
    out_dir = Path(out_dir) if out_dir is not None else data_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        path = out_dir / f"{split}.jsonl"
        lines = [_jsonl_line(rec) for rec in records if rec["split"] == split]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths[split] = path
    return paths


def load_prompts(split: str = "train", path: Path | str | None = None) -> list[dict]:
    """Read the committed ``data/prompts/{split}.jsonl`` (or `path`) as a list of records."""
    if split not in SPLITS and path is None:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = Path(path) if path is not None else data_dir() / f"{split}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def category_counts(records: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in records:
        counts[rec["category"]] = counts.get(rec["category"], 0) + 1
    return dict(sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draft_service.prompts",
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
