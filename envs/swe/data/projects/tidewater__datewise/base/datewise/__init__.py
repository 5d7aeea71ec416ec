"""datewise: parse and reason about dates and times with the standard library only."""

from datewise.calendar import add_months, day_of_year, days_in_month, is_leap_year, iso_week
from datewise.humanize import humanize
from datewise.parse import DateParseError, parse_date, parse_duration, parse_time

__all__ = [
    "DateParseError",
    "add_months",
    "day_of_year",
    "days_in_month",
    "humanize",
    "is_leap_year",
    "iso_week",
    "parse_date",
    "parse_duration",
    "parse_time",
]
