"""The management console and admin REST API of a node (aiohttp), on its ``http_port``.

The entry point serves it with :func:`webconsole.app.serve_console`.  Modules:
``app`` (routes, resources, the server), ``auth`` (logins, sessions, roles, CSRF),
``views`` (read-only endpoints), ``actions`` (operations), ``stream`` (live updates),
``group`` (the whole group's state, asked of every member), ``metrics``
(Prometheus), ``openapi`` (the API's document), ``errors`` (JSON errors),
``nodeview`` (what the console needs from the node).
"""
