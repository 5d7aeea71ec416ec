import datetime

import pytest

from datewise import DateParseError, parse_date, parse_duration, parse_time


def test_iso_date():
    assert parse_date("2024-03-05") == datetime.date(2024, 3, 5)


def test_slashed_date_is_day_first():
    assert parse_date("05/03/2024") == datetime.date(2024, 3, 5)


def test_written_date():
    assert parse_date("March 5, 2024") == datetime.date(2024, 3, 5)
    assert parse_date("Sept 21st 2023") == datetime.date(2023, 9, 21)


def test_invalid_date_raises():
    with pytest.raises(DateParseError):
        parse_date("2023-02-30")
    with pytest.raises(DateParseError):
        parse_date("yesterday")


def test_unknown_month_name():
    with pytest.raises(DateParseError, match="unknown month"):
        parse_date("Smarch 3, 2020")


def test_24_hour_time():
    assert parse_time("14:05") == datetime.time(14, 5)
    assert parse_time("07:30:15") == datetime.time(7, 30, 15)


def test_pm_time():
    assert parse_time("2pm") == datetime.time(14, 0)
    assert parse_time("2:05 p.m.") == datetime.time(14, 5)


def test_time_out_of_range():
    with pytest.raises(DateParseError):
        parse_time("25:00")


def test_duration_compact():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == 90


def test_duration_words():
    assert parse_duration("2 days 3 hours") == 2 * 86400 + 3 * 3600


def test_duration_garbage():
    with pytest.raises(DateParseError):
        parse_duration("soon")
    with pytest.raises(DateParseError):
        parse_duration("3 fortnights")
