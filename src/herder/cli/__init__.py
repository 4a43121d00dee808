"""The ``herder`` command line: one group per layer an operator touches."""
