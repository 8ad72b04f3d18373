from django.apps import AppConfig


class AgentsConfig(AppConfig):
    name = "portal.agents"
    label = "agents"

    def ready(self) -> None:
        # Jobs (a cancel) and scheduling (a pass) sit below this app and cannot import it;
        # they send launches and stops through portal.agent_messages, which sends with this.
        from portal import agent_messages
        from portal.agents import dispatch

        agent_messages.install(dispatch)
