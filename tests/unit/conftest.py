"""Hypothesis without its per-example deadline: a shared CI machine under load makes an example slow
without making it wrong, and a timing verdict belongs to the benchmarks, not to the tests."""

from hypothesis import settings

settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")
