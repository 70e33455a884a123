"""Starting and stopping the processes of a run.

    services.py  the ready-line convention of our services: ``bind``/``run_app`` (the service
                 side), ``ServiceProcess``/``ServerProcess`` (the parent side), ``free_port``
"""

from agentrl.process.services import ServerProcess, ServiceProcess, free_port

__all__ = ["ServerProcess", "ServiceProcess", "free_port"]
