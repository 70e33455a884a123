"""Repository tasks (``agentrl/Repo-v0``): SWE-bench instances and Harbor task directories in Docker.

    tasks.py    RepoTask: the two formats read unchanged, with their container spec
    editor.py   FileEditor: the str_replace_editor tool over the episode's container
    grading.py  the task's own tests: swebench's grading in a fresh container; Harbor's verifier
    env.py      RepoEnv: an episode = one container, tools bash / str_replace_editor / submit
"""
