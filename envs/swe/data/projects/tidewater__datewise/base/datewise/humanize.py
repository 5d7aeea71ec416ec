"""Describe a time difference the way a person would say it."""

_STEPS = (
    ("second", 60),
    ("minute", 60),
    ("hour", 24),
    ("day", 7),
    ("week", 52),
)


def humanize(seconds):
    """Describe a signed offset in seconds: -90 -> '1 minute ago', 7200 -> 'in 2 hours'."""
    if hasattr(seconds, "total_seconds"):
        seconds = seconds.total_seconds()
    amount = abs(int(seconds))
    if amount < 1:
        return "just now"
    unit = "year"
    for name, size in _STEPS:
        if amount < size:
            unit = name
            break
        amount //= size
    label = f"{amount} {unit}" + ("" if amount == 1 else "s")
    return f"in {label}" if seconds > 0 else f"{label} ago"
