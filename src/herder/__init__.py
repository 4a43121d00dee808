"""herder: Kafka Connect's distributed mode on a Zab ensemble, with pipelines on Spark."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("herder")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
