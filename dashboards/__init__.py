"""Grafana dashboard for dspark-serve (grafana_dspark.json) and its panel queries (queries.py)."""
