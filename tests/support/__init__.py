"""The test support every tier shares: services, topologies, the worker harness and its projects."""
