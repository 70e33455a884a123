"""Code-execution backends behind the ``agentrl.api.Sandbox`` interface.

    local.py           LocalSandbox   namespace jails on this host, via a warm fork server;
                                      as root, or rootless inside bubblewrap
    jail.py            the local jail: fresh namespaces, a read-only root, our supervisor as pid 1
    docker.py          DockerSandbox  a warm pool of locked-down containers
    remote.py          RemoteSandbox  the client of the sandbox service
    fleet.py           SandboxFleet   several sandbox services, the least busy first
    service.py         the sandbox service (FastAPI): any backend over HTTP, with sessions
    service_config.py  SandboxServiceConfig: the settings of ``agentrl sandbox serve``
    admission.py       what the service admits: valid requests under the ceilings, a bounded number
    ceilings.py        Ceilings: the most one request to the service may ask for
    program_limits.py  the limits a program runs under, from a backend's config to the supervisor
    supervisor.py      our pid 1 inside every jail and container: runs, caps, kills, reports
    seccomp.py         the seccomp filter every program runs under (compiled with libseccomp)
    wire.py            the host side of the supervisor's protocol (request payload, reply -> ExecResult)

Repository tasks (``agentrl/Repo-v0``, envs/repo/), not behind the Sandbox interface:

    repo_container.py  RepoContainer  one container of a task's image per episode: limits, labels,
                                      exec, files, the kill sweep
    repo_shell.py      BashSession    the episode's persistent bash (markers, timeout, middle cut)
    repo_pool.py       RepoPool       warm containers per image, destroyed after each episode;
                                      RepoSession, the async handle an env holds
    repo_routes.py     RepoRoutes     the sandbox service's routes for repository episodes
    repo_remote.py     RepoFleet      their client: episodes spread over several services,
                                      RemoteRepoSession with RepoSession's interface

The core reaches these only through ``agentrl.plugins.make_sandbox("local"|"docker"|URL|"URL,URL")``.
"""
