from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "portal.notify"
    label = "notify"

    def ready(self) -> None:
        # Jobs sit below this app and cannot import it: they announce every committed state
        # change (portal.jobs.transitions.job_state_changed) and this app listens.
        from portal.jobs.models import Job
        from portal.jobs.transitions import job_state_changed
        from portal.notify.services import notify_state_changes

        job_state_changed.connect(
            notify_state_changes, sender=Job, dispatch_uid="portal.notify.state_changes"
        )
