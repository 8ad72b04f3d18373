from django.contrib.auth import views as auth_views
from django.urls import path

from portal.web import views
from portal.web.login import ThrottledLoginView

app_name = "web"
urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.job_list, name="job_list"),
    path("jobs/new/", views.job_submit_view, name="job_submit"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel_view, name="job_cancel"),
    path("teams/", views.team_list, name="team_list"),
    path("teams/<str:name>/", views.team_detail, name="team_detail"),
    path("teams/<str:name>/quota/", views.team_quota, name="team_quota"),
    path("tokens/", views.token_list_view, name="token_list"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke_view, name="token_revoke"),
]
