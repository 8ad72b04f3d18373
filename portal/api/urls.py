from django.urls import path

from portal.api import (
    arrays,
    cluster,
    fairshare,
    members,
    nodes,
    notifications,
    usage,
    views,
    whatif,
)

app_name = "api"
urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="job_list"),
    path("jobs/what-if/", whatif.JobWhatIfView.as_view(), name="job_whatif"),
    path("jobs/<int:job_id>/", views.JobDetailView.as_view(), name="job_detail"),
    path("jobs/<int:job_id>/log/", views.JobLogView.as_view(), name="job_log"),
    path("jobs/<int:job_id>/cancel/", views.JobCancelView.as_view(), name="job_cancel"),
    path("jobs/<int:job_id>/hold/", views.JobHoldView.as_view(), name="job_hold"),
    path("jobs/<int:job_id>/release/", views.JobReleaseView.as_view(), name="job_release"),
    path("jobs/<int:job_id>/resubmit/", views.JobResubmitView.as_view(), name="job_resubmit"),
    path("arrays/<int:array_id>/", arrays.ArrayDetailView.as_view(), name="array_detail"),
    path("arrays/<int:array_id>/cancel/", arrays.ArrayCancelView.as_view(), name="array_cancel"),
    path(
        "arrays/<int:array_id>/resubmit-failed/",
        arrays.ArrayResubmitFailedView.as_view(),
        name="array_resubmit_failed",
    ),
    path("teams/", views.TeamListView.as_view(), name="team_list"),
    path("teams/<str:name>/", views.TeamDetailView.as_view(), name="team_detail"),
    path(
        "teams/<str:name>/members/",
        members.TeamMemberListView.as_view(),
        name="team_member_list",
    ),
    path(
        "teams/<str:name>/members/<str:username>/",
        members.TeamMemberDetailView.as_view(),
        name="team_member_detail",
    ),
    path("teams/<str:name>/audit/", members.TeamAuditView.as_view(), name="team_audit"),
    path("teams/<str:name>/usage/", usage.TeamUsageView.as_view(), name="team_usage"),
    path("cluster/", cluster.ClusterView.as_view(), name="cluster"),
    path("fairshare/", fairshare.FairShareView.as_view(), name="fairshare"),
    path(
        "teams/<str:name>/webhook/",
        notifications.TeamWebhookView.as_view(),
        name="team_webhook",
    ),
    path(
        "me/notifications/",
        notifications.MyNotificationsView.as_view(),
        name="my_notifications",
    ),
    path("tokens/", views.TokenListView.as_view(), name="token_list"),
    path("tokens/<int:token_id>/", views.TokenDetailView.as_view(), name="token_detail"),
    path("nodes/", nodes.NodeListView.as_view(), name="node_list"),
    path("nodes/<str:node>/", nodes.NodeDetailView.as_view(), name="node_detail"),
    path("nodes/<str:node>/cordon/", nodes.NodeCordonView.as_view(), name="node_cordon"),
    path("nodes/<str:node>/uncordon/", nodes.NodeUncordonView.as_view(), name="node_uncordon"),
    path("nodes/<str:node>/drain/", nodes.NodeDrainView.as_view(), name="node_drain"),
]
