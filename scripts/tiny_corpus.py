"""Seeded generator of the tiny-model training corpus.

The course ships a very small language model (``minivllm/tiny_model``) that
has to produce readable English on a laptop CPU.  A few million parameters
cannot learn open-domain English, so instead we train it on a narrow,
fully synthetic "children's book" world: short stories and facts built from
hand-written templates and word lists.  The world is small enough for the
model to learn, but varied enough (characters, places, objects, plots,
dialogue, question/answer facts) that its greedy output reads as real
sentences that end on their own after a few lines.

Everything is driven by one ``random.Random(seed)``, so the same seed always
gives the same corpus, byte for byte.

Usage::

    python scripts/tiny_corpus.py --docs 20 --seed 1          # print samples
    python scripts/tiny_corpus.py --docs 60000 --out /tmp/c.txt --stats
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass

# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------


def cap(text: str) -> str:
    """Upper-case the first letter (for the start of a sentence)."""
    return text[:1].upper() + text[1:]


def lower_first(text: str) -> str:
    """Lower-case the first letter only (keeps "Saturday" capitalised)."""
    return text[:1].lower() + text[1:]


def a_an(phrase: str) -> str:
    """Put the right indefinite article in front of ``phrase``."""
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def maybe(r: random.Random, p: float) -> bool:
    return r.random() < p


def join(sentences: list[str]) -> str:
    return " ".join(s for s in sentences if s)


# --------------------------------------------------------------------------
# The world: word lists
# --------------------------------------------------------------------------

BOYS = ["Tom", "Ben", "Sam", "Max", "Jack", "Leo", "Omar", "Kai", "Noah", "Tim",
        "Dan", "Luke", "Hugo", "Eli", "Ravi", "Theo"]
GIRLS = ["Lily", "Mia", "Anna", "Lucy", "Emma", "Rosa", "Nina", "Zoe", "Sara",
         "Ella", "Maya", "Ruby", "Amy", "Jane", "Ivy", "Lena"]
ANIMAL_NAMES = {"he": ["Finn", "Pip", "Bruno", "Rusty", "Oscar", "Toby", "Milo", "Bob"],
                "she": ["Daisy", "Rosie", "Bella", "Coco", "Penny", "Lulu", "Hazel", "Dot"]}

KID_ADJS = ["little", "small", "kind", "happy", "curious", "brave", "young", "cheerful"]
ANIMAL_ADJS = ["little", "small", "old", "young", "brave", "shy", "happy", "curious",
               "tiny", "kind", "clever", "sleepy", "big", "busy"]

# animal -> (home, favourite food, sound word used in dialogue tags)
ANIMALS = {
    "fox": ("in a den at the edge of the forest", "berries"),
    "rabbit": ("in a hole under a big oak tree", "carrots"),
    "owl": ("in a tall tree in the woods", "seeds"),
    "mouse": ("in a tiny hole in the kitchen wall", "cheese"),
    "dog": ("in a house with a big yard", "bones"),
    "cat": ("in a warm house in the town", "fish"),
    "bear": ("in a cave in the hills", "honey"),
    "bird": ("in a nest at the top of a tree", "seeds"),
    "frog": ("by a quiet pond", "bugs"),
    "duck": ("on a little pond near the farm", "bread"),
    "turtle": ("near the slow river", "leaves"),
    "squirrel": ("in a hollow in an old oak tree", "nuts"),
    "pig": ("on a green farm", "apples"),
    "lamb": ("in a field on a sunny farm", "grass"),
    "puppy": ("in a little house with a red door", "bones"),
    "kitten": ("in a cozy house by the sea", "milk"),
    "hedgehog": ("under a pile of leaves in the garden", "bugs"),
    "goat": ("on a rocky hill", "grass"),
}

KID_HOMES = ["in a small house near the park", "in a big city", "in a little town by the sea",
             "on a farm with many animals", "in a yellow house at the end of the street",
             "in a small village near the hills", "in a blue house with a big garden",
             "in a tall building in the city"]

KID_LIKES = ["loved to play outside", "liked to draw pictures", "loved to read books",
             "liked to sing songs", "loved to dance", "liked to help in the garden",
             "loved to look at the stars", "liked to play with blocks",
             "loved to run and jump", "liked to build things"]
ANIMAL_LIKES = ["loved to eat {food}", "liked to run in the grass", "loved to play in the sun",
                "liked to explore", "loved to sleep in the shade", "liked to make new friends",
                "loved to look at the clouds"]

TRAITS = [("shy", "did not like to talk to new friends"),
          ("curious", "always asked a lot of questions"),
          ("kind", "always helped others"),
          ("brave", "was not afraid of anything"),
          ("silly", "always made everyone laugh"),
          ("busy", "was never still for long")]

COLORS = ["red", "blue", "green", "yellow", "orange", "purple", "pink", "white", "shiny", "little"]
TOYS = ["ball", "kite", "hat", "toy car", "teddy bear", "book", "doll", "toy boat", "drum",
        "scarf", "cup", "toy train", "box of crayons", "yo-yo"]
# things an animal might treasure, each with adjectives that suit it
ANIMAL_TOYS = {
    "ball": ["red", "blue", "little", "bouncy"],
    "stick": ["long", "smooth", "little", "crooked"],
    "acorn": ["big", "shiny", "brown", "little"],
    "shell": ["pink", "shiny", "little", "white"],
    "feather": ["blue", "soft", "long", "white"],
    "leaf": ["red", "golden", "big", "green"],
    "pebble": ["smooth", "round", "shiny", "white"],
    "flower": ["yellow", "pink", "little", "purple"],
}
YOUNG_ANIMALS = {"puppy", "kitten", "lamb"}

INDOOR_SPOTS = ["under the bed", "behind the door", "in the toy box", "under the table",
                "behind the sofa", "in the kitchen", "on the shelf", "in the big closet",
                "under the pillow", "in the bathtub", "next to the window", "under the stairs"]
OUTDOOR_SPOTS = ["behind a big rock", "under a bush", "near the pond", "in the tall grass",
                 "inside a hollow log", "under a pile of leaves", "by the old fence",
                 "next to the river", "under the apple tree", "in the flower bed"]

KID_HELPERS = ["mom", "dad", "grandma", "grandpa", "big sister", "big brother", "aunt", "uncle"]

FOUND_REASONS = ["The dog had carried it there.", "The wind had blown it there.",
                 "{subj_c} had left it there the day before.", "The cat had pushed it there.",
                 "{poss_c} little brother had hidden it there as a joke."]
ANIMAL_FOUND_REASONS = ["The wind had blown it there.", "A bird had carried it there.",
                        "{subj_c} had left it there the day before.",
                        "The rain had washed it there."]

# place -> things a child can do there (past tense)
PLACES = {
    "park": ["played on the swings", "ran on the grass", "fed the ducks", "played ball",
             "had a picnic under a tree", "went down the big slide"],
    "beach": ["built a sand castle", "swam in the sea", "found pretty shells",
              "jumped over the waves", "ate ice cream", "dug a deep hole in the sand"],
    "forest": ["picked berries", "saw a deer", "walked under the tall trees",
               "listened to the birds", "found a big mushroom", "climbed over an old log"],
    "lake": ["threw stones into the water", "watched the fish", "sailed a toy boat",
             "sat on the dock", "saw two swans"],
    "farm": ["fed the hens", "saw the cows", "gave hay to the horses",
             "picked eggs from the barn", "played with the baby goats"],
    "market": ["bought red apples", "smelled fresh bread", "saw many colorful fruits",
               "bought a bag of oranges", "tasted sweet cherries"],
    "zoo": ["saw a tall giraffe", "watched the monkeys play", "heard a lion roar",
            "saw a big elephant", "looked at the penguins"],
    "library": ["read a book about stars", "found a book about dinosaurs",
                "listened to a story", "looked at pictures of the sea"],
    "garden": ["watered the flowers", "picked tomatoes", "dug in the soil",
               "planted some seeds", "watched a butterfly"],
    "river": ["watched the boats", "caught a small fish", "threw sticks into the water",
              "walked across the old bridge"],
    "hill": ["rolled down the grass", "flew a kite", "looked at the town below",
             "ran down to the bottom"],
    "playground": ["went down the slide", "climbed the ladder", "played on the seesaw",
                   "played tag with other kids"],
}
# nature places for animal characters, with animal-friendly activities
ANIMAL_PLACES = {
    "meadow": ["chased butterflies", "played in the tall grass", "smelled the flowers"],
    "river": ["drank the cool water", "splashed in the shallow water", "watched the fish"],
    "forest": ["looked for {food}", "played hide and seek behind the trees",
               "listened to the birds"],
    "hill": ["rolled down the grass", "looked at the valley below", "raced to the top"],
    "pond": ["splashed in the water", "watched the frogs jump", "sat on a warm stone"],
    "farm": ["said hello to the cows", "played in the hay", "looked for {food}"],
}

COMPANIONS_KID = ["mom", "dad", "grandma", "grandpa", "big sister", "big brother", "aunt",
                  "best friend"]
COMPANIONS_ANIMAL = ["mother", "father", "brother", "sister", "best friend"]

SEE_THINGS = ["a rainbow", "a big red balloon", "a funny dog", "a family of ducks",
              "a little green frog", "a shiny stone", "an old boat", "a tiny snail",
              "a colorful butterfly", "a hot air balloon"]

# skill -> (kids only?, fail, success); {subj} {poss} filled in later
SKILLS = [
    ("ride a bike", True, "{subj} fell off after a few turns",
     "{subj} rode all the way down the street"),
    ("fly a kite", True, "the kite fell to the ground", "the kite flew high in the sky"),
    ("swim", False, "{subj} swallowed some water and coughed",
     "{subj} swam all the way to the other side"),
    ("climb the big tree", False, "{subj} slipped and landed in the grass",
     "{subj} reached the top branch and looked at the whole world"),
    ("bake a cake", True, "the cake came out flat and burnt",
     "the cake came out soft and sweet"),
    ("whistle", True, "only air came out", "a loud, happy whistle came out"),
    ("jump over the log", False, "{subj} tripped and fell on {poss} nose",
     "{subj} jumped over the log with room to spare"),
    ("tie {poss} shoes", True, "the laces got all tangled", "{subj} made two neat bows"),
    ("catch a ball", False, "the ball hit {obj} on the head",
     "{subj} caught the ball with both hands"),
    ("skip a stone", True, "the stone sank with a plop",
     "the stone skipped three times across the water"),
    ("read a long word", True, "the letters got mixed up", "{subj} read the word out loud"),
    ("build a tall tower of blocks", True, "the tower fell down",
     "the tower stood tall and did not fall"),
]

HELPERS_ANIMAL = ["wise old owl", "kind old turtle", "big brown bear", "friendly duck",
                  "clever little mouse"]

# (problem seen, help action, result, who says thanks)
KID_PROBLEMS = [
    ("a small bird with a hurt wing", "put the bird in a soft box and gave it some seeds",
     "A few days later, the bird could fly again.", "The bird sang a happy song."),
    ("a kitten stuck in a tree", "asked {poss} dad for a ladder, and together they brought the kitten down",
     "The kitten was safe.", "The kitten purred and licked {poss} hand."),
    ("an old man who had dropped his apples", "picked up all the apples and put them back in his bag",
     "The old man smiled.", '"Thank you, child," said the old man.'),
    ("a little boy who was lost and crying", "held his hand and helped him find his mom",
     "The boy ran to his mom and hugged her.", '"Thank you so much," said the mom.'),
    ("a puppy that was cold and wet", "wrapped the puppy in a warm towel",
     "Soon the puppy stopped shaking.", "The puppy wagged its tail."),
    ("a girl who could not reach a book on a high shelf", "climbed on a chair and got the book for her",
     "The girl was very happy.", '"Thank you," said the girl.'),
]
ANIMAL_PROBLEMS = [
    ("a duck that could not find the way home", "showed the duck the path to the pond",
     "The duck was home again.", '"Thank you, friend," said the duck.'),
    ("a turtle stuck on its back", "gently pushed the turtle over",
     "The turtle could walk again.", '"Thank you," said the turtle slowly.'),
    ("a baby bird that fell from its nest", "asked a big bird to carry the baby back to the nest",
     "The baby bird was safe with its mother.", "The mother bird sang a happy song."),
    ("a little mouse stuck in the mud", "pulled the mouse out with a long stick",
     "The mouse was muddy but safe.", '"Thank you!" squeaked the mouse.'),
    ("a bee that was too tired to fly", "gave the bee a drop of sweet water from a flower",
     "Soon the bee could fly again.", "The bee buzzed a happy thank you."),
]

RAINY_ACTIVITIES = ["built a fort with blankets and pillows", "painted pictures of the sea",
                    "baked cookies with chocolate chips", "played a board game",
                    "read stories by the window", "made paper boats",
                    "built a castle with blocks", "had a tea party with the toys"]

FOODS_KID = [("an apple", "it was crunchy and sweet"), ("a banana", "it was soft and sweet"),
             ("some soup", "it was warm and good"), ("a sandwich", "it was very tasty"),
             ("a bowl of rice", "it was warm and filling"),
             ("some pancakes", "they were soft and sweet"),
             ("a piece of bread with jam", "it was sticky and sweet")]

NIGHT_SIGHTS = ["the big round moon", "many bright stars", "a shooting star",
                "an owl on a branch", "fireflies in the garden"]

ENDINGS_HAPPY = ["{ref_c} was very happy.", "It was a good day.", "{ref_c} smiled all day.",
                 "It was the best day ever.", "{ref_c} felt warm and happy inside."]


# --------------------------------------------------------------------------
# Characters
# --------------------------------------------------------------------------


@dataclass
class Char:
    ref: str  # how the text names it mid-sentence: "Lily", "the little fox"
    intro: str  # first mention: "a little girl named Lily", "a little fox"
    subj: str
    obj: str
    poss: str
    kid: bool
    animal: str | None
    home: str
    food: str
    name: str | None

    @property
    def ref_c(self) -> str:
        return cap(self.ref)

    @property
    def subj_c(self) -> str:
        return cap(self.subj)

    @property
    def poss_c(self) -> str:
        return cap(self.poss)

    def fmt(self, text: str, **extra: str) -> str:
        return text.format(ref=self.ref, ref_c=self.ref_c, subj=self.subj, subj_c=self.subj_c,
                           obj=self.obj, poss=self.poss, poss_c=self.poss_c, food=self.food,
                           **extra)


def pronouns(gender: str) -> tuple[str, str, str]:
    return ("he", "him", "his") if gender == "he" else ("she", "her", "her")


def make_kid(r: random.Random, avoid: set[str] | None = None) -> Char:
    gender = r.choice(["he", "she"])
    pool = [n for n in (BOYS if gender == "he" else GIRLS) if not avoid or n not in avoid]
    name = r.choice(pool)
    s, o, p = pronouns(gender)
    noun = "boy" if gender == "he" else "girl"
    intro = f"{a_an(r.choice(KID_ADJS))} {noun} named {name}"
    return Char(name, intro, s, o, p, True, None, r.choice(KID_HOMES), "cookies", name)


def animal_adjs(animal: str) -> list[str]:
    """Adjectives that make sense for this animal (no "old kitten")."""
    return [a for a in ANIMAL_ADJS if animal not in YOUNG_ANIMALS or a not in ("old", "big")]


def make_animal(r: random.Random, animal: str | None = None, named: bool | None = None,
                avoid: set[str] | None = None) -> Char:
    animal = animal or r.choice(list(ANIMALS))
    gender = r.choice(["he", "she"])
    s, o, p = pronouns(gender)
    adj = r.choice(animal_adjs(animal))
    home, food = ANIMALS[animal]
    if named is None:
        named = maybe(r, 0.5)
    if named:
        pool = [n for n in ANIMAL_NAMES[gender] if not avoid or n not in avoid]
        name = r.choice(pool)
        return Char(name, f"{a_an(adj)} {animal} named {name}", s, o, p, False, animal, home,
                    food, name)
    return Char(f"the {adj} {animal}", f"{a_an(adj)} {animal}", s, o, p, False, animal, home,
                food, None)


def pick_thing(r: random.Random, kid: bool) -> tuple[str, str]:
    """A (thing, adjective) pair a character could own."""
    if kid:
        return r.choice(TOYS), r.choice(COLORS)
    thing = r.choice(list(ANIMAL_TOYS))
    return thing, r.choice(ANIMAL_TOYS[thing])


def make_char(r: random.Random, p_kid: float = 0.5) -> Char:
    return make_kid(r) if maybe(r, p_kid) else make_animal(r)


# --------------------------------------------------------------------------
# Story pieces
# --------------------------------------------------------------------------


def intro_sentences(r: random.Random, c: Char) -> list[str]:
    likes = c.fmt(r.choice(KID_LIKES if c.kid else ANIMAL_LIKES))
    style = r.randrange(6)
    out: list[str]
    if style == 0:
        out = [f"Once upon a time, there was {c.intro}.", f"{c.subj_c} lived {c.home}."]
    elif style == 1:
        out = [f"Once upon a time, there was {c.intro} who lived {c.home}."]
    elif style == 2:
        out = [f"There once was {c.intro}.", f"{c.subj_c} {likes}."]
        likes = ""
    elif style == 3:
        if c.name:
            noun = "boy" if c.kid and c.subj == "he" else "girl" if c.kid else c.animal
            out = [f"{c.name} was {a_an(r.choice(KID_ADJS if c.kid else animal_adjs(noun)))} {noun}."]
        else:
            out = [f"{c.ref_c} lived {c.home}."]
    elif style == 4:
        trait, desc = r.choice(TRAITS)
        if c.name:
            out = [f"{c.name} was a {trait} {'boy' if c.subj == 'he' else 'girl'}."
                   if c.kid else f"{c.name} was a {trait} {c.animal}.",
                   f"{c.subj_c} {desc}."]
        else:
            out = [f"Once upon a time, there was a {trait} {c.animal}.", f"{c.subj_c} {desc}."]
        # from here on the unnamed animal is "the <trait> <animal>"
        if not c.name:
            c.ref = f"the {trait} {c.animal}"
    else:
        out = [f"Once upon a time, in a land far away, there lived {c.intro}."]
    if likes and maybe(r, 0.5):
        out.append(f"{c.subj_c} {likes}.")
    return out


def start_of_day(r: random.Random) -> str:
    return r.choice(["One day", "One morning", "One sunny day", "One afternoon",
                     "One bright morning", "The next day", "On Saturday", "One warm day"])


def helper_for(r: random.Random, c: Char, avoid: set[str]) -> tuple[str, str]:
    """Returns (mid-sentence reference, short name used after) for a helper."""
    if c.kid:
        if maybe(r, 0.3):
            friend = make_kid(r, avoid)
            return f"{c.poss} friend {friend.name}", friend.name or ""
        h = r.choice(KID_HELPERS)
        return f"{c.poss} {h}", f"{c.poss} {h}"
    h = r.choice(HELPERS_ANIMAL)
    return f"{c.poss} friend the {h}", f"the {h.split()[-1]}"


# --------------------------------------------------------------------------
# Story types
# --------------------------------------------------------------------------


def story_lost(r: random.Random) -> str:
    c = make_char(r)
    out = intro_sentences(r, c) if maybe(r, 0.8) else []
    thing, color = pick_thing(r, c.kid)
    spots = r.sample(INDOOR_SPOTS if c.kid else OUTDOOR_SPOTS, 4)
    who = c.ref_c if out else (c.name or c.ref_c)
    out.append(f"{who} had {a_an(color + ' ' + thing)}.")
    if maybe(r, 0.6):
        out.append(r.choice([f"{c.subj_c} played with it every day.",
                             f"It was {c.poss} favorite {thing}.",
                             f"{c.subj_c} took it everywhere."]))
    out.append(r.choice([f"{start_of_day(r)}, {c.ref} could not find {c.poss} {thing}.",
                         f"{start_of_day(r)}, the {thing} was gone.",
                         f"But {lower_first(start_of_day(r))}, {c.subj} lost it."]))
    if maybe(r, 0.5):
        out.append(r.choice([f'"Where is my {thing}?" {c.subj} asked.',
                             f"{c.ref_c} was very sad.",
                             f"{c.ref_c} felt like crying."]))
    n_look = r.choice([1, 2, 2, 3])
    for i in range(n_look):
        if i == 0:
            out.append(f"{c.subj_c} looked {spots[i]}, but it was not there.")
        elif i == n_look - 1 and n_look == 3:
            out.append(f"{c.subj_c} even looked {spots[i]}. Still nothing!")
        else:
            out.append(f"Then {c.subj} looked {spots[i]}. It was not there either.")
    if maybe(r, 0.6):
        h_intro, h_ref = helper_for(r, c, {c.name or ""})
        out.append(f"{cap(h_intro)} came to help.")
        out.append(r.choice([f"They looked {spots[3]} and found the {thing}!",
                             f"{cap(h_ref)} found the {thing} {spots[3]}.",
                             f"{cap(h_ref)} said, \"Let's look {spots[3]}.\" And there it was!"]))
    else:
        out.append(f"At last, {c.subj} found it {spots[3]}.")
    if maybe(r, 0.4):
        out.append(c.fmt(r.choice(FOUND_REASONS if c.kid else ANIMAL_FOUND_REASONS)))
    out.append(r.choice([f"{c.ref_c} hugged {c.poss} {thing} and smiled.",
                         f"{c.ref_c} was so happy to have {c.poss} {thing} back.",
                         f'"Hooray!" said {c.ref}.']))
    if maybe(r, 0.35):
        out.append(f"From then on, {c.subj} always put {c.poss} {thing} back in its place.")
    return join(out)


def story_outing(r: random.Random) -> str:
    c = make_char(r, 0.65)
    out: list[str] = []
    if c.kid:
        place = r.choice(list(PLACES))
        acts = r.sample(PLACES[place], min(len(PLACES[place]), r.choice([1, 2, 2, 3])))
        comp = r.choice(COMPANIONS_KID)
    else:
        place = r.choice(list(ANIMAL_PLACES))
        acts = r.sample(ANIMAL_PLACES[place], r.choice([1, 2, 2, 3]))
        acts = [c.fmt(a) for a in acts]
        comp = r.choice(COMPANIONS_ANIMAL)
    comp_ref = f"{c.poss} {comp}"
    style = r.randrange(3)
    if style == 0 and c.name:
        out.append(f"{c.name} went to the {place} with {comp_ref}.")
    elif style == 1:
        out += intro_sentences(r, c)
        out.append(f"{start_of_day(r)}, {c.subj} went to the {place} with {comp_ref}.")
    else:
        out.append(f"{start_of_day(r)}, {c.ref} and {comp_ref} went to the {place}.")
    if maybe(r, 0.4):
        out.append(r.choice(["The sun was warm and the sky was blue.",
                             "There was a cool breeze.",
                             "It was a bright and sunny day.",
                             f"{c.subj_c} was very excited."]))
    if len(acts) == 1:
        out.append(f"They {acts[0]}.")
    else:
        out.append(f"First, they {acts[0]}.")
        for a in acts[1:-1]:
            out.append(f"Then they {a}.")
        out.append(f"After that, they {acts[-1]}.")
    ev = r.randrange(4)
    if ev == 0:
        out.append("Then dark clouds came and it began to rain.")
        out.append(r.choice(["They ran home as fast as they could.",
                             "They hid under a big tree until the rain stopped."]))
    elif ev == 1:
        friend = make_kid(r, {c.name or ""}) if c.kid else make_animal(r, avoid={c.name or ""})
        out.append(f"At the {place}, {c.subj} met {friend.intro}.")
        out.append("They played together all afternoon.")
    elif ev == 2:
        out.append(f"Suddenly, {c.ref} saw {r.choice(SEE_THINGS)}.")
        out.append(r.choice([f'"Look!" said {c.ref}.', f"{c.subj_c} had never seen one before.",
                             "It was so beautiful."]))
    if ev != 0 and maybe(r, 0.7):
        out.append(r.choice(["When the sun went down, they went home.",
                             "In the evening, they walked home together.",
                             "At the end of the day, they went back home."]))
    if maybe(r, 0.5):
        out.append(f'"Can we come back tomorrow?" asked {c.ref}. "Yes," said {comp_ref} with a smile.')
    else:
        out.append(c.fmt(r.choice(ENDINGS_HAPPY + ["{ref_c} was tired but happy."])))
    return join(out)


def story_share(r: random.Random) -> str:
    if maybe(r, 0.5):
        a = make_kid(r)
        b = make_kid(r, {a.name or ""})
        thing = r.choice(TOYS)
        where = r.choice(["in the park", "at school", "in the garden", "at home",
                          "on the playground"])
    else:
        a = make_animal(r, named=True)
        b = make_animal(r, named=True, avoid={a.name or ""})
        thing = r.choice(list(ANIMAL_TOYS))
        where = r.choice(["in the meadow", "by the pond", "in the forest", "near the river"])
    A, B = a.name, b.name
    color = r.choice(COLORS if a.kid else ANIMAL_TOYS[thing])
    out = [r.choice([f"{A} and {B} were playing {where}.",
                     f"{A} and {B} were good friends.",
                     f"One day, {A} and {B} were {where}."])]
    out.append(r.choice([f"They both wanted the {color} {thing}.",
                         f"{A} found {a_an(color + ' ' + thing)}. {B} wanted it too.",
                         f"There was only one {color} {thing}, and they both wanted it."]))
    out.append(r.choice([f'"It is mine!" said {A}. "No, I saw it first!" said {B}.',
                         f'"Give it to me!" said {B}. "No, I want it!" said {A}.',
                         f'"I want to play with it," said {A}. "Me too!" said {B}.']))
    if maybe(r, 0.4):
        out.append("They pulled and pulled.")
        if maybe(r, 0.5):
            out.append(f"Then the {thing} fell and they both felt sad.")
    if a.kid and maybe(r, 0.5):
        grown = r.choice(["mom", "dad", "teacher", "grandma"])
        out.append(f'{A}\'s {grown} said, "Why don\'t you take turns?"')
    else:
        out.append(f"Then {A} had an idea.")
        out.append(r.choice([f'"Let\'s play with it together," {a.subj} said.',
                             f'"You can go first," {a.subj} said.']))
    out.append(r.choice([f"So they took turns. {A} played first, and then {B} played.",
                         "They played together and had lots of fun.",
                         f"{B} smiled. They played together all day."]))
    out.append(r.choice(["Sharing made them both happy.",
                         f"From that day on, {A} and {B} always shared their toys.",
                         "Playing together was more fun than playing alone.",
                         "They learned that sharing is fun."]))
    return join(out)


def story_skill(r: random.Random) -> str:
    c = make_char(r, 0.6)
    choices = [s for s in SKILLS if c.kid or not s[1]]
    skill, _, fail, success = r.choice(choices)
    skill, fail, success = c.fmt(skill), c.fmt(fail), c.fmt(success)
    out = intro_sentences(r, c) if maybe(r, 0.7) else []
    out.append(r.choice([f"{c.ref_c} wanted to learn to {skill}.",
                         f"{c.ref_c} wanted to {skill}, but {c.subj} did not know how.",
                         f"{start_of_day(r)}, {c.ref} decided to {skill}."]))
    out.append(f"{c.subj_c} tried, but {fail}.")
    if maybe(r, 0.6):
        out.append(r.choice([f"{c.ref_c} felt sad.", f"{c.ref_c} wanted to give up.",
                             f"{c.subj_c} sat down and sighed."]))
    if maybe(r, 0.7):
        h_intro, _ = helper_for(r, c, {c.name or ""})
        out.append(f'{cap(h_intro)} said, "Do not give up. Try again."')
    out.append(r.choice([f"{c.subj_c} tried again and again.", f"So {c.subj} practiced every day.",
                         f"{c.subj_c} took a deep breath and tried one more time."]))
    out.append(f"At last, {success}!")
    out.append(r.choice([f'"I did it!" {c.subj} shouted.', f"{c.ref_c} was so proud.",
                         f"{c.ref_c} laughed and clapped."]))
    if maybe(r, 0.3):
        out.append("Trying again is how we learn.")
    return join(out)


def story_help(r: random.Random) -> str:
    c = make_char(r)
    problem, action, result, thanks = r.choice(KID_PROBLEMS if c.kid else ANIMAL_PROBLEMS)
    out = intro_sentences(r, c) if maybe(r, 0.7) else []
    where = r.choice(["home from school", "in the park", "down the street"] if c.kid
                     else ["through the forest", "by the river", "across the meadow"])
    out.append(f"{start_of_day(r)}, {c.ref} was walking {where} when {c.subj} saw {problem}.")
    if maybe(r, 0.5):
        out.append(r.choice([f'"Oh no!" said {c.ref}.', f'"I will help you," said {c.ref}.']))
    out.append(f"{c.subj_c} {c.fmt(action)}.")
    out.append(c.fmt(result))
    out.append(c.fmt(thanks))
    out.append(r.choice([f"{c.ref_c} felt happy because {c.subj} had helped.",
                         "It feels good to help others.",
                         f"{c.ref_c} smiled all the way home."]))
    return join(out)


def story_rainy(r: random.Random) -> str:
    c = make_kid(r)
    comp = r.choice(COMPANIONS_KID[:6])
    out = [r.choice([f"It was a rainy day. {c.name} could not go outside.",
                     f"Rain was falling all morning, so {c.name} had to stay inside.",
                     f"{c.name} looked out of the window. It was raining hard."])]
    if maybe(r, 0.6):
        out.append(r.choice([f"{c.subj_c} felt bored.", f"{c.subj_c} was sad.",
                             f'"What can I do?" asked {c.name}.']))
    out.append(f"Then {c.poss} {comp} had an idea.")
    acts = r.sample(RAINY_ACTIVITIES, r.choice([1, 2]))
    out.append(f"They {acts[0]}.")
    if len(acts) > 1:
        out.append(f"Then they {acts[1]}.")
    if maybe(r, 0.6):
        out.append("Later, the rain stopped and a rainbow came out.")
    out.append(r.choice([f"{c.name} said it was the best rainy day ever.",
                         "Rainy days can be fun too.",
                         f"{c.name} was happy."]))
    return join(out)


def story_food(r: random.Random) -> str:
    c = make_kid(r)
    food, taste = r.choice(FOODS_KID)
    comp = r.choice(["mom", "dad", "grandma", "grandpa"])
    out = [f"{c.name} was hungry.",
           r.choice([f'"Can I have something to eat?" {c.subj} asked {c.poss} {comp}.',
                     f"{c.subj_c} went to the kitchen to find {c.poss} {comp}."])]
    out.append(f"{cap(c.poss)} {comp} gave {c.obj} {food}.")
    out.append(f"{c.name} ate it all. {cap(taste)}.")
    if maybe(r, 0.5):
        out.append(f'"Thank you," said {c.name}.')
    return join(out)


def story_night(r: random.Random) -> str:
    c = make_char(r, 0.7)
    out = [r.choice([f"It was night, but {c.ref} could not sleep.",
                     f"It was late at night. {c.ref_c} was still awake."])]
    out.append(f"{c.subj_c} looked out of the window and saw {r.choice(NIGHT_SIGHTS)}.")
    if c.kid:
        comp = r.choice(["mom", "dad", "grandma"])
        out.append(r.choice([f"{c.poss_c} {comp} sang a soft song.",
                             f"{c.poss_c} {comp} read {c.obj} a short story.",
                             f"{c.poss_c} {comp} gave {c.obj} a warm glass of milk."]))
    else:
        out.append(f"{c.subj_c} curled up in {c.poss} warm bed.")
    out.append(r.choice([f"Soon {c.subj} was fast asleep.", f"Soon {c.ref} closed {c.poss} eyes.",
                         f"{c.subj_c} yawned and fell asleep."]))
    if maybe(r, 0.4):
        out.append(f"{c.subj_c} dreamed of {r.choice(['the sea', 'flying', 'the stars', 'a big cake', 'a castle'])}.")
    return join(out)


def story_short(r: random.Random) -> str:
    """Two or three present-tense sentences: keeps some documents very short."""
    c = make_char(r, 0.6)
    thing, color = pick_thing(r, c.kid)
    who = c.name or c.ref_c
    out = [f"{who} has {a_an(color + ' ' + thing)}."]
    out.append(r.choice([f"{c.subj_c} likes to play with it every day.",
                         f"{c.subj_c} keeps it in a safe place.",
                         f"It is {c.poss} favorite thing."]))
    if maybe(r, 0.5):
        out.append(r.choice([f"{c.subj_c} will never lose it.",
                             f"{c.subj_c} shows it to all {c.poss} friends.",
                             f"{c.subj_c} takes it to bed at night."]))
    return join(out)


# --------------------------------------------------------------------------
# Facts: "about an animal" paragraphs and Q/A pairs
# --------------------------------------------------------------------------

# plural, home, food, body/looks, one extra fact
ANIMAL_FACTS = [
    ("Foxes", "live in forests and fields", "eat berries, bugs and mice",
     "have red fur and a bushy tail", "They are very good at hearing small sounds."),
    ("Rabbits", "live in holes under the ground", "eat grass and carrots",
     "have long ears and soft fur", "They can hop very fast."),
    ("Owls", "live in trees", "eat mice and bugs", "have big round eyes",
     "They are awake at night and sleep in the day."),
    ("Bears", "live in forests and caves", "eat fish, berries and honey",
     "are big and strong", "Some bears sleep all winter long."),
    ("Ducks", "live near ponds and lakes", "eat plants and small bugs",
     "have webbed feet and soft feathers", "They can swim and fly."),
    ("Frogs", "live near water", "eat flies and other bugs", "have long legs for jumping",
     "A baby frog is called a tadpole."),
    ("Cows", "live on farms", "eat grass and hay", "are big and gentle",
     "They give us milk."),
    ("Bees", "live in hives", "drink nectar from flowers", "have six legs and four wings",
     "They make sweet honey."),
    ("Fish", "live in water", "eat tiny plants and bugs", "have fins and scales",
     "They breathe with gills."),
    ("Turtles", "live on land and in water", "eat leaves and small animals",
     "have hard shells on their backs", "They move very slowly."),
    ("Squirrels", "live in trees", "eat nuts and seeds", "have bushy tails",
     "They hide nuts to eat in winter."),
    ("Elephants", "live in hot places", "eat grass, leaves and fruit",
     "have long trunks and big ears", "They are the biggest animals on land."),
    ("Penguins", "live in cold places", "eat fish", "have black and white feathers",
     "They cannot fly, but they swim very well."),
    ("Giraffes", "live in grassy lands", "eat leaves from tall trees", "have very long necks",
     "They are the tallest animals in the world."),
]

QA_FACTS: list[tuple[str, str]] = [
    ("What color is the sky?", "The sky is blue."),
    ("What color is grass?", "Grass is green."),
    ("What color is snow?", "Snow is white."),
    ("What color is a banana?", "A banana is yellow."),
    ("What color is a carrot?", "A carrot is orange."),
    ("What color is a strawberry?", "A strawberry is red."),
    ("Where do fish live?", "Fish live in water."),
    ("Where do birds live?", "Birds live in nests in the trees."),
    ("Where do bees live?", "Bees live in hives."),
    ("Where do bears sleep in winter?", "Bears sleep in caves in winter."),
    ("What do bees make?", "Bees make honey."),
    ("What do cows give us?", "Cows give us milk."),
    ("What do hens give us?", "Hens give us eggs."),
    ("What does a cow say?", "A cow says moo."),
    ("What does a dog say?", "A dog says woof."),
    ("What does a cat say?", "A cat says meow."),
    ("What does a duck say?", "A duck says quack."),
    ("What does a sheep say?", "A sheep says baa."),
    ("What does an owl say?", "An owl says hoot."),
    ("How many legs does a dog have?", "A dog has four legs."),
    ("How many legs does a bird have?", "A bird has two legs."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("How many legs does a bee have?", "A bee has six legs."),
    ("Can fish fly?", "No, fish cannot fly. They swim."),
    ("Can birds fly?", "Yes, most birds can fly."),
    ("When does snow fall?", "Snow falls in winter."),
    ("When do flowers bloom?", "Flowers bloom in spring."),
    ("When is it hot?", "It is hot in summer."),
    ("When do leaves fall?", "Leaves fall in autumn."),
    ("What do we use to see?", "We use our eyes to see."),
    ("What do we use to hear?", "We use our ears to hear."),
    ("What do we use to smell?", "We use our nose to smell."),
    ("What do plants need to grow?", "Plants need water, sun and soil to grow."),
    ("What shines in the sky at night?", "The moon and the stars shine at night."),
    ("What shines in the sky in the day?", "The sun shines in the day."),
    ("What falls from clouds?", "Rain falls from clouds."),
    ("Is ice hot or cold?", "Ice is cold."),
    ("Is fire hot or cold?", "Fire is hot."),
    ("What do we wear on our feet?", "We wear shoes on our feet."),
    ("What do we wear on our heads?", "We wear hats on our heads."),
]

NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("day", "night"),
             ("fast", "slow"), ("happy", "sad"), ("open", "closed"), ("wet", "dry"),
             ("light", "dark"), ("old", "new"), ("tall", "short"), ("full", "empty")]


def one_qa(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(10)
    if kind < 5:
        return r.choice(QA_FACTS)
    if kind < 7:
        a = r.randint(0, 5)
        b = r.randint(1, 5)
        if maybe(r, 0.5):
            return (f"What is {NUMBERS[a]} plus {NUMBERS[b]}?",
                    f"{cap(NUMBERS[a])} plus {NUMBERS[b]} is {NUMBERS[a + b]}.")
        hi = a + b
        return (f"What is {NUMBERS[hi]} minus {NUMBERS[b]}?",
                f"{cap(NUMBERS[hi])} minus {NUMBERS[b]} is {NUMBERS[a]}.")
    if kind < 8:
        i = r.randrange(7)
        if maybe(r, 0.5):
            return (f"What day comes after {DAYS[i]}?", f"{DAYS[(i + 1) % 7]} comes after {DAYS[i]}.")
        return (f"What day comes before {DAYS[i]}?", f"{DAYS[i - 1]} comes before {DAYS[i]}.")
    if kind < 9:
        x, y = r.choice(OPPOSITES)
        if maybe(r, 0.5):
            x, y = y, x
        return (f"What is the opposite of {x}?", f"The opposite of {x} is {y}.")
    plural, home, _, _, _ = r.choice(ANIMAL_FACTS)
    return (f"Where do {plural.lower()} live?", f"{plural} {home}.")


def doc_qa(r: random.Random) -> str:
    pairs = [one_qa(r) for _ in range(r.choice([1, 2, 3, 4]))]
    return "\n".join(f"Q: {q}\nA: {a}" for q, a in pairs)


def doc_animal_facts(r: random.Random) -> str:
    plural, home, food, looks, extra = r.choice(ANIMAL_FACTS)
    parts = [f"{plural} {home}.", f"They {food}.", f"They {looks}.", extra]
    keep = [parts[0]] + [p for p in parts[1:] if maybe(r, 0.75)]
    if maybe(r, 0.3):
        keep.insert(0, r.choice(["Let me tell you about " + plural.lower() + ".",
                                 "Here are some facts about " + plural.lower() + "."]))
    return join(keep)


# --------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------

GENERATORS: list[tuple[Callable[[random.Random], str], float]] = [
    (story_lost, 1.6),
    (story_outing, 1.8),
    (story_share, 1.2),
    (story_skill, 1.3),
    (story_help, 1.2),
    (story_rainy, 0.6),
    (story_food, 0.4),
    (story_night, 0.6),
    (story_short, 0.4),
    (doc_animal_facts, 0.4),
    (doc_qa, 0.5),
]


def generate_document(r: random.Random) -> str:
    funcs, weights = zip(*GENERATORS, strict=True)
    fn = r.choices(funcs, weights=weights)[0]
    return fn(r)


def generate_corpus(n_docs: int, seed: int = 0) -> list[str]:
    """``n_docs`` documents, deterministic for a given ``seed``."""
    r = random.Random(seed)
    return [generate_document(r) for _ in range(n_docs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=10, help="number of documents")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write documents here, separated by blank lines "
                                                "(default: print them)")
    ap.add_argument("--stats", action="store_true", help="print size statistics")
    args = ap.parse_args()
    docs = generate_corpus(args.docs, args.seed)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n\n\n".join(docs) + "\n")
    elif not args.stats:
        print("\n\n".join(docs))
    if args.stats:
        n_chars = sum(len(d) for d in docs)
        n_words = sum(len(d.split()) for d in docs)
        lens = sorted(len(d.split()) for d in docs)
        print(f"docs={len(docs)} chars={n_chars} words={n_words} unique={len(set(docs))} "
              f"words/doc min={lens[0]} median={lens[len(lens) // 2]} max={lens[-1]}")


if __name__ == "__main__":
    main()
