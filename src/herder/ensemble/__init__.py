"""The ensemble: a Zab-replicated, durable log of transactions and the state machine they build."""
