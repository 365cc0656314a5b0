"""Autoscaling for the dspark Serve deployment: a custom Serve policy driven by the engine's own load signals
(`policy.py`), and a fleet simulator that runs the same policy and the same verify-length controller against a
request trace (`trace.py`, `simulator.py`).

`autoscale.policy` imports nothing but the standard library, so Serve can pickle it by value into its controller."""
