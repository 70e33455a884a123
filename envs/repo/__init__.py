"""Repository tasks (``agentrl/Repo-v0``): SWE-bench instances and Harbor task directories in Docker.

    tasks.py    RepoTask: the two formats read unchanged, with their container spec
    editor.py   FileEditor: the str_replace_editor tool over the episode's container
    grading.py  the task's own tests: swebench's grading in a fresh container; Harbor's verifier
    env.py      RepoEnv: an episode = one container, tools bash / str_replace_editor / submit

Task generation (``agentrl tasks``):

    mutate.py           bug candidates: swesmith's procedural rewrites of the repository's code
    task_image.py       a local repository's image, and one image per generated instance
    generate_config.py  GenerateConfig: the settings of generation
    generate.py         candidates kept when some tests fail and the rest pass; rows, split, validation
    harbor_out.py       a generated instance written as a Harbor task directory
    oracle.py           the scripted agent that applies each task's gold patch (generation and grading agree)
    tiny_repos.py       tiny generated repositories with one bug each, one shared image (a tiny model's tasks)
"""
