"""Which images an allow-list lets through: prefixes match only at a `/` or `:` boundary."""

from __future__ import annotations

import pytest

from workers.images import allowed_text, image_allowed, prefix_matches, prefix_problem

VISION = "registry.example.org/vision/"

# (prefix, image, allowed)
TABLE = [
    # A prefix ending in "/" allows everything below it, at any depth, with any tag or digest.
    (VISION, "registry.example.org/vision/detector", True),
    (VISION, "registry.example.org/vision/detector:2.1", True),
    (VISION, "registry.example.org/vision/team/detector@sha256:" + "a" * 64, True),
    (VISION, "registry.example.org/vision2/detector", False),
    (VISION, "registry.example.org/vision", False),  # the folder itself names no image
    (VISION, "registry.example.org/visionx/y:1", False),
    (VISION, "other.example.org/registry.example.org/vision/x", False),  # only at the start
    (VISION, "REGISTRY.example.org/vision/x", False),  # compared as written
    # A prefix without a boundary names a whole repository, never the start of a name.
    ("registry.example.org/vis", "registry.example.org/vision2/x", False),
    ("registry.example.org/vis", "registry.example.org/vision/x", False),
    ("registry.example.org/vision", "registry.example.org/vision", True),
    ("registry.example.org/vision", "registry.example.org/vision:1", True),
    ("registry.example.org/vision", "registry.example.org/vision@sha256:" + "b" * 64, True),
    ("registry.example.org/vision", "registry.example.org/vision/detector:1", True),
    ("registry.example.org/vision", "registry.example.org/vision2/detector", False),
    ("registry.example.org/vision", "registry.example.org/vision-old:1", False),
    ("registry.example.org/vision", "registry.example.org/vision_x", False),
    ("registry.example.org/vision", "registry.example.org/vision.x", False),
    # Docker Hub names, exactly as written: no implicit docker.io/library/.
    ("python", "python", True),
    ("python", "python:3.11-slim", True),
    ("python", "pythonista:1", False),
    ("python", "docker.io/library/python:3.11", False),
    # A prefix ending in ":" allows every tag of one repository, and nothing else.
    ("python:", "python:3.11-slim", True),
    ("python:", "python", False),
    ("python:", "python:", False),
    ("python:", "python3:1", False),
    # A prefix with a tag allows that tag (and its digest), never a longer tag.
    ("python:3.11", "python:3.11", True),
    ("python:3.11", "python:3.11@sha256:" + "c" * 64, True),
    ("python:3.11", "python:3.11-slim", False),
    ("python:3.11", "python:3.1", False),
    # A registry with a port.
    ("localhost:5000/", "localhost:5000/team/x:1", True),
    ("localhost:5000", "localhost:5000/team/x:1", True),
    ("localhost:5000", "localhost:50000/team/x:1", False),
    ("localhost:5", "localhost:5000/x", False),
]


@pytest.mark.parametrize(("prefix", "image", "allowed"), TABLE)
def test_a_prefix_matches_only_at_a_boundary(prefix: str, image: str, allowed: bool) -> None:
    assert prefix_matches(image, prefix) is allowed
    assert image_allowed(image, [prefix]) is allowed


def test_an_empty_allow_list_allows_any_image_and_says_so() -> None:
    assert image_allowed("anything/at:all", [])
    assert allowed_text([]) == "any image"


def test_an_image_needs_one_matching_prefix_of_the_list() -> None:
    prefixes = [VISION, "python:"]
    assert image_allowed("python:3.11", prefixes)
    assert image_allowed("registry.example.org/vision/x", prefixes)
    assert not image_allowed("ubuntu:22.04", prefixes)
    assert allowed_text(prefixes) == "registry.example.org/vision/, python:"


def test_an_empty_prefix_in_a_list_allows_nothing_by_itself() -> None:
    assert not prefix_matches("python:3.11", "")
    assert not image_allowed("python:3.11", [""])


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        (VISION, None),
        ("python", None),
        ("", "must be a non-empty text such as registry.example.org/vision/"),
        (3, "must be a non-empty text such as registry.example.org/vision/"),
        (
            "registry.example.org/ vision/",
            "'registry.example.org/ vision/' contains a space or a control character",
        ),
        ("a\nb", "'a\\nb' contains a space or a control character"),
        ("x" * 256, "is longer than 255 characters"),
    ],
)
def test_a_configured_prefix_is_checked(prefix: object, problem: str | None) -> None:
    assert prefix_problem(prefix) == problem
