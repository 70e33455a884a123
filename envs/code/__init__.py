"""Code task family: the Code and CodeAgent environments, the host-side grader and the in-sandbox harness."""
