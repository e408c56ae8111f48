"""Builders and fakes for tests and plugin authors; src never imports this.

- ``builders``: endpoints (``make_endpoint``), requests (``make_request``) and parsed bodies
  (``chat_body``, ``completions_body``).
- ``plugins``: ``FakeHandle`` (a Handle over fixed plugins) and ``build`` (a plugin from camelCase
  parameters, as a config would build it).
- ``flowcontrol``: ``FakeQueue`` and ``FakeItem``, a sorted flow queue for policy tests.
- ``waiting``: ``until``, a bounded poll for a condition, instead of fixed sleeps.
- ``kubeapi``: an in-process fake Kubernetes API server.
"""
