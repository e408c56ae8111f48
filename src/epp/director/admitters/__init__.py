"""Built-in admit-request plugins (``director.api.Admitter``), one per module."""
