"""Which container images an allow-list lets through: one rule for the portal and the agent.

A team's allow-list (checked when a job is submitted) and a GPU host's (checked by the agent
before it starts a container) are lists of *prefixes*. A prefix matches only at a boundary of
the image reference, never inside a name:

- a prefix ending in `/` or `:` matches every image that starts with it and goes on:
  `registry.example.org/vision/` allows `registry.example.org/vision/detector:2`, and
  `python:` allows every tag of `python`;
- any other prefix names a whole repository (or an exact reference): it matches that text
  exactly, or followed by `:` (a tag), `@` (a digest) or `/` (a path below it).
  `registry.example.org/vision` allows `registry.example.org/vision:1` and
  `registry.example.org/vision/detector`, never `registry.example.org/vision2/x`;
  `python:3.11` allows `python:3.11` and `python:3.11@sha256:...`, never `python:3.11-slim`.

Matching is on the text as the job gives it, case-sensitive, without Docker's implicit
`docker.io/library/`: `python` does not allow `docker.io/library/python`. An empty list allows
every image. No Django here: the portal imports this module, and so does the agent.
"""

from __future__ import annotations

from collections.abc import Iterable

# A prefix ending in one of these matches whatever follows it.
OPEN_ENDINGS = ("/", ":")
# After a prefix that names a whole repository: a tag, a digest, or a path below it.
NAME_BOUNDARIES = (":", "@", "/")
PREFIX_MAX = 255


def prefix_matches(image: str, prefix: str) -> bool:
    """Whether one allow-list prefix lets `image` through (see the module's docstring)."""
    if not prefix or not image.startswith(prefix):
        return False
    rest = image[len(prefix) :]
    if prefix.endswith(OPEN_ENDINGS):
        return rest != ""
    return rest == "" or rest[0] in NAME_BOUNDARIES


def image_allowed(image: str, prefixes: Iterable[str]) -> bool:
    """Whether an allow-list lets `image` through; an empty list allows every image."""
    listed = tuple(prefixes)
    return not listed or any(prefix_matches(image, prefix) for prefix in listed)


def prefix_problem(prefix: object) -> str | None:
    """What is wrong with one configured prefix, or None when it can be used."""
    if not isinstance(prefix, str) or not prefix:
        return "must be a non-empty text such as registry.example.org/vision/"
    if len(prefix) > PREFIX_MAX:
        return f"is longer than {PREFIX_MAX} characters"
    if any(c.isspace() or not c.isprintable() for c in prefix):
        return f"{prefix!r} contains a space or a control character"
    return None


def allowed_text(prefixes: Iterable[str]) -> str:
    """The allow-list as an error message lists it."""
    listed = tuple(prefixes)
    return ", ".join(listed) if listed else "any image"
