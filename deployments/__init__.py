"""Ray Serve application: OpenAI-compatible HTTP in front of DSpark engine replicas (see deployments/app.py)."""
