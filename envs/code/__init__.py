"""Code task family: the Code and CodeAgent environments, the host-side grader and the in-sandbox harness.

    env.py       Code: a program written in one reply, graded by tests in a sandbox
    agent.py     CodeAgent: run code in a persistent sandbox session, see the output, then submit
    grading.py   grading on the host: extract the program, run the task's tests in a sandbox, count passes
    harness.py   the test harness that runs inside the sandbox for function-call tasks
"""
