"""herder's built-in connectors, found through the ``herder.connectors`` entry points."""
