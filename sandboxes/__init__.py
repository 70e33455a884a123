"""Code-execution backends behind the ``agentrl.api.Sandbox`` interface."""
