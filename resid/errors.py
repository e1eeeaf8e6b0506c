"""The one error type resid raises for bad input: a single paragraph that says what went wrong and what to do."""


class ResidError(Exception):
    """Bad input to resid (unknown model, malformed weights, wrong shapes, out-of-range sites, ...).

    The message is one paragraph written for the user: what was wrong, and what to do instead.
    """
