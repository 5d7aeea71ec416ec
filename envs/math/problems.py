"""Word-problem generators for the Math env: each draws numbers from a seeded RNG and computes the
exact answer as a `Fraction` alongside the text, so every problem is verifiable by construction.

Difficulty 1-3 widens the numbers and adds steps. Answers are kept to integers, short decimals
or small fractions, and the question says when a fraction is expected.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Diego",
    "Emma",
    "Farah",
    "Gus",
    "Hana",
    "Ivan",
    "Jade",
    "Kofi",
    "Lena",
    "Mateo",
    "Nia",
    "Omar",
    "Priya",
)
ITEMS = (
    ("notebook", "notebooks"),
    ("pen", "pens"),
    ("apple", "apples"),
    ("sandwich", "sandwiches"),
    ("ticket", "tickets"),
    ("candle", "candles"),
    ("mug", "mugs"),
    ("bag of rice", "bags of rice"),
    ("T-shirt", "T-shirts"),
    ("plant", "plants"),
)


@dataclass(frozen=True)
class Problem:
    """One generated problem: its kind, the question text and the exact answer."""

    kind: str
    question: str
    answer: Fraction
    working: str = ""  #: a short worked solution ending before the answer, e.g. "4 x 9 = 36, 5 x 7 = 35, 36 + 35 = 71."


def format_number(value: Fraction) -> str:
    """An exact, readable form: 12, 12.5, 0.125 or 7/3."""
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    while den % 2 == 0:
        den //= 2
    while den % 5 == 0:
        den //= 5
    if den == 1:  # terminating decimal
        text = f"{float(value):.6f}".rstrip("0")
        if Fraction(text) == value:
            return text
    return f"{value.numerator}/{value.denominator}"


def _dollars(cents: int | Fraction) -> str:
    """An amount in cents as a plain number of dollars for worked steps: 900 -> 9, 1550 -> 15.5."""
    return format_number(Fraction(cents) / 100)


def _money(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}" if cents % 100 else f"${cents // 100}"


def arithmetic(rng: random.Random, difficulty: int) -> Problem:
    """Shopping: several items at unit prices, then change from a bill and (harder) a discount."""
    name = rng.choice(NAMES)
    items = rng.sample(ITEMS, 1 + min(difficulty, 2))
    step = 100 if difficulty == 1 else 50
    lines, total, steps, subtotals = [], 0, [], []
    for _singular, plural in items:
        count, price = rng.randint(2, 3 + 2 * difficulty), rng.randrange(step, 800 + 400 * difficulty, step)
        lines.append(f"{count} {plural} at {_money(price)} each")
        total += count * price
        steps.append(f"{count} x {_dollars(price)} = {_dollars(count * price)}")
        subtotals.append(_dollars(count * price))
    steps.append(f"{' + '.join(subtotals)} = {_dollars(total)}")
    bought = ", ".join(lines[:-1]) + " and " + lines[-1]
    if difficulty == 1:
        return Problem(
            "arithmetic",
            f"{name} buys {bought}. How much does {name} spend in total, in dollars?",
            Fraction(total, 100),
            ", ".join(steps) + ".",
        )
    text = f"{name} buys {bought}."
    if difficulty == 3:
        discount = rng.choice((10, 20, 50))  # keeps the bill in whole cents
        text += f" The shop takes {discount}% off the whole bill."
        before = total
        total = Fraction(total * (100 - discount), 100)
        steps.append(f"{_dollars(before)} x {format_number(Fraction(100 - discount, 100))} = {_dollars(total)}")
    bill = 2000 * (int(total) // 2000 + 1)
    text += f" {name} pays with {_money(bill)}. How much change does {name} get back, in dollars?"
    steps.append(f"{_dollars(bill)} - {_dollars(total)} = {_dollars(bill - total)}")
    return Problem("arithmetic", text, Fraction(bill - total, 100), ", ".join(steps) + ".")


def rates(rng: random.Random, difficulty: int) -> Problem:
    """Rates: unit rates, two-leg journeys, or two workers sharing a job."""
    variant = rng.randrange(min(difficulty, 3))
    if variant == 0:
        per, minutes = rng.randint(2, 9), rng.randint(2, 6)
        made, later = per * minutes, minutes * rng.randint(3, 10)
        text = (
            f"A machine makes {made} buttons in {minutes} minutes. Working at the same rate, how many buttons "
            f"does it make in {later} minutes?"
        )
        return Problem("rates", text, Fraction(per * later))
    if variant == 1:
        v1, v2 = rng.randrange(30, 90, 5), rng.randrange(40, 110, 5)
        t1, t2 = Fraction(rng.randint(2, 8), 2), Fraction(rng.randint(1, 6), 2)
        text = (
            f"A car drives at {v1} km/h for {format_number(t1)} hours and then at {v2} km/h for {format_number(t2)} "
            f"hours. "
            "How many kilometres does it travel in total?"
        )
        return Problem("rates", text, v1 * t1 + v2 * t2)
    a, b = rng.sample(range(2, 13), 2)
    a_name, b_name = rng.sample(NAMES, 2)
    text = (
        f"{a_name} can paint a fence alone in {a} hours; {b_name} can paint it alone in {b} hours. "
        "Working together at these rates, how many hours do they take? Give an exact answer (a fraction is fine)."
    )
    return Problem("rates", text, Fraction(a * b, a + b))


def ages(rng: random.Random, difficulty: int) -> Problem:
    """Ages: a parent k times as old as a child, m times as old after n years; or a sum and a difference."""
    parent, child = rng.sample(NAMES, 2)
    if difficulty == 1:
        younger, gap = rng.randint(4, 30), rng.randint(1, 12)
        text = (
            f"{parent} is {gap} years older than {child}. Together their ages add up to {2 * younger + gap}. How "
            f"old is {parent}?"
        )
        return Problem("ages", text, Fraction(younger + gap))
    while True:
        age, k, m = rng.randint(3, 14), rng.randint(3, 6), rng.randint(2, 3)
        if k > m and (age * (k - m)) % (m - 1) == 0:
            years = age * (k - m) // (m - 1)
            break
    text = (
        f"{parent} is {k} times as old as {child}. In {years} years, {parent} will be {m} times as old as {child}. "
        f"How old is {parent} now?"
    )
    return Problem("ages", text, Fraction(k * age))


def fractions(rng: random.Random, difficulty: int) -> Problem:
    """Fractions: sums of fractions, scaled recipes, or a tank that is used and refilled."""

    def frac(low: int = 2, high: int = 6 + 2 * difficulty) -> Fraction:
        den = rng.randint(low, high)
        return Fraction(rng.randint(1, den - 1), den)

    if difficulty == 1:
        a, b = frac(), frac()
        return Problem(
            "fractions", f"What is {a} + {b}? Give the answer as a fraction in lowest terms or a whole number.", a + b
        )
    if difficulty == 2:
        per_batch, batches = frac(), Fraction(rng.randint(2, 9), 2)
        whole, part = divmod(batches, 1)
        shown = f"{whole} {part}" if part else str(whole)
        text = (
            f"A recipe needs {per_batch} cup of sugar per batch. How many cups of sugar are needed for {shown} "
            f"batches? "
            "Give an exact answer (a fraction is fine)."
        )
        return Problem("fractions", text, per_batch * batches)
    full, used, added = frac(), frac(), frac()
    left = full * (1 - used)
    text = (
        f"A water tank is {full} full. Then {used} of the water in it is used, and water filling {added} of the tank "
        f"is added. "
        "What fraction of the tank is full now? Give the answer as a fraction (or a whole number)."
    )
    return Problem("fractions", text, left + added)


def linear(rng: random.Random, difficulty: int) -> Problem:
    """Linear equations: think-of-a-number puzzles and ax + b = cx + d."""
    if difficulty == 1:
        x, a, b = rng.randint(2, 20), rng.randint(2, 9), rng.randint(1, 30)
        return Problem(
            "linear",
            f"I think of a number, multiply it by {a} and then add {b}. The result is {a * x + b}. What is my number?",
            Fraction(x),
        )
    while True:
        a, c = rng.randint(2, 12), rng.randint(-9, 9)
        if a != c:
            break
    x = Fraction(rng.randint(-15, 15)) if difficulty == 2 else Fraction(rng.randint(-20, 20), a - c)
    b = rng.randint(-30, 30)
    d = int((a - c) * x + b)  # so that a*x + b == c*x + d; (a - c) * x is a whole number
    left = f"{a}x {'+' if b >= 0 else '-'} {abs(b)}"
    right = f"{c}x {'+' if d >= 0 else '-'} {abs(d)}" if c else str(d)
    text = f"Solve for x: {left} = {right}. Give x exactly (a fraction is fine)."
    return Problem("linear", text, x)


def percent(rng: random.Random, difficulty: int) -> Problem:
    """Percentages: a percent of a number, a discount then tax, or undoing a percentage change."""
    if difficulty == 1:
        p, base = rng.choice((10, 20, 25, 40, 50, 75, 15, 5)), rng.randrange(20, 400, 20)
        return Problem("percent", f"What is {p}% of {base}?", Fraction(p * base, 100))
    if difficulty == 2:
        price, off, tax = rng.randrange(40, 400, 20), rng.choice((10, 20, 25, 30, 50)), rng.choice((5, 8, 10))
        text = (
            f"A jacket costs ${price}. It is discounted by {off}%, and then {tax}% sales tax is added to the "
            f"discounted price. What is the final price, in dollars?"
        )
        return Problem("percent", text, Fraction(price * (100 - off) * (100 + tax), 10_000))
    change = rng.choice((-40, -25, -20, -10, 10, 20, 25, 50, 60))
    original = rng.randrange(40, 500, 20)
    new = Fraction(original * (100 + change), 100)
    word = "rises" if change > 0 else "falls"
    text = (
        f"After the price of a bike {word} by {abs(change)}%, it costs ${format_number(new)}. What was the price "
        f"before the change, in dollars?"
    )
    return Problem("percent", text, Fraction(original))


def mixture(rng: random.Random, difficulty: int) -> Problem:
    """Mixtures: the strength of a blend of two solutions, or how much of one to add to hit a target."""
    while True:
        low, high = sorted(rng.sample(range(5, 95, 5), 2))
        x, v = rng.randint(2, 10 * difficulty), rng.randint(2, 10 * difficulty)
        target = Fraction(low * x + high * v, x + v)
        if target.denominator == 1 or difficulty > 1 and target.denominator == 2:
            break
    if difficulty == 1:
        text = (
            f"You mix {x} litres of a {low}% salt solution with {v} litres of a {high}% salt solution. What is "
            f"the salt percentage of the mixture?"
        )
        return Problem("mixture", text, target)
    text = (
        f"How many litres of a {low}% acid solution must be added to {v} litres of a {high}% acid solution "
        f"to get a {format_number(target)}% acid solution?"
    )
    return Problem("mixture", text, Fraction(x))


GENERATORS: dict[str, Callable[[random.Random, int], Problem]] = {
    "arithmetic": arithmetic,
    "rates": rates,
    "ages": ages,
    "fractions": fractions,
    "linear": linear,
    "percent": percent,
    "mixture": mixture,
}


def generate(kind: str, difficulty: int, rng: random.Random) -> Problem:
    """A problem of `kind` ("any" picks one of GENERATORS at random) at `difficulty` 1-3."""
    chosen = rng.choice(sorted(GENERATORS)) if kind == "any" else kind
    return GENERATORS[chosen](rng, difficulty)
