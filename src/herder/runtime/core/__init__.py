"""The worker's pure cores: no IO, no clock, no asyncio, randomness injected.

Each is fed events (with the time, where time matters) and returns or queues the
effects its shell carries out, so the simulator can drive the same code as a worker.
"""
