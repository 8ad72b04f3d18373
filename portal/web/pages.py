"""What every page module of ``portal.web`` shares: the login guard that knows htmx, the
render that answers an htmx poll with only its fragment, the ``?page=`` parser, and the
statuses (and the 409 message box) that ``base.html`` tells htmx to swap like a 200."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required as django_login_required
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render, resolve_url
from django.utils.cache import patch_vary_headers
from django.utils.html import format_html
from django_htmx.http import HttpResponseClientRedirect

# A form sent back with errors.
UNPROCESSABLE = 422
# An action the current state refuses: the API answers the same status.
CONFLICT = 409


def login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Django's login_required, but an htmx poll whose session ended moves the whole page to
    the login form (HX-Redirect) instead of swapping the login form into a fragment."""
    guarded = django_login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.htmx and not request.user.is_authenticated:
            back = request.htmx.current_url_abs_path or request.get_full_path()
            login = redirect_to_login(back, resolve_url(settings.LOGIN_URL))
            return HttpResponseClientRedirect(login["Location"])
        return guarded(request, *args, **kwargs)

    return wrapper


def render_page(
    request: HttpRequest, template: str, partial: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    """The whole page, or only its ``partial`` when htmx asks (but not to restore history)."""
    fragment_only = bool(request.htmx) and not request.htmx.history_restore_request
    name = f"{template}#{partial}" if fragment_only else template
    response = render(request, name, context, status=status)
    # One URL answers two shapes: caches must keep them apart.
    patch_vary_headers(response, ("HX-Request",))
    return response


def page_number(request: HttpRequest) -> int | None:
    """``?page=`` as a whole number from 1; None when it is absent or not one."""
    raw = request.GET.get("page", "")
    if not re.fullmatch(r"[0-9]{1,9}", raw) or int(raw) < 1:
        return None
    return int(raw)


def page_problem(request: HttpRequest) -> str:
    """What is wrong with ``?page=`` (empty when it is absent or a page number)."""
    raw = request.GET.get("page", "")
    if raw and page_number(request) is None:
        return f"{raw!r} is not a page number; allowed: a whole number from 1"
    return ""


def refused(message: str, *, box: str) -> HttpResponse:
    """An htmx action the state refuses: a 409 whose message goes into the page's message box
    ``box`` (a CSS selector outside the part that polls, so the next poll does not wipe it)."""
    response = HttpResponse(
        format_html('<div class="form-errors" role="alert">{}</div>', message), status=CONFLICT
    )
    response["HX-Retarget"] = box
    response["HX-Reswap"] = "innerHTML"
    return response
