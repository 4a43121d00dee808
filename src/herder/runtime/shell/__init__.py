"""The worker's asyncio shells: they carry out what the pure cores decide."""
