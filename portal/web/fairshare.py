"""The Fair share page (``/fairshare/``): what Slurm's ``sshare -l`` and ``sprio`` show, from
the numbers the latest scheduling pass used (``portal.scheduling.selectors``): every team's
standing, the members of the asker's teams, and their pending jobs' priority parts. It
refreshes itself (htmx) as passes run."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from portal.scheduling.selectors import JOBS_SHOWN, FairShareQueryError, fairshare_report
from portal.tenants.selectors import is_site_admin
from portal.web.pages import login_required, render_page


@login_required
def fairshare_view(request: HttpRequest) -> HttpResponse:
    wanted = request.GET.get("team", "")
    problem = ""
    try:
        report = fairshare_report(user=request.user, team=wanted)
    except FairShareQueryError as error:
        # Say what was wrong (the field first, as forms do), and show every team instead.
        problem = str(error)[:1].upper() + str(error)[1:]
        report = fairshare_report(user=request.user)
    context = {
        "nav": "fairshare",
        "report": report,
        "site_admin": is_site_admin(request.user),
        "jobs_shown": JOBS_SHOWN,
        "problem": problem,
    }
    status = 400 if problem else 200
    return render_page(request, "web/fairshare.html", "fairshare_live", context, status=status)
