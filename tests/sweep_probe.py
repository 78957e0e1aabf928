"""A sweep runner that imports a library module only inside its body (tests/test_sweep.py)."""


def lazy_count(task: int) -> int:
    from attnid.families import alibi  # noqa: F401, PLC0415 (the point: a module only the workers load)

    return task * 2
