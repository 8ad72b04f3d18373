from django.contrib.auth import views as auth_views
from django.urls import path

from portal.web import (
    arrays,
    cluster,
    fairshare,
    job_actions,
    members,
    nodes,
    notifications,
    usage,
    views,
    whatif,
)
from portal.web.login import ThrottledLoginView

app_name = "web"
urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.job_list, name="job_list"),
    path("jobs/new/", views.job_submit_view, name="job_submit"),
    path("jobs/new/what-if/", whatif.job_whatif_view, name="job_whatif"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", job_actions.job_cancel_view, name="job_cancel"),
    path("jobs/<int:job_id>/hold/", job_actions.job_hold_view, name="job_hold"),
    path("jobs/<int:job_id>/release/", job_actions.job_release_view, name="job_release"),
    path("arrays/<int:array_id>/", arrays.array_detail, name="array_detail"),
    path("arrays/<int:array_id>/cancel/", arrays.array_cancel_view, name="array_cancel"),
    path(
        "arrays/<int:array_id>/resubmit-failed/",
        arrays.array_resubmit_failed_view,
        name="array_resubmit_failed",
    ),
    path("teams/", views.team_list, name="team_list"),
    path("teams/<str:name>/", views.team_detail, name="team_detail"),
    path("teams/<str:name>/quota/", views.team_quota, name="team_quota"),
    path("teams/<str:name>/members/add/", members.team_member_add, name="team_member_add"),
    path(
        "teams/<str:name>/members/<str:username>/role/",
        members.team_member_role,
        name="team_member_role",
    ),
    path(
        "teams/<str:name>/members/<str:username>/limit/",
        members.team_member_limit,
        name="team_member_limit",
    ),
    path(
        "teams/<str:name>/members/<str:username>/remove/",
        members.team_member_remove,
        name="team_member_remove",
    ),
    path("cluster/", cluster.cluster_view, name="cluster"),
    path("fairshare/", fairshare.fairshare_view, name="fairshare"),
    path("usage/", usage.usage_page, name="usage"),
    path("tokens/", views.token_list_view, name="token_list"),
    path("settings/notifications/", notifications.notifications_view, name="notifications"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke_view, name="token_revoke"),
    path("nodes/", nodes.node_list, name="node_list"),
    path("nodes/<str:node>/cordon/", nodes.node_action, {"action": "cordon"}, name="node_cordon"),
    path(
        "nodes/<str:node>/uncordon/",
        nodes.node_action,
        {"action": "uncordon"},
        name="node_uncordon",
    ),
    path("nodes/<str:node>/drain/", nodes.node_action, {"action": "drain"}, name="node_drain"),
]
