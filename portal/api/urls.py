from django.urls import path

from portal.api import views

app_name = "api"
urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="job_list"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job_detail"),
    path("jobs/<int:job_id>/log/", views.JobLogView.as_view(), name="job_log"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job_cancel"),
    path("jobs/<int:job_id>/hold/", views.JobHoldView.as_view(), name="job_hold"),
    path("jobs/<int:job_id>/release/", views.JobReleaseView.as_view(), name="job_release"),
    path("jobs/<int:job_id>/resubmit/", views.JobResubmitView.as_view(), name="job_resubmit"),
    path("teams/", views.TeamListView.as_view(), name="team_list"),
    path("teams/<str:name>/", views.TeamDetailView.as_view(), name="team_detail"),
    path("tokens/", views.TokenListView.as_view(), name="token_list"),
    path("tokens/<int:token_id>/", views.TokenDetailView.as_view(), name="token_detail"),
]
