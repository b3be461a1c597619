"""Errors shared by commands that must not import the frameworks to report them."""


class StudyError(RuntimeError):
    """A study cannot run as configured (e.g. a GPU asked for and none visible)."""
