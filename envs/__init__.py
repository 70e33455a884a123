"""Gymnasium environments shipped with agentrl, registered as ``agentrl/Name-vN`` on import."""
