"""The application: ``Options`` and the config file become the built EPP.

``options`` declares every setting the command line sets; ``build`` turns a config into each
concept's parts through the plugin ``registry``; ``compose`` adds the datastore and what only
the command line knows (``App``); ``serve`` starts, serves, drains and stops it; ``reload``,
``swap`` and ``watcher`` change its config live; ``debug`` reports it on ``/debug/plugins/state``.
"""
