import datetime

import pytest

from datewise import add_months, day_of_year, days_in_month, is_leap_year, iso_week


def test_common_leap_years():
    assert is_leap_year(2024)
    assert is_leap_year(1996)
    assert not is_leap_year(2023)


def test_century_is_not_leap():
    assert not is_leap_year(1900)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29


def test_days_in_month_rejects_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_day_of_year():
    assert day_of_year(datetime.date(2023, 1, 1)) == 1
    assert day_of_year(datetime.date(2023, 3, 1)) == 60
    assert day_of_year(datetime.date(2024, 3, 1)) == 61


def test_add_months_simple():
    assert add_months(datetime.date(2023, 5, 10), 2) == datetime.date(2023, 7, 10)


def test_add_months_clamps_day():
    assert add_months(datetime.date(2023, 1, 31), 1) == datetime.date(2023, 2, 28)


def test_add_months_negative():
    assert add_months(datetime.date(2023, 5, 10), -2) == datetime.date(2023, 3, 10)


def test_iso_week_mid_year():
    assert iso_week(datetime.date(2023, 6, 15)) == (2023, 24)


def test_iso_week_matches_stdlib_for_a_year():
    day = datetime.date(2023, 2, 1)
    while day.year == 2023 and day.month < 12:
        assert iso_week(day) == tuple(day.isocalendar())[:2]
        day += datetime.timedelta(days=1)
