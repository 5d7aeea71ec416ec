import datetime

from datewise import humanize


def test_just_now():
    assert humanize(0) == "just now"


def test_seconds():
    assert humanize(-5) == "5 seconds ago"
    assert humanize(1) == "in 1 second"


def test_minutes_and_hours():
    assert humanize(-90) == "1 minute ago"
    assert humanize(7200) == "in 2 hours"


def test_days_and_weeks():
    assert humanize(-3 * 86400) == "3 days ago"
    assert humanize(15 * 86400) == "in 2 weeks"


def test_accepts_timedelta():
    assert humanize(datetime.timedelta(days=-2)) == "2 days ago"
