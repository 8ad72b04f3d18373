"""The login page, behind the login throttle (portal/tenants/logins.py)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse

from portal.tenants.logins import LoginLocked, client_address, login_lockout_left_s

TOO_MANY_REQUESTS = 429


class ThrottledLoginView(LoginView):
    template_name = "web/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = str(request.POST.get("username", ""))
        if left := self._locked_for(request, username):
            return self._locked(username, left)
        response = super().post(request, *args, **kwargs)
        # The failure that reached the limit says so at once, not at the next attempt.
        if response.status_code == 200 and (left := self._locked_for(request, username)):
            return self._locked(username, left)
        return response

    @staticmethod
    def _locked_for(request: HttpRequest, username: str) -> int:
        return login_lockout_left_s(username=username, address=client_address(request))

    def _locked(self, username: str, left_s: int) -> HttpResponse:
        context = self.get_context_data(
            form=self.get_form_class()(self.request, initial={"username": username}),
            locked=str(LoginLocked(left_s).args[0]),
        )
        response = self.render_to_response(context, status=TOO_MANY_REQUESTS)
        response["Retry-After"] = str(left_s)
        return response
