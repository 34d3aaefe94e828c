"""Fixtures for every unit test.

Nothing to reset between tests: what GPUSwarmSpawner's servers share (the Docker thread pool,
the read of the swarm, the slice claims) lives in the GPU broker of the running event loop
(gpu_swarm_spawner/broker.py), and every async test runs in a loop of its own.
"""
