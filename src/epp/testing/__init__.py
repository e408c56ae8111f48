"""Builders and fakes for tests and plugin authors; src never imports this."""
