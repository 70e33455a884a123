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

Repository tasks (``agentrl/Repo-v0``, envs/repo/), not behind the Sandbox interface:

    repo_container.py  RepoContainer  one container of a task's image per episode: limits, labels,
                                      exec, files, the kill sweep
    repo_shell.py      BashSession    the episode's persistent bash (markers, timeout, middle cut)
    repo_pool.py       RepoPool       warm containers per image, destroyed after each episode;
                                      RepoSession, the async handle an env holds

The core reaches these only through ``agentrl.plugins.make_sandbox("local"|"docker"|URL|"URL,URL")``.
"""
