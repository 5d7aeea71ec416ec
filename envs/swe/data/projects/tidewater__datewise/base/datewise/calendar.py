"""Calendar arithmetic on the proleptic Gregorian calendar."""

import datetime

_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def is_leap_year(year):
    """Return True if `year` has a February 29th."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    """Number of days in `month` (1-12) of `year`."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, got {month}")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS_IN_MONTH[month - 1]


def day_of_year(date):
    """1-based ordinal of `date` within its year."""
    return sum(days_in_month(date.year, m) for m in range(1, date.month)) + date.day


def add_months(date, months):
    """Add (or subtract) whole months, clamping the day to the end of the target month."""
    total = date.month - 1 + months
    year = date.year + total // 12
    month = total % 12 + 1
    day = min(date.day, days_in_month(year, month))
    return datetime.date(year, month, day)


def _weeks_in_year(year):
    jan1 = datetime.date(year, 1, 1).isoweekday()
    if jan1 == 4 or (jan1 == 3 and is_leap_year(year)):
        return 53
    return 52


def iso_week(date):
    """The ISO 8601 (year, week) that `date` falls in."""
    week = (day_of_year(date) - date.isoweekday() + 10) // 7
    if week < 1:
        return date.year - 1, _weeks_in_year(date.year - 1)
    if week > _weeks_in_year(date.year):
        return date.year + 1, 1
    return date.year, week
