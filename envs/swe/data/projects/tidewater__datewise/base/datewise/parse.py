"""Parse dates, times of day and durations from the formats people actually type."""

import datetime
import re

MONTHS = {
    name: number
    for number, names in enumerate(
        [("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",),
         ("jun", "june"), ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"),
         ("oct", "october"), ("nov", "november"), ("dec", "december")],
        start=1,
    )
    for name in names
}

_ISO = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})")
_SLASHED = re.compile(r"(\d{1,2})/(\d{1,2})/(\d{4})")
_WRITTEN = re.compile(r"([A-Za-z]+)\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})")
_TIME = re.compile(r"(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?\s*([ap]\.?m\.?)?", re.IGNORECASE)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_UNITS = {
    "d": 86400, "day": 86400, "days": 86400,
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
}


class DateParseError(ValueError):
    """Raised when a string cannot be read as a date, time or duration."""


def _make_date(year, month, day, text):
    try:
        return datetime.date(year, month, day)
    except ValueError as exc:
        raise DateParseError(f"invalid date {text!r}: {exc}") from None


def parse_date(text):
    """Parse 'YYYY-MM-DD', 'DD/MM/YYYY' or 'March 5, 2024' into a `datetime.date`."""
    text = text.strip()
    match = _ISO.fullmatch(text)
    if match:
        year, month, day = map(int, match.groups())
        return _make_date(year, month, day, text)
    match = _SLASHED.fullmatch(text)
    if match:
        day, month, year = map(int, match.groups())
        return _make_date(year, month, day, text)
    match = _WRITTEN.fullmatch(text)
    if match:
        month = MONTHS.get(match.group(1).lower())
        if month is None:
            raise DateParseError(f"unknown month name {match.group(1)!r} in {text!r}")
        return _make_date(int(match.group(3)), month, int(match.group(2)), text)
    raise DateParseError(f"unrecognised date format: {text!r}")


def parse_time(text):
    """Parse '14:05', '14:05:30', '2pm' or '2:05 p.m.' into a `datetime.time`."""
    match = _TIME.fullmatch(text.strip())
    if not match:
        raise DateParseError(f"unrecognised time: {text!r}")
    hour = int(match.group(1))
    minute = int(match.group(2) or 0)
    second = int(match.group(3) or 0)
    meridiem = (match.group(4) or "").lower().replace(".", "")
    if meridiem:
        if not 1 <= hour <= 12:
            raise DateParseError(f"hour {hour} is not valid with {meridiem}: {text!r}")
        hour = hour % 12 + (12 if meridiem == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise DateParseError(f"time out of range: {text!r}")
    return datetime.time(hour, minute, second)


def parse_duration(text):
    """Parse '1h30m', '90s', '2 days 3 hours' or '1.5h' into a number of seconds (float)."""
    compact = text.strip().lower()
    if not compact:
        raise DateParseError("empty duration")
    total = 0.0
    position = 0
    for match in _DURATION_PART.finditer(compact):
        if compact[position:match.start()].strip(" ,") or match.group(2) not in _UNITS:
            raise DateParseError(f"unrecognised duration: {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position == 0 or compact[position:].strip():
        raise DateParseError(f"unrecognised duration: {text!r}")
    return total
