"""The console's aiohttp application: its routes, its resources, and the server that runs it.

:func:`make_app` puts together what the other modules hold (:mod:`~webconsole.auth`,
:mod:`~webconsole.views`, :mod:`~webconsole.actions`, :mod:`~webconsole.stream`)
with the application's resources under typed keys: the node's parts
(:data:`~webconsole.nodeview.NODE`), the browser sessions, the group view, the
metrics registry (a ``cleanup_ctx``) and the streams' shutdown signal.
:func:`serve_console` is what the entry point calls to serve a node's console.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from broker.security.tls import console_context
from webconsole import actions, auth, exchanges, stream, views
from webconsole.errors import errors_middleware
from webconsole.group import GROUP, Group
from webconsole.metrics import metrics_ctx
from webconsole.nodeview import NODE, NodeView

log = logging.getLogger("tandem.console")

API = "/api/v1"
MAX_BODY = 1024 * 1024


def make_app(view: NodeView) -> web.Application:
    """The console of a node (``view``: its parts) as an aiohttp application (not yet running)."""
    app = web.Application(middlewares=[errors_middleware, auth.auth_middleware], client_max_size=MAX_BODY)
    app[NODE] = view
    app[auth.SESSIONS] = auth.Sessions(view.node.clock)
    app[GROUP] = Group(view.node, report=view.report, changes=view.changes, state=view.state, options=view.options)
    app[stream.CLOSING] = asyncio.Event()
    app.cleanup_ctx.append(metrics_ctx)
    app.on_shutdown.append(stream.close_streams)
    r = app.router
    r.add_get("/healthz", views.healthz)
    r.add_get("/login", views.login_page)
    r.add_post("/login", auth.login)
    r.add_post("/logout", auth.logout)
    r.add_get("/", views.index)
    r.add_static(auth.STATIC_PATH, views.STATIC)
    r.add_get("/metrics", views.metrics)
    r.add_get(f"{API}/openapi.json", views.openapi)
    r.add_get(f"{API}/session", auth.session_info)
    r.add_get(f"{API}/overview", views.overview)
    r.add_get(f"{API}/nodes", views.nodes)
    r.add_get(f"{API}/nodes/{{name}}", views.node_detail)
    r.add_post(f"{API}/nodes/{{name}}/priority", actions.set_priority)
    r.add_post(f"{API}/nodes/{{name}}/drain", actions.drain_node)
    r.add_post(f"{API}/nodes/{{name}}/undrain", actions.undrain_node)
    r.add_get(f"{API}/group", views.group_state)
    r.add_get(f"{API}/upgrade", views.upgrade)
    r.add_post(f"{API}/upgrade/finalize", actions.finalize_upgrade)
    r.add_post(f"{API}/group/quorum-override", actions.set_quorum_override)
    r.add_post(f"{API}/group/designated-primary", actions.set_designated_primary)
    r.add_get(f"{API}/queues", views.queues)
    r.add_post(f"{API}/queues", actions.create_queue)
    r.add_get(f"{API}/queues/{{name}}", views.queue_detail)
    r.add_delete(f"{API}/queues/{{name}}", actions.delete_queue)
    r.add_post(f"{API}/queues/{{name}}/purge", actions.purge_queue)
    r.add_post(f"{API}/queues/{{name}}/partitions/{{partition}}/move", actions.move_partition)
    r.add_post(f"{API}/queues/{{name}}/partitions", actions.add_partitions)
    r.add_post(f"{API}/queues/{{name}}/update", actions.update_partitions)
    r.add_get(f"{API}/exchanges", exchanges.list_exchanges)
    r.add_post(f"{API}/exchanges", exchanges.create_exchange)
    r.add_delete(f"{API}/exchanges/{{name}}", exchanges.delete_exchange)
    r.add_post(f"{API}/exchanges/{{name}}/bindings", exchanges.bind)
    r.add_post(f"{API}/exchanges/{{name}}/unbind", exchanges.unbind)
    r.add_post(f"{API}/group/members", actions.add_member)
    r.add_post(f"{API}/restore", actions.restore)
    r.add_delete(f"{API}/group/members/{{name}}", actions.remove_member)
    r.add_get(f"{API}/partitions", views.partitions)
    r.add_get(f"{API}/events", views.events)
    r.add_get(f"{API}/events/stream", stream.event_stream)
    r.add_get(f"{API}/users", views.users)
    r.add_post(f"{API}/users", actions.create_user)
    r.add_delete(f"{API}/users/{{name}}", actions.delete_user)
    r.add_post(f"{API}/users/{{name}}/password", actions.change_password)
    r.add_get(f"{API}/acls", views.acls)
    r.add_post(f"{API}/acls", actions.grant)
    r.add_post(f"{API}/acls/revoke", actions.revoke)
    return app


class Console:
    """The management console and admin REST API of a node, served over HTTP, or HTTPS when
    the node has a certificate (``tls_cert``, ``tls_key``)."""

    def __init__(self, view: NodeView) -> None:
        self.node = view.node
        self.app = make_app(view)
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None  # where it listens, once started

    async def start(self, host: str, port: int) -> None:
        """Listen on ``host``:``port`` (0: any free port; :attr:`address` says which)."""
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=console_context(self.node.config))
        await site.start()
        bound = self._runner.addresses
        self.address = (bound[0][0], bound[0][1]) if bound else (host, port)
        log.info("console listening on %s", self.url)

    async def stop(self) -> None:
        """Stop listening, end the event streams, release the application's resources."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        host, port = self.address or (self.node.config.host, self.node.config.http_port or 0)
        scheme = "https" if self.node.config.tls_cert is not None else "http"
        return f"{scheme}://{host}:{port}/"


async def serve_console(view: NodeView, host: str, port: int) -> Console:
    """Build and start the console of a started node (``view``: its parts; stop it with
    :meth:`Console.stop`, before the node stops)."""
    console = Console(view)
    await console.start(host, port)
    return console
