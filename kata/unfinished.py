"""How a stub's NotImplementedError looks once it has passed through Triton or a wrapper.

The grader counts such a test as not started rather than failed, and a benchmark shows the column
as not started rather than stopping on a bug: both ask here.
"""
from __future__ import annotations


def error_chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the errors it wraps, outermost first (Triton's interpreter wraps the learner's)."""
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def mentions_not_implemented(exc: BaseException | None) -> bool:
    """True for a stub's NotImplementedError, also wrapped (e.g. Triton compiling a `raise`)."""
    return any(isinstance(e, NotImplementedError) or "NotImplementedError" in str(e) for e in error_chain(exc))
