"""Code-execution backends behind the ``agentrl.api.Sandbox`` interface.

    local.py      LocalSandbox   namespace jails on this host, via a warm fork server (jail.py);
                                 as root, or rootless inside bubblewrap
    docker.py     DockerSandbox  a warm pool of locked-down containers
    remote.py     RemoteSandbox  the client of the sandbox service (service.py, FastAPI;
                                 admission.py: request validation, concurrency;
                                 ceilings.py: the operator's limits)
    fleet.py      SandboxFleet   several sandbox services, the least busy first
    supervisor.py our pid 1 inside every jail and container: runs, caps, kills, reports
    seccomp.py    the seccomp filter every program runs under (compiled with libseccomp)
    wire.py       the host side of the supervisor's protocol (request payload, reply -> ExecResult)

The core reaches these only through ``agentrl.plugins.make_sandbox("local"|"docker"|URL|"URL,URL")``.
"""
