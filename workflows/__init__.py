"""Agent workflows: how an episode is played against an inference client."""
